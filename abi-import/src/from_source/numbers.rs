//! Numbers: candidate macros are picked from the headers' `#define` lines, then evaluated by
//! the compiler. Macros that are not integer constant expressions (bit ranges such as `7:0`,
//! strings, empty guards) are dropped: each candidate becomes a `_Static_assert` line, and the
//! lines the compiler rejects are removed until the file compiles.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use serde_json::{Map, Value};

use super::cc::Cc;
use super::source_tree::{KCOMMON, SDK, Tree, UNIX, UVM};

/// An integer macro value (some UVM constants are >= 2^63, a few values could be negative).
pub(crate) type Num = i128;

/// `v` as a JSON number: a `u64` when it is not negative, else an `i64`. A value outside both
/// (a literal wider than any C integer type) is an error, not a silently wrapped number.
pub(crate) fn num_json(v: Num) -> Result<Value> {
    match u64::try_from(v) {
        Ok(u) => Ok(Value::from(u)),
        Err(_) => match i64::try_from(v) {
            Ok(i) => Ok(Value::from(i)),
            Err(_) => bail!("integer {v} does not fit in 64 bits"),
        },
    }
}

pub(crate) fn to_json(m: &[(String, Num)]) -> Result<Value> {
    let mut o = Map::new();
    for (k, v) in m {
        o.insert(
            k.clone(),
            num_json(*v).with_context(|| format!("macro {k}"))?,
        );
    }
    Ok(Value::Object(o))
}

/// One object-like `#define`: its name, the text after the name (continuations joined,
/// comments kept) and the file (relative to the tree) that defines it.
#[derive(Clone, Debug)]
pub(crate) struct Define {
    pub name: String,
    pub body: String,
    pub file: String,
}

/// Object-like `#define`s of a file, in order.
pub(crate) fn defines(text: &str, file: &str) -> Vec<Define> {
    let mut out = Vec::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let t = line.trim_start();
        let Some(rest) = t.strip_prefix('#') else {
            continue;
        };
        let rest = rest.trim_start();
        let Some(rest) = rest.strip_prefix("define") else {
            continue;
        };
        if !rest.starts_with([' ', '\t']) {
            continue;
        }
        let rest = rest.trim_start();
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if name.is_empty() {
            continue;
        }
        let mut body = rest[name.len()..].to_owned();
        if body.starts_with('(') {
            continue; // function-like
        }
        while body.trim_end().ends_with('\\') {
            let b = body.trim_end();
            body = b[..b.len() - 1].to_owned();
            match lines.next() {
                Some(l) => body.push_str(l),
                None => break,
            }
        }
        out.push(Define {
            name,
            body: body.trim().to_owned(),
            file: file.to_owned(),
        });
    }
    out
}

/// The body without comments, trimmed.
pub(crate) fn code(body: &str) -> String {
    let mut s = body.to_owned();
    while let Some(a) = s.find("/*") {
        let end = s[a..].find("*/").map_or(s.len(), |e| a + e + 2);
        s.replace_range(a..end, " ");
    }
    if let Some(a) = s.find("//") {
        s.truncate(a);
    }
    s.trim().to_owned()
}

/// A plain integer literal (`0x10U`, `(0x5000U)`, `12`).
pub(crate) fn literal(text: &str) -> Option<Num> {
    let mut t = text.trim();
    while let Some(inner) = t.strip_prefix('(').and_then(|x| x.strip_suffix(')')) {
        t = inner.trim();
    }
    let t = t.trim_end_matches(['u', 'U', 'l', 'L']);
    if let Some(h) = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        i128::from_str_radix(h, 16).ok()
    } else {
        t.parse().ok()
    }
}

