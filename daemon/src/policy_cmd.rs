//! `nvproxy policy suggest --from-audit FILE` / `nvproxy policy check FILE`: the CLI verbs over
//! policy files (`nvproxy_config::policy` holds the format, the table names and the checks).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
#[cfg(test)]
use ioctl_proxy::InstancePolicy;
use ioctl_proxy::audit::{Decision, Kind};
use ioctl_proxy::policy::{PassThroughNameError, pass_through_name};

use crate::audit_cmd::AuditLog;
use nvproxy_config::policy::{ALLOC_ESCAPE, AbiNames, CONTROL_ESCAPE, PolicyFile};
#[cfg(test)]
use nvproxy_config::policy::{PASS_THROUGH_CONTROLS, check_allow, edit_distance};

/// `nvproxy policy ...`.
#[derive(Debug, clap::Subcommand)]
pub enum PolicyCommand {
    /// Print the minimal allowlist-only policy (TOML) that allows the entries an audit log
    /// records as used (allowed, failed or would-be-denied), plus libcuda's slow-wait controls
    /// for a program that submits work.
    Suggest {
        /// The audit log (JSON lines) of a run, e.g. `exec --mode audit --audit-log FILE`.
        #[arg(long, value_name = "FILE")]
        from_audit: PathBuf,
        /// Check the names against this driver version's table (default: every known
        /// version's).
        #[arg(long, value_name = "VERSION")]
        driver_version: Option<String>,
    },
    /// Check a policy file (keys, names against the ABI table) and print what it allows.
    Check {
        /// The policy file (TOML).
        path: PathBuf,
        /// The driver version whose table the names must be in (default: the host driver's
        /// version if there is one, else every known version's table).
        #[arg(long, value_name = "VERSION")]
        driver_version: Option<String>,
    },
}

/// Runs a `policy` subcommand.
pub fn run(cmd: &PolicyCommand) -> Result<()> {
    match cmd {
        PolicyCommand::Suggest {
            from_audit,
            driver_version,
        } => {
            let names = match driver_version {
                Some(v) => {
                    AbiNames::for_version(v).with_context(|| format!("--driver-version {v}"))?
                }
                None => AbiNames::all_versions(),
            };
            let log = AuditLog::load(from_audit)?;
            log.warn(from_audit);
            print!("{}", suggest(&log, &names, from_audit));
            Ok(())
        }
        PolicyCommand::Check {
            path,
            driver_version,
        } => {
            let names = match driver_version {
                Some(v) => {
                    AbiNames::for_version(v).with_context(|| format!("--driver-version {v}"))?
                }
                None => AbiNames::for_host(&nvproxy_worker::host::ThisHost),
            };
            let file = PolicyFile::load(path)?;
            file.check(&names)
                .with_context(|| format!("policy file {}", path.display()))?;
            println!("{}", file.describe(path, &names));
            Ok(())
        }
    }
}

// ---- suggest ----------------------------------------------------------------------------------

/// Why an audit-log entry is not in the suggestion.
enum Left {
    Denied,
    Unknown,
    Privileged,
    UvmMmap,
}

/// Controls libcuda makes only while it waits for the GPU, as many times as the wait is slow:
/// none in a fast run, several in a slow one (tests/nvidia-userspace/RESULTS.md; 1 run in 17 of
/// the same `cuda-probe` run natively had `MC_SERVICE_INTERRUPTS`). A policy suggested from a
/// fast run would refuse them the first time the program waits longer, so a program that
/// submits work (a GPFIFO channel in the log) gets them whether or not the log has them.
/// Both act only on the tenant's own objects (its channel; its GPU's pending interrupts).
const WAIT_PATH_CONTROLS: [&str; 2] = [
    "NV2080_CTRL_CMD_MC_SERVICE_INTERRUPTS",
    "NV906F_CTRL_CMD_RESET_CHANNEL",
];

/// The comment of a wait-path control the log does not have.
const WAIT_PATH_NOTE: &str = "not in the log: libcuda calls it while it waits for the GPU, \
                              only when a wait is slow";

/// Whether `class` (a class name) is a GPFIFO channel: the program submits work to the GPU.
fn is_channel_class(class: &str) -> bool {
    class.ends_with("_CHANNEL_GPFIFO_A") || class.ends_with("_CHANNEL_GPFIFO_B")
}