pub(crate) struct Numbers {
    pub escapes: Vec<(String, Num)>,
    pub constants: Vec<(String, Num)>,
    pub uvm_ioctls: Vec<(String, Num)>,
    pub uvm_init_flags: Vec<(String, Num)>,
    pub uvm_constants: Vec<(String, Num)>,
    pub classes: Vec<(String, Num)>,
    pub controls: Vec<(String, Num)>,
    pub rmctrl_flags: Vec<(String, Num)>,
    /// The legacy GSS control categories of the SDK headers
    /// (`NV2080_CTRL_GPU_LEGACY_NON_PRIVILEGED (0x81)`: a category with
    /// `NVxxxx_CTRL_LEGACY_NON_PRIVILEGED` or `_PRIVILEGED` or-ed in, `ctrlxxxx.h`).
    pub legacy_control_categories: Vec<(String, Num)>,
    /// Every object-like define of the SDK headers, by name (the last one wins).
    pub sdk_defines: HashMap<String, Define>,
}

/// Evaluates `names` in the context of `prelude` (the translation unit's includes).
pub(crate) fn eval(
    cc: &Cc,
    tag: &str,
    prelude: &str,
    includes: &[PathBuf],
    names: &[String],
) -> Result<BTreeMap<String, Num>> {
    let mut live: Vec<String> = names.to_vec();
    let mut done = false;
    let prelude_lines = prelude.lines().count();
    for _round in 0..8 {
        let mut src = String::from(prelude);
        for n in &live {
            src.push_str(&format!("_Static_assert(({n}) || 1, \"\");\n"));
        }
        let (ok, diag) = cc.diagnostics(&format!("{tag}_check"), &src, includes)?;
        if ok {
            done = true;
            break;
        }
        let file = format!("{tag}_check.c:");
        let mut bad = BTreeSet::new();
        for l in diag.lines() {
            let Some(pos) = l.find(&file) else { continue };
            let rest = &l[pos + file.len()..];
            let Some(line) = rest.split(':').next().and_then(|x| x.parse::<usize>().ok()) else {
                continue;
            };
            if !l.contains("error") {
                continue;
            }
            if line <= prelude_lines {
                bail!(
                    "the headers do not compile:\n{}",
                    super::cc::truncate(&diag, 4000)
                );
            }
            bad.insert(line - prelude_lines - 1);
        }
        if bad.is_empty() {
            bail!(
                "cannot evaluate macros:\n{}",
                super::cc::truncate(&diag, 4000)
            );
        }
        live = live
            .into_iter()
            .enumerate()
            .filter(|(i, _)| !bad.contains(i))
            .map(|(_, n)| n)
            .collect();
    }
    if !done {
        bail!("macro evaluation did not converge");
    }
    let mut src = String::from("#include <stdio.h>\n");
    src.push_str(prelude);
    src.push_str("int main(void) {\n");
    for n in &live {
        src.push_str(&format!(
            "  if (({n}) < 0) printf(\"%lld\\n\", (long long)({n})); else printf(\"%llu\\n\", (unsigned long long)({n}));\n"
        ));
    }
    src.push_str("  return 0;\n}\n");
    let out = cc.run_program(&format!("{tag}_eval"), &src, includes)?;
    let mut vals = BTreeMap::new();
    let mut it = out.lines();
    for n in live {
        let v: Num = it
            .next()
            .context("macro program printed too little")?
            .trim()
            .parse()
            .context("macro program printed garbage")?;
        vals.insert(n, v);
    }
    Ok(vals)
}

fn pick(vals: &BTreeMap<String, Num>, names: &[String]) -> Vec<(String, Num)> {
    names
        .iter()
        .filter_map(|n| vals.get(n).map(|v| (n.clone(), *v)))
        .collect()
}

fn dedup(v: Vec<String>) -> Vec<String> {
    let mut seen = BTreeSet::new();
    v.into_iter().filter(|n| seen.insert(n.clone())).collect()
}

fn all_files(tree: &Tree, dir: &str, out: &mut Vec<String>) -> Result<()> {
    let p = tree.path(dir);
    let mut entries: Vec<_> = std::fs::read_dir(&p)
        .with_context(|| format!("listing {}", p.display()))?
        .filter_map(|e| e.ok())
        .collect();
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let name = e.file_name().to_string_lossy().into_owned();
        let rel = format!("{dir}/{name}");
        if e.file_type()?.is_dir() {
            all_files(tree, &rel, out)?;
        } else if name.ends_with(".h") {
            out.push(rel);
        }
    }
    Ok(())
}

pub(crate) fn evaluate(cc: &Cc, tree: &Tree, tu1: &str, tu_uvm: &str) -> Result<Numbers> {
    // --- SDK defines (controls) ---
    let mut sdk_files = Vec::new();
    all_files(tree, SDK, &mut sdk_files)?;
    let mut sdk_defs: Vec<Define> = Vec::new();
    for f in &sdk_files {
        sdk_defs.extend(defines(&tree.read(f)?, f));
    }
    let sdk_defines: HashMap<String, Define> = sdk_defs
        .iter()
        .map(|d| (d.name.clone(), d.clone()))
        .collect();

    // Controls: the command macros FINN generated ("finn: Evaluated from "(..._INTERFACE_ID <<
    // 8) | ..."), when their number belongs to the class of their name, plus `*_CTRL_CMD_*`
    // macros defined as another such macro.
    let mut finn = Vec::new();
    for d in &sdk_defs {
        if !(d.body.contains("finn: Evaluated from") && d.body.contains("INTERFACE_ID")) {
            continue;
        }
        let Some(v) = literal(&code(&d.body)) else {
            continue;
        };
        let n = &d.name;
        let class = n
            .strip_prefix("NV")
            .and_then(|r| r.get(..4).filter(|_| r.as_bytes().get(4) == Some(&b'_')))
            .filter(|h| h.chars().all(|c| c.is_ascii_hexdigit()) && *h == h.to_ascii_uppercase());
        if let Some(h) = class
            && h != "0000"
            && (v >> 16) != i128::from_str_radix(h, 16).unwrap_or(-1)
        {
            continue;
        }
        finn.push(n.clone());
    }
    let finn_set: BTreeSet<&String> = finn.iter().collect();
    let mut controls = finn.clone();
    for d in &sdk_defs {
        if !d.name.contains("_CTRL_CMD_") || finn_set.contains(&d.name) {
            continue;
        }
        let c = code(&d.body);
        let c = c.trim_start_matches('(').trim_end_matches(')').trim();
        if finn_set.contains(&c.to_owned()) {
            controls.push(d.name.clone());
        }
    }
    let controls = dedup(controls);

    // --- Unix ioctl headers ---
    let mut unix_defs = Vec::new();
    for f in tree.unix_headers() {
        unix_defs.extend(defines(&tree.read(&f)?, &f));
    }
    let escapes: Vec<String> = dedup(
        unix_defs
            .iter()
            .filter(|d| d.name.starts_with("NV_ESC_"))
            .map(|d| d.name.clone())
            .collect(),
    );
    let constants: Vec<String> = dedup(
        unix_defs
            .iter()
            .map(|d| d.name.clone())
            .filter(|n| {
                n == "NV_IOCTL_MAGIC"
                    || n == "NV_IOCTL_BASE"
                    || n.starts_with("NV_RM_API_VERSION_")
                    || n.starts_with("NV_IOCTL_NUMA_")
                    || n.starts_with("NV_DMABUF_EXPORT_")
            })
            .collect(),
    );

    let mut names1 = controls.clone();
    names1.extend(escapes.iter().cloned());
    names1.extend(constants.iter().cloned());
    let vals1 = eval(cc, "num1", tu1, &tree.includes1(), &dedup(names1))?;

    let mut constants_v = pick(&vals1, &constants);
    // NV_ABSOLUTE_MAX_IOCTL_SIZE lives in nv.h, which is not a user-space header.
    let nvh = format!("{UNIX}/nv.h");
    let max = if tree.exists(&nvh) {
        defines(&tree.read(&nvh)?, &nvh)
            .into_iter()
            .find(|d| d.name == "NV_ABSOLUTE_MAX_IOCTL_SIZE")
            .and_then(|d| literal(&code(&d.body)))
    } else {
        None
    };
    if let Some(m) = max {
        constants_v.push(("NV_ABSOLUTE_MAX_IOCTL_SIZE".to_owned(), m));
    }
    constants_v.sort();

    // --- UVM ---
    let mut uvm_defs = Vec::new();
    for h in ["uvm_ioctl.h", "uvm_linux_ioctl.h", "uvm_types.h"] {
        let f = format!("{UVM}/{h}");
        let t = tree.read(&f)?;
        uvm_defs.extend(defines(&t, &f));
    }
    // Plus the device limits of nvlimits.h (NV_MAX_DEVICES, NV_MAX_SUBDEVICES), as in the
    // reference files; its other limits are not listed there.
    let limits = format!("{KCOMMON}/nvlimits.h");
    let mut extra = Vec::new();
    if tree.exists(&limits) {
        for d in defines(&tree.read(&limits)?, &limits) {
            if d.name.starts_with("NV_MAX_") && d.name.ends_with("DEVICES") {
                extra.push(d.name);
            }
        }
    }
    let ioctl_names: Vec<String> = dedup(
        uvm_defs
            .iter()
            .filter(|d| {
                !d.name.starts_with('_')
                    && (code(&d.body).starts_with("UVM_IOCTL_BASE(")
                        || d.file.ends_with("uvm_linux_ioctl.h"))
            })
            .map(|d| d.name.clone())
            .collect(),
    );
    let ioctl_set: BTreeSet<&String> = ioctl_names.iter().collect();
    let init_flags: Vec<String> = dedup(
        uvm_defs
            .iter()
            .filter(|d| d.name.starts_with("UVM_INIT_FLAGS_"))
            .map(|d| d.name.clone())
            .collect(),
    );
    let mut uvm_const: Vec<String> = uvm_defs
        .iter()
        .map(|d| d.name.clone())
        .filter(|n| {
            !n.starts_with('_') && !ioctl_set.contains(n) && !n.starts_with("UVM_INIT_FLAGS_")
        })
        .collect();
    uvm_const.extend(extra);
    let uvm_const = dedup(uvm_const);
    let mut names2 = ioctl_names.clone();
    names2.extend(init_flags.iter().cloned());
    names2.extend(uvm_const.iter().cloned());
    let vals2 = eval(cc, "num_uvm", tu_uvm, &tree.includes_uvm(), &dedup(names2))?;

    // --- classes: the RM's generated class list ---
    let classes_file = "src/nvidia/generated/g_allclasses.h";
    let classes: Vec<(String, Num)> = defines(&tree.read(classes_file)?, classes_file)
        .into_iter()
        .filter_map(|d| literal(&code(&d.body)).map(|v| (d.name, v)))
        .collect();

    // --- RMCTRL flag bits ---
    let control_h = "src/nvidia/inc/kernel/rmapi/control.h";
    let rmctrl_flags: Vec<(String, Num)> = defines(&tree.read(control_h)?, control_h)
        .into_iter()
        .filter(|d| d.name.starts_with("RMCTRL_FLAGS_"))
        .filter_map(|d| literal(&code(&d.body)).map(|v| (d.name, v)))
        .collect();

    let legacy_control_categories = legacy_categories(&sdk_defs);

    Ok(Numbers {
        legacy_control_categories,
        escapes: pick(&vals1, &escapes),
        constants: constants_v,
        uvm_ioctls: pick(&vals2, &ioctl_names),
        uvm_init_flags: pick(&vals2, &init_flags),
        uvm_constants: pick(&vals2, &uvm_const),
        classes,
        controls: pick(&vals1, &controls),
        rmctrl_flags,
        sdk_defines,
    })
}