fn used(d: Decision) -> bool {
    matches!(
        d,
        Decision::Allowed | Decision::Failed | Decision::AuditWouldDeny
    )
}

fn describe_calls(calls: &BTreeMap<Decision, u64>) -> String {
    calls
        .iter()
        .map(|(d, n)| format!("{} {n}", d.as_str()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The minimal allowlist-only policy (TOML text) for what `log` records as used: every entry
/// with an allowed, failed or would-be-denied call, under its kind; plus the escapes that carry
/// the controls and classes, and [`WAIT_PATH_CONTROLS`] when the log has a GPFIFO channel.
/// Entries only ever denied, entries `names` does not know and the UVM mmap switch are listed
/// as comments. Sorted, so the same log gives the same text.
pub fn suggest(log: &AuditLog, names: &AbiNames, source: &Path) -> String {
    // kind -> policy name -> calls per decision (merged over the audit names that map to it).
    let mut chosen: BTreeMap<Kind, BTreeMap<String, BTreeMap<Decision, u64>>> = BTreeMap::new();
    let mut left: Vec<(Left, Kind, String, BTreeMap<Decision, u64>)> = Vec::new();
    let mut calls_total = 0u64;
    for ((kind, name), calls) in log.entries() {
        calls_total += calls.values().sum::<u64>();
        if kind == Kind::Uvm && name == "mmap" {
            left.push((Left::UvmMmap, kind, name.to_owned(), calls));
            continue;
        }
        // A pass-through control is counted per command (`RM_GSS_LEGACY 0x20808159`) and
        // suggested per command, never as its family: the policy is as strict as the log.
        // (A family name or a malformed one, which the proxy never writes, goes on below.)
        let pass_through = match kind {
            Kind::Control => pass_through_name(name),
            _ => Ok(None),
        };
        let (pname, kind_in_table) = match pass_through {
            Err(PassThroughNameError::Privileged { .. }) => {
                left.push((Left::Privileged, kind, name.to_owned(), calls));
                continue;
            }
            Ok(Some(command)) if command.contains(' ') => (command, Some(kind)),
            // A call that failed before its control or class was read is counted under the
            // escape's name with the control's or class's kind.
            _ if names.knows(kind, name) => (name.to_owned(), Some(kind)),
            _ if names.knows(Kind::Escape, name) => (name.to_owned(), Some(Kind::Escape)),
            _ => (name.to_owned(), None),
        };
        let Some(k) = kind_in_table else {
            left.push((Left::Unknown, kind, name.to_owned(), calls));
            continue;
        };
        if !calls.keys().any(|d| used(*d)) {
            left.push((Left::Denied, kind, name.to_owned(), calls));
            continue;
        }
        let merged = chosen.entry(k).or_default().entry(pname).or_default();
        for (d, n) in calls {
            *merged.entry(d).or_insert(0) += n;
        }
    }
    // Entries not from the log, with the comment that says why they are there.
    let mut carriers: BTreeMap<String, &'static str> = BTreeMap::new();
    let submits_work = chosen
        .get(&Kind::Class)
        .is_some_and(|m| m.keys().any(|c| is_channel_class(c)));
    if submits_work {
        for control in WAIT_PATH_CONTROLS {
            if !names.knows(Kind::Control, control) {
                continue;
            }
            let controls = chosen.entry(Kind::Control).or_default();
            if !controls.contains_key(control) {
                controls.insert(control.to_owned(), BTreeMap::new());
                carriers.insert(control.to_owned(), WAIT_PATH_NOTE);
            }
        }
    }
    for (kind, escape, why) in [
        (
            Kind::Control,
            CONTROL_ESCAPE,
            "carries the controls (their calls are counted under the controls' names)",
        ),
        (
            Kind::Class,
            ALLOC_ESCAPE,
            "carries the classes (their calls are counted under the classes' names)",
        ),
    ] {
        if chosen.get(&kind).is_some_and(|m| !m.is_empty()) {
            let escapes = chosen.entry(Kind::Escape).or_default();
            if !escapes.contains_key(escape) {
                escapes.insert(escape.to_owned(), BTreeMap::new());
                carriers.insert(escape.to_owned(), why);
            }
        }
    }

    let mut out = String::new();
    let _ = writeln!(
        out,
        "# generated by: nvproxy policy suggest --from-audit {}",
        source.display()
    );
    let _ = writeln!(
        out,
        "# from {} instance(s) ({}): {calls_total} calls; names checked against {}",
        log.instances.len(),
        log.instances
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>()
            .join(", "),
        names.label
    );
    let _ = writeln!(
        out,
        "# each entry's comment: its calls in the log, by decision. Use it with\n\
         #   nvproxy exec --policy FILE ...   or   [[instance]] policy = \"FILE\""
    );
    out.push_str("[policy]\nallow_only = true\n");
    for (kind, key) in [
        (Kind::Escape, "escapes"),
        (Kind::Control, "controls"),
        (Kind::Class, "classes"),
        (Kind::Uvm, "uvm"),
    ] {
        let entries = chosen.remove(&kind).unwrap_or_default();
        if entries.is_empty() {
            let _ = writeln!(out, "{key} = []");
            continue;
        }
        let width = entries.keys().map(|n| n.len() + 3).max().unwrap_or(0);
        let _ = writeln!(out, "{key} = [");
        for (name, calls) in &entries {
            let quoted = format!("{},", toml_string(name));
            let comment = match carriers.get(name) {
                Some(why) => (*why).to_owned(),
                None => describe_calls(calls),
            };
            let _ = writeln!(out, "    {quoted:width$} # {comment}");
        }
        out.push_str("]\n");
    }
    if !left.is_empty() {
        out.push_str("\n# Not in the policy:\n");
        for (reason, heading) in [
            (
                Left::Denied,
                "denied in the log (the proxy refused them whatever the allowlist, or the log \
                 is of an enforce-mode run; add a name by hand to allow it)",
            ),
            (
                Left::Unknown,
                "unknown to the ABI table (no policy can allow them: they get the driver's \
                 \"unknown\" answer)",
            ),
            (
                Left::Privileged,
                "privileged legacy GSS controls (never forwarded: the proxy refuses them \
                 whatever the policy, and a policy cannot name them)",
            ),
            (
                Left::UvmMmap,
                "mmap of /dev/nvidia-uvm (governed by the instance's uvm_mmap, not by this list)",
            ),
        ] {
            let rows: Vec<_> = left
                .iter()
                .filter(|(r, ..)| std::mem::discriminant(r) == std::mem::discriminant(&reason))
                .collect();
            if rows.is_empty() {
                continue;
            }
            let _ = writeln!(out, "# - {heading}:");
            for (_, kind, name, calls) in rows {
                let _ = writeln!(
                    out,
                    "#     {} {name}: {}",
                    kind.as_str(),
                    describe_calls(calls)
                );
            }
        }
    }
    out
}

/// A TOML basic string (JSON's escapes are TOML's).
fn toml_string(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| format!("{s:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_edit_distance() {
        assert_eq!(edit_distance("", ""), 0);
        assert_eq!(edit_distance("abc", ""), 3);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("NV_ESC_CARD_INF", "NV_ESC_CARD_INFO"), 1);
    }

    #[test]
    fn test_closest_names_ignore_case_and_cover_every_kind() {
        let names = AbiNames::for_version("535.261.03").unwrap();
        assert_eq!(names.closest("nv_esc_card_info", 1), ["NV_ESC_CARD_INFO"]);
        assert_eq!(names.closest("UVM_INITIALISE", 1), ["UVM_INITIALIZE"]);
        assert_eq!(names.closest("NV01_ROOT_CLIENTS", 1), ["NV01_ROOT_CLIENT"]);
        assert_eq!(names.closest("RM_GSS_LEGACI", 1), ["RM_GSS_LEGACY"]);
        assert_eq!(names.closest("X", 3).len(), 3);
    }

    #[test]
    fn test_check_allow_as_exec_allow_uses_it() {
        let names = AbiNames::for_version("535.261.03").unwrap();
        check_allow(
            &["NV_ESC_CARD_INFO".into(), "RM_GSS_LEGACY 0x20808b59".into()],
            &names,
        )
        .unwrap();
        let msg = format!(
            "{:#}",
            check_allow(&["NV_ESC_CARD_INFOO".into()], &names).unwrap_err()
        );
        assert!(
            msg.starts_with("NV_ESC_CARD_INFOO is not a name in the ABI table of driver 535.261.03 (nearest known: NV_ESC_CARD_INFO, "),
            "{msg}"
        );
    }
    use nvproxy_abi::Caps;

    fn names() -> AbiNames {
        AbiNames::for_version("535.261.03").unwrap()
    }

    fn count(kind: &str, name: &str, decision: &str, n: u64) -> String {
        format!(
            r#"{{"type":"count","instance":"exec-1","kind":"{kind}","name":"{name}","decision":"{decision}","count":{n}}}"#
        )
    }

    const GOOD: &str = r#"
        [policy]
        allow_only = true
        escapes = ["NV_ESC_CARD_INFO", "NV_ESC_RM_CONTROL", "NV_ESC_RM_ALLOC"]
        controls = ["NV0000_CTRL_CMD_SYSTEM_GET_BUILD_VERSION", "RM_GSS_LEGACY"]
        classes = ["NV01_ROOT_CLIENT"]
        uvm = ["UVM_INITIALIZE"]
    "#;

    #[test]
    fn test_a_good_file_parses_checks_and_applies_as_only() {
        let f = PolicyFile::parse(GOOD).unwrap();
        f.check(&names()).unwrap();
        let mut p = InstancePolicy::new("t", Caps::COMPUTE_UTILITY, vec![0]);
        f.apply(&mut p);
        let only = p.only.as_ref().unwrap();
        assert_eq!(only.len(), 7);
        assert!(p.permits("UVM_INITIALIZE", Caps::COMPUTE));
        assert!(!p.permits("NV_ESC_REGISTER_FD", Caps::COMPUTE));
    }

    #[test]
    fn test_allow_only_false_adds_to_allow() {
        let f = PolicyFile::parse(
            "[policy]\nallow_only = false\ncontrols = [\"NV2080_CTRL_CMD_GPU_GET_NAME_STRING\"]\ndeny = [\"NV_ESC_CARD_INFO\"]\n",
        )
        .unwrap();
        f.check(&names()).unwrap();
        let mut p = InstancePolicy::new("t", Caps::NONE, vec![0]);
        f.apply(&mut p);
        assert!(p.only.is_none());
        assert!(p.permits("NV2080_CTRL_CMD_GPU_GET_NAME_STRING", Caps::NONE));
        assert!(!p.permits("NV_ESC_CARD_INFO", Caps::COMPUTE));
    }

    #[test]
    fn test_unknown_keys_are_errors_naming_them() {
        for (text, key) in [
            ("[policy]\nallow_only = true\nescape = []\n", "escape"),
            ("[policy]\nallow_only = true\n[extra]\n", "extra"),
            ("mode = \"audit\"\n[policy]\nallow_only = true\n", "mode"),
        ] {
            let err = PolicyFile::parse(text).unwrap_err();
            assert!(format!("{err:#}").contains(key), "{key}: {err:#}");
        }
        let err = PolicyFile::parse("[policy]\nescapes = []\n").unwrap_err();
        assert!(format!("{err:#}").contains("allow_only"), "{err:#}");
        assert!(PolicyFile::parse("").is_err());
        assert!(PolicyFile::parse("[policy]\nallow_only = true\nuvm = [1]\n").is_err());
    }

    #[test]
    fn test_names_outside_the_table_are_errors_naming_them() {
        let text = "[policy]\nallow_only = true\nescapes = [\"NV_ESC_RM_CONTROL\", \"NV_ESC_BOGUS\"]\n\
                    controls = [\"NV2080_CTRL_CMD_NOPE\", \"NV01_ROOT_CLIENT\"]\nuvm = [\"UVM_X\"]\n\
                    deny = [\"ALSO_BOGUS\"]\n";
        let err = PolicyFile::parse(text)
            .unwrap()
            .check(&names())
            .unwrap_err();
        let msg = format!("{err:#}");
        for want in [
            "escapes: not in the ABI table of driver 535.261.03: NV_ESC_BOGUS (nearest known: ",
            "controls: not in the ABI table of driver 535.261.03: NV2080_CTRL_CMD_NOPE",
            "controls: NV01_ROOT_CLIENT is a class, not a control entry (list it under classes)",
            "uvm: not in the ABI table of driver 535.261.03: UVM_X",
            "deny: not in the ABI table of driver 535.261.03: ALSO_BOGUS",
        ] {
            assert!(msg.contains(want), "want {want:?} in {msg}");
        }
    }

    #[test]
    fn test_controls_without_their_escape_are_refused() {
        let text = "[policy]\nallow_only = true\ncontrols = [\"NV2080_CTRL_CMD_GPU_GET_NAME_STRING\"]\n\
                    classes = [\"NV01_ROOT_CLIENT\"]\n";
        let err = PolicyFile::parse(text)
            .unwrap()
            .check(&names())
            .unwrap_err();
        let msg = format!("{err:#}");
        assert!(msg.contains("escapes lacks NV_ESC_RM_CONTROL"), "{msg}");
        assert!(msg.contains("escapes lacks NV_ESC_RM_ALLOC"), "{msg}");
    }

    #[test]
    fn test_a_name_of_another_version_is_refused_by_that_version_only() {
        // In some version's table but not in every one: find such a control.
        let all = AbiNames::all_versions();
        let old = names();
        let only_newer = all.names[&Kind::Control]
            .iter()
            .find(|n| !old.knows(Kind::Control, n))
            .expect("a control newer than 535.261.03");
        let text = format!(
            "[policy]\nallow_only = true\nescapes = [\"NV_ESC_RM_CONTROL\"]\ncontrols = [\"{only_newer}\"]\n"
        );
        let f = PolicyFile::parse(&text).unwrap();
        f.check(&all).unwrap();
        assert!(
            format!("{:#}", f.check(&old).unwrap_err()).contains(only_newer),
            "{only_newer}"
        );
    }

    fn suggest_from(lines: &[String]) -> String {
        let log = AuditLog::parse(&lines.join("\n")).unwrap();
        suggest(&log, &names(), Path::new("run.jsonl"))
    }

    #[test]
    fn test_suggest_lists_used_entries_with_carriers_and_parses_back() {
        let text = suggest_from(&[
            count("escape", "NV_ESC_CHECK_VERSION_STR", "allowed", 1),
            count("escape", "NV_ESC_CARD_INFO", "allowed", 2),
            count(
                "control",
                "NV2080_CTRL_CMD_GPU_GET_NAME_STRING",
                "allowed",
                1,
            ),
            count("control", "NV2080_CTRL_CMD_FB_GET_INFO_V2", "failed", 1),
            count(
                "control",
                "NV2080_CTRL_CMD_ECC_GET_VOLATILE_COUNTS",
                "audit-would-deny",
                3,
            ),
            count("control", "RM_GSS_LEGACY 0x20808001", "allowed", 1),
            count("control", "RM_GSS_LEGACY 0x20808b59", "allowed", 2),
            count("control", "RM_GSS_LEGACY 0x20808b61", "failed", 1),
            count("control", "NV2081_BINAPI 0x20810108", "allowed", 1),
            count("class", "NV01_ROOT_CLIENT", "allowed", 1),
            count("uvm", "UVM_INITIALIZE", "allowed", 1),
            count("uvm", "mmap", "allowed", 2),
            count("escape", "NV_ESC_NUMA_INFO", "denied", 1),
            count("escape", "NV_ESC_0x7f", "denied", 1),
            count("control", "control 0x20800999", "denied", 1),
        ]);
        let f = PolicyFile::parse(&text).unwrap_or_else(|e| panic!("{e:#}\n{text}"));
        f.check(&names()).unwrap();
        assert!(f.allow_only);
        assert_eq!(
            f.escapes.iter().collect::<Vec<_>>(),
            [
                "NV_ESC_CARD_INFO",
                "NV_ESC_CHECK_VERSION_STR",
                "NV_ESC_RM_ALLOC",
                "NV_ESC_RM_CONTROL"
            ]
        );
        assert_eq!(
            f.controls.iter().collect::<Vec<_>>(),
            [
                "NV2080_CTRL_CMD_ECC_GET_VOLATILE_COUNTS",
                "NV2080_CTRL_CMD_FB_GET_INFO_V2",
                "NV2080_CTRL_CMD_GPU_GET_NAME_STRING",
                "NV2081_BINAPI 0x20810108",
                "RM_GSS_LEGACY 0x20808001",
                "RM_GSS_LEGACY 0x20808b59",
                "RM_GSS_LEGACY 0x20808b61"
            ]
        );
        assert_eq!(f.classes.iter().collect::<Vec<_>>(), ["NV01_ROOT_CLIENT"]);
        assert_eq!(f.uvm.iter().collect::<Vec<_>>(), ["UVM_INITIALIZE"]);
        // The left-outs are comments that name them.
        for want in [
            "#     escape NV_ESC_NUMA_INFO: denied 1",
            "#     escape NV_ESC_0x7f: denied 1",
            "#     control control 0x20800999: denied 1",
            "#     uvm mmap: allowed 2",
            "# carries the controls",
            "\"RM_GSS_LEGACY 0x20808b59\",                # allowed 2",
            "# audit-would-deny 3",
            "# failed 1",
        ] {
            assert!(text.contains(want), "want {want:?} in\n{text}");
        }
        assert!(
            text.starts_with("# generated by: nvproxy policy suggest --from-audit run.jsonl\n")
        );
    }

    #[test]
    fn test_suggest_adds_the_wait_path_controls_of_a_program_with_a_channel() {
        // A run that submitted work (a GPFIFO channel) but never waited long enough for
        // libcuda's slow-wait controls: the policy still allows them, marked as not seen.
        let with_channel = [
            count("escape", "NV_ESC_RM_ALLOC", "allowed", 1),
            count("class", "HOPPER_CHANNEL_GPFIFO_A", "allowed", 1),
            count(
                "control",
                "NV2080_CTRL_CMD_MC_SERVICE_INTERRUPTS",
                "allowed",
                2,
            ),
        ];
        let text = suggest_from(&with_channel);
        let f = PolicyFile::parse(&text).unwrap_or_else(|e| panic!("{e:#}\n{text}"));
        f.check(&names()).unwrap();
        assert_eq!(
            f.controls.iter().collect::<Vec<_>>(),
            [
                "NV2080_CTRL_CMD_MC_SERVICE_INTERRUPTS",
                "NV906F_CTRL_CMD_RESET_CHANNEL"
            ],
            "{text}"
        );
        // The one in the log keeps its count; the other says why it is there.
        assert!(text.contains("# allowed 2"), "{text}");
        assert!(
            text.contains("# not in the log: libcuda calls it while it waits for the GPU"),
            "{text}"
        );
        // Without a channel nothing is added.
        let text = suggest_from(&[count("class", "NV01_DEVICE_0", "allowed", 1)]);
        let f = PolicyFile::parse(&text).unwrap();
        assert!(f.controls.is_empty(), "{text}");
    }

    #[test]
    fn test_suggest_is_deterministic_and_order_independent() {
        let mut lines = vec![
            count("escape", "NV_ESC_CARD_INFO", "allowed", 2),
            count("class", "NV01_DEVICE_0", "allowed", 1),
            count(
                "control",
                "NV2080_CTRL_CMD_GPU_GET_NAME_STRING",
                "allowed",
                1,
            ),
            count("uvm", "UVM_FREE", "failed", 1),
        ];
        let a = suggest_from(&lines);
        lines.reverse();
        assert_eq!(a, suggest_from(&lines));
    }

    #[test]
    fn test_suggest_counts_event_lines_of_unstopped_runs() {
        let ev = r#"{"type":"event","instance":"x","pid":1,"tid":1,"node":"ctl","kind":"control","name":"NV2080_CTRL_CMD_ECC_GET_VOLATILE_COUNTS","number":1,"decision":"audit-would-deny","reason":"policy","latency_us":1}"#;
        let text = suggest_from(&[ev.to_owned()]);
        let f = PolicyFile::parse(&text).unwrap();
        assert!(
            f.controls
                .contains("NV2080_CTRL_CMD_ECC_GET_VOLATILE_COUNTS")
        );
        assert!(f.escapes.contains(CONTROL_ESCAPE));
    }

    #[test]
    fn test_suggest_of_only_denied_entries_is_an_empty_valid_policy() {
        let text = suggest_from(&[count("escape", "NV_ESC_NUMA_INFO", "denied", 1)]);
        let f = PolicyFile::parse(&text).unwrap();
        f.check(&names()).unwrap();
        assert!(f.names().is_empty());
    }

    #[test]
    fn test_suggest_names_each_pass_through_command_never_the_family() {
        let text = suggest_from(&[
            count("control", "RM_GSS_LEGACY 0x20808b59", "allowed", 2),
            count("control", "RM_GSS_LEGACY 0x20808b62", "audit-would-deny", 1),
            count("control", "NV2081_BINAPI 0x20810108", "failed", 1),
        ]);
        let f = PolicyFile::parse(&text).unwrap_or_else(|e| panic!("{e:#}\n{text}"));
        f.check(&names()).unwrap();
        assert_eq!(
            f.controls.iter().collect::<Vec<_>>(),
            [
                "NV2081_BINAPI 0x20810108",
                "RM_GSS_LEGACY 0x20808b59",
                "RM_GSS_LEGACY 0x20808b62"
            ]
        );
        assert!(
            text.contains("\"RM_GSS_LEGACY 0x20808b59\", # allowed 2\n"),
            "{text}"
        );
        for family in PASS_THROUGH_CONTROLS {
            assert!(!text.contains(&format!("\"{family}\"")), "{text}");
        }
    }

    /// Legacy GSS commands of the categories the headers define are named by the headers, in
    /// the audit trail and so in suggested and checked policies; their number in the opaque
    /// form is refused with the name to write.
    #[test]
    fn test_legacy_gss_commands_are_suggested_and_checked_by_their_headers_name() {
        let limit = "NV0080_CTRL_PERF_LEGACY_NON_PRIVILEGED 0x09";
        let text = suggest_from(&[
            count("control", limit, "allowed", 2),
            count(
                "control",
                "NV2080_CTRL_GPU_LEGACY_NON_PRIVILEGED 0x59",
                "allowed",
                1,
            ),
        ]);
        let f = PolicyFile::parse(&text).unwrap_or_else(|e| panic!("{e:#}\n{text}"));
        let n535 = AbiNames::for_version("535.261.03").unwrap();
        f.check(&n535).unwrap_or_else(|e| panic!("{e:#}\n{text}"));
        assert!(f.controls.contains(limit), "{text}");
        let err = check_controls("\"RM_GSS_LEGACY 0x00809909\"").unwrap_err();
        assert!(
            format!("{err:#}").contains(&format!("{limit:?}")),
            "{err:#}"
        );
        // From 550 the kernel exports the unmasked control, and the legacy form is named by it.
        let n550 = AbiNames::for_version("550.163.01").unwrap();
        let named = PolicyFile::parse(
            "[policy]\nallow_only = true\nescapes = [\"NV_ESC_RM_CONTROL\"]\n\
             controls = [\"NV0080_CTRL_CMD_PERF_CUDA_LIMIT_SET_CONTROL (legacy)\"]\n",
        )
        .unwrap();
        named.check(&n550).unwrap();
        assert!(named.check(&n535).is_err(), "535 has no such control");
        assert!(f.check(&n550).is_err(), "550 names 0x809909 by its control");
        let p = InstancePolicy {
            only: Some(f.names()),
            ..InstancePolicy::new("t", Caps::NONE, vec![0])
        };
        assert!(p.permits(limit, Caps::COMPUTE_UTILITY));
        assert!(!p.permits(
            "NV2080_CTRL_GPU_LEGACY_NON_PRIVILEGED 0x62",
            Caps::COMPUTE_UTILITY
        ));
    }

    #[test]
    fn test_suggest_leaves_privileged_legacy_gss_controls_out_as_comments() {
        let text = suggest_from(&[
            count("control", "RM_GSS_LEGACY 0x2080c159", "denied", 1),
            count("control", "RM_GSS_LEGACY 0x20808b59", "allowed", 1),
        ]);
        let f = PolicyFile::parse(&text).unwrap();
        f.check(&names()).unwrap();
        assert_eq!(
            f.controls.iter().collect::<Vec<_>>(),
            ["RM_GSS_LEGACY 0x20808b59"]
        );
        assert!(
            text.contains("# - privileged legacy GSS controls"),
            "{text}"
        );
        assert!(
            text.contains("#     control RM_GSS_LEGACY 0x2080c159: denied 1"),
            "{text}"
        );
    }

    fn check_controls(controls: &str) -> Result<PolicyFile> {
        let f = PolicyFile::parse(&format!(
            "[policy]\nallow_only = true\nescapes = [\"NV_ESC_RM_CONTROL\"]\ncontrols = [{controls}]\n"
        ))?;
        f.check(&names())?;
        Ok(f)
    }

    #[test]
    fn test_check_accepts_pass_through_families_and_commands() {
        let f = check_controls(
            "\"RM_GSS_LEGACY\", \"NV2081_BINAPI\", \"RM_GSS_LEGACY 0x20808b59\", \
             \"NV2081_BINAPI 0x20810108\"",
        )
        .unwrap();
        assert_eq!(f.controls.len(), 4);
    }

    #[test]
    fn test_check_normalises_the_hex_of_a_pass_through_command() {
        let f = check_controls("\"RM_GSS_LEGACY 0X20808B5F\"").unwrap();
        assert_eq!(
            f.controls.iter().collect::<Vec<_>>(),
            ["RM_GSS_LEGACY 0x20808b5f"]
        );
        let mut p = InstancePolicy::new("t", Caps::NONE, vec![0]);
        f.apply(&mut p);
        assert!(p.permits("RM_GSS_LEGACY 0x20808b5f", Caps::COMPUTE_UTILITY));
        assert!(!p.permits("RM_GSS_LEGACY 0x20808b59", Caps::COMPUTE_UTILITY));
    }

    #[test]
    fn test_check_refuses_a_pass_through_command_outside_its_family() {
        let msg = format!(
            "{:#}",
            check_controls("\"RM_GSS_LEGACY 0x20800159\", \"NV2081_BINAPI 0x20800108\"")
                .unwrap_err()
        );
        for want in [
            "controls: \"RM_GSS_LEGACY 0x20800159\": 0x20800159 is outside the RM_GSS_LEGACY family \
             (bit 0x8000 is clear)",
            "controls: \"NV2081_BINAPI 0x20800108\": 0x20800108 is outside the NV2081_BINAPI family \
             (its class is 0x2080, not 0x2081)",
        ] {
            assert!(msg.contains(want), "want {want:?} in {msg}");
        }
    }

    #[test]
    fn test_check_refuses_a_privileged_legacy_gss_command() {
        let msg = format!(
            "{:#}",
            check_controls("\"RM_GSS_LEGACY 0x2080c159\"").unwrap_err()
        );
        assert!(
            msg.contains(
                "controls: \"RM_GSS_LEGACY 0x2080c159\": never forwarded: the proxy refuses \
                 privileged legacy GSS controls"
            ),
            "{msg}"
        );
    }

    #[test]
    fn test_check_refuses_a_malformed_pass_through_command() {
        for bad in [
            "RM_GSS_LEGACY 0x2080815g",
            "RM_GSS_LEGACY 20808159",
            "RM_GSS_LEGACY 0x120808159",
        ] {
            let msg = format!("{:#}", check_controls(&format!("\"{bad}\"")).unwrap_err());
            assert!(
                msg.contains(&format!(
                    "controls: \"{bad}\" is not a valid RM_GSS_LEGACY policy name"
                )),
                "{bad}: {msg}"
            );
        }
    }

    #[test]
    fn test_check_of_pass_through_names_in_deny_and_in_the_wrong_section() {
        let text = "[policy]\nallow_only = false\nclasses = [\"RM_GSS_LEGACY 0x20808b59\"]\n\
                    deny = [\"RM_GSS_LEGACY 0x20808b62\", \"NV2081_BINAPI 0x2081c001\"]\n";
        let msg = format!(
            "{:#}",
            PolicyFile::parse(text)
                .unwrap()
                .check(&names())
                .unwrap_err()
        );
        for want in [
            "classes: RM_GSS_LEGACY 0x20808b59 is a control, not a class entry (list it under \
             controls)",
            "deny: \"NV2081_BINAPI 0x2081c001\": never forwarded",
        ] {
            assert!(msg.contains(want), "want {want:?} in {msg}");
        }
        assert!(!msg.contains("0x20808b62"), "{msg}");
    }

    #[test]
    fn test_control_counted_under_its_escape_name_maps_to_the_escape() {
        // RM_CONTROL whose params could not be read: kind control, escape's name.
        let text = suggest_from(&[count("control", "NV_ESC_RM_CONTROL", "failed", 1)]);
        let f = PolicyFile::parse(&text).unwrap();
        assert_eq!(f.escapes.iter().collect::<Vec<_>>(), ["NV_ESC_RM_CONTROL"]);
        assert!(f.controls.is_empty());
    }
}