/// The legacy GSS control categories among `defs`: `NV<class>_CTRL_<CATEGORY>_LEGACY_PRIVILEGED`
/// and `..._LEGACY_NON_PRIVILEGED` with a literal value (FINN writes the evaluated value, with
/// the expression in a comment), sorted by name.
pub(crate) fn legacy_categories(defs: &[Define]) -> Vec<(String, Num)> {
    let mut out: Vec<(String, Num)> = defs
        .iter()
        .filter(|d| is_legacy_category_name(&d.name))
        .filter_map(|d| literal(&code(&d.body)).map(|v| (d.name.clone(), v)))
        .collect();
    out.sort();
    out.dedup();
    out
}

/// `NV` + four upper-case hex digits + `_CTRL_` + one word + `_LEGACY_PRIVILEGED` or
/// `_LEGACY_NON_PRIVILEGED`.
fn is_legacy_category_name(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("NV") else {
        return false;
    };
    let (class, rest) = rest.split_at(rest.len().min(4));
    if class.len() != 4
        || !class
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'A'..=b'F').contains(&b))
    {
        return false;
    }
    let Some(rest) = rest.strip_prefix("_CTRL_") else {
        return false;
    };
    let word = rest
        .strip_suffix("_LEGACY_NON_PRIVILEGED")
        .or_else(|| rest.strip_suffix("_LEGACY_PRIVILEGED"));
    word.is_some_and(|w| {
        !w.is_empty()
            && w.bytes()
                .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn legacy_categories_are_the_category_defines_only() {
        let text = "#define NV2080_CTRL_GPU_LEGACY_NON_PRIVILEGED (0x81) /* finn: Evaluated from \"(NV2080_CTRL_GPU | NVxxxx_CTRL_LEGACY_NON_PRIVILEGED)\" */\n\
            #define NV2080_CTRL_CLK_LEGACY_PRIVILEGED       (0xd0)\n\
            #define NV0000_CTRL_CMD_GPU_LEGACY_CONFIG (0x282U)\n\
            #define NV2080_CTRL_GPU_SET_PARTITIONING_MODE_REPARTITIONING_LEGACY 0U\n\
            #define NVxxxx_CTRL_LEGACY_PRIVILEGED (0xC0)\n\
            #define NV2080_CTRL_A_B_LEGACY_PRIVILEGED (0xc1)\n";
        let got = legacy_categories(&defines(text, "ctrl2080base.h"));
        let names: Vec<&str> = got.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "NV2080_CTRL_CLK_LEGACY_PRIVILEGED",
                "NV2080_CTRL_GPU_LEGACY_NON_PRIVILEGED"
            ]
        );
        assert_eq!(got[0].1, 0xd0);
        assert_eq!(got[1].1, 0x81);
    }

    #[test]
    fn defines_skip_function_like_and_join_continuations() {
        let text = "#define A (0x10U) /* finn: x */\n#define F(x) x\n# define B (A | \\\n  2)\n#define\tC\n";
        let d = defines(text, "f.h");
        let names: Vec<&str> = d.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["A", "B", "C"]);
        assert_eq!(code(&d[0].body), "(0x10U)");
        assert!(d[0].body.contains("finn"));
        assert_eq!(code(&d[1].body), "(A |   2)");
    }

    #[test]
    fn num_json_keeps_64_bit_values_and_rejects_wider_ones() {
        assert_eq!(num_json(-1).unwrap(), Value::from(-1i64));
        assert_eq!(num_json(1 << 63).unwrap(), Value::from(1u64 << 63));
        assert_eq!(
            num_json(i128::from(u64::MAX)).unwrap(),
            Value::from(u64::MAX)
        );
        assert!(num_json(1 << 64).is_err());
        assert!(num_json(i128::from(i64::MIN) - 1).is_err());
    }

    #[test]
    fn literals() {
        assert_eq!(literal("(0x5000U)"), Some(0x5000));
        assert_eq!(literal("12"), Some(12));
        assert_eq!(literal("0x000000400"), Some(0x400));
        assert_eq!(literal("(A | B)"), None);
        assert_eq!(literal("7:0"), None);
    }
}
