//! Tree composition, lookup and rendering.

use nvproxy_abi::tree::nearest_ancestor;
use nvproxy_abi::{AbiError, Caps, DriverVersion, Support, find, nodes, render};

fn ver(s: &str) -> DriverVersion {
    s.parse().unwrap()
}

#[test]
fn test_required_versions_are_supported_nodes() {
    for v in [
        "535.216.03",
        "535.261.03",
        "535.288.01",
        "550.163.01",
        "570.211.01",
        "575.64.05",
        "580.142",
        "590.48.01",
        "595.45.04",
        "535.309.01",
        "580.159.04",
    ] {
        assert_eq!(find(&ver(v)).unwrap().support, Support::Supported, "{v}");
    }
}

#[test]
fn test_every_tag_from_535_and_the_five_gvisor_versions_are_nodes() {
    assert_eq!(nodes().len(), 144 + 5);
    let roots: Vec<_> = nodes().iter().filter(|n| n.parent.is_none()).collect();
    assert_eq!(roots.len(), 1);
    assert_eq!(roots[0].version, ver("535.43.02"));
    assert_eq!(nodes().iter().filter(|n| n.commit.is_some()).count(), 144);
}

#[test]
fn test_versions_without_a_tag_record_gvisor_as_their_source() {
    for (v, same) in [
        ("535.309.01", "535.288.01"),
        ("580.159.03", "580.126.20"),
        ("580.159.04", "580.126.20"),
        ("580.173.02", "580.159.04"),
        ("595.71.05", "590.48.01"),
    ] {
        let n = find(&ver(v)).unwrap();
        assert!(n.commit.is_none(), "{v}");
        assert!(
            n.note.contains("gVisor") && n.note.contains(same),
            "{v}: {}",
            n.note
        );
        assert_eq!(n.tables(), find(&ver(n.facts)).unwrap().tables(), "{v}");
    }
    let n = find(&ver("595.71.05")).unwrap();
    assert_eq!(n.support, Support::Unqualified);
    assert!(n.reason.is_some_and(|r| r.contains("no facts of its own")));
}

#[test]
fn test_every_parent_is_an_earlier_node() {
    for (i, n) in nodes().iter().enumerate() {
        if let Some(p) = n.parent {
            assert!(
                nodes()[..i].iter().any(|x| x.version == p),
                "{} before its parent",
                n.version
            );
        }
    }
}

#[test]
fn test_installer_checksums_are_the_ones_gvisor_lists() {
    let sums: Vec<_> = nodes().iter().filter_map(|n| n.installer_sha256).collect();
    assert_eq!(sums.len(), 20);
    for s in sums {
        assert!(
            s.len() == 64
                && s.bytes()
                    .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        );
    }
    let n = find(&ver("580.159.04")).unwrap();
    assert_eq!(
        n.installer_sha256,
        Some("c1e66761b088d17b3adf6cb6979de9af38be2684d102b001a176dcfafabdca1e")
    );
    assert_eq!(find(&ver("535.216.03")).unwrap().installer_sha256, None);
}

#[test]
fn test_alias_node_has_parent_tables() {
    let n = find(&ver("535.288.01")).unwrap();
    assert!(n.same_as_parent);
    assert_eq!(n.tables(), n.parent_node().unwrap().tables());
}

#[test]
fn test_575_forks_from_570_133_20_not_from_the_570_tip() {
    let n575 = find(&ver("575.64.05")).unwrap();
    assert!(n575.descends_from(&ver("570.133.20")));
    assert!(!n575.descends_from(&ver("570.211.01")));
    assert!(!n575.descends_from(&ver("570.144")));
}

#[test]
fn test_545_forks_from_535_113_01_before_the_535_ecc_backport() {
    assert_eq!(
        find(&ver("545.23.06")).unwrap().parent,
        Some(ver("535.113.01"))
    );
    let n545 = find(&ver("545.29.06")).unwrap();
    assert!(n545.descends_from(&ver("535.113.01")));
    assert!(!n545.descends_from(&ver("535.216.03")));
}

#[test]
fn test_590_forks_from_580_105_08_and_lacks_580_142_backports() {
    let n590 = find(&ver("590.48.01")).unwrap();
    assert!(n590.descends_from(&ver("580.105.08")));
    assert!(!n590.descends_from(&ver("580.142")));
}

#[test]
fn test_p2p_caps_is_admin_only_where_rm_does_not_copy_bus_egm_peer_ids() {
    // 550.40.07 to 550.78 (and 555.42.x): CliGetSystemP2pCaps stores through busEgmPeerIds,
    // which embedded_param_copy.c does not copy in.
    let caps = |v: &str| {
        let t = find(&ver(v)).unwrap().tables();
        t.controls[&0x127].caps
    };
    for v in ["550.40.07", "550.54.15", "550.78", "555.42.02", "550.40.63"] {
        assert_eq!(caps(v), Caps::NONE, "{v}");
    }
    for v in [
        "545.29.06",
        "550.90.07",
        "550.40.65",
        "555.52.04",
        "580.142",
    ] {
        assert_eq!(caps(v), Caps::COMPUTE_UTILITY, "{v}");
    }
}

#[test]
fn test_dram_status_number_differs_between_570_and_575() {
    let (a, b) = (
        find(&ver("570.211.01")).unwrap().tables(),
        find(&ver("575.64.05")).unwrap().tables(),
    );
    let name = "NV2080_CTRL_CMD_FB_QUERY_DRAM_ENCRYPTION_STATUS";
    assert_eq!(a.control_by_name(name).unwrap().cmd, 0x2080_1359);
    assert_eq!(b.control_by_name(name).unwrap().cmd, 0x2080_1358);
}

#[test]
fn test_unknown_version_error_names_nearest_ancestor_and_the_choices() {
    let err = find(&ver("570.300.01")).unwrap_err();
    assert_eq!(
        err,
        AbiError::UnknownVersion {
            version: ver("570.300.01"),
            nearest: Some(ver("570.211.01")),
            neighbours: vec![ver("570.211.01"), ver("575.51.02")],
        }
    );
    let msg = err.to_string();
    for want in [
        "nvproxy has no ABI tables for driver 570.300.01 (",
        "nearest known version on branch 570 is 570.211.01",
        "The choices: (1)",
        "`nvproxy abi import --from-source DIR --out /etc/nvproxy/abi.d/570.300.01.json`",
        "`[daemon] abi_dir = \"/etc/nvproxy/abi.d\"`",
        "\n(2) serve 570.300.01 with the tables of a known version, at your own risk: \
         `[daemon] abi_version = \"570.211.01\"` or `nvproxy serve --abi-version 570.211.01`",
        "(3) run a driver version nvproxy has tables for",
    ] {
        assert!(msg.contains(want), "{want}\n{msg}");
    }
}

#[test]
fn test_unknown_version_without_ancestor_says_so_and_offers_the_same_choices() {
    let msg = find(&ver("999.100.01")).unwrap_err().to_string();
    assert!(
        msg.starts_with(
            "nvproxy has no ABI tables for driver 999.100.01, nor for any earlier version of \
             branch 999 (`nvproxy abi versions` lists the versions it has; the nearest are \
             595.71.05).\nThe choices: (1)"
        ) && msg.contains("`[daemon] abi_version = \"VERSION\"`"),
        "{msg}"
    );
}

#[test]
fn test_unknown_version_before_any_known_on_branch_has_no_ancestor() {
    assert!(nearest_ancestor(&ver("535.40.01")).is_none());
    assert_eq!(
        nearest_ancestor(&ver("535.100.01")).map(|n| n.version),
        Some(ver("535.98"))
    );
    assert!(nearest_ancestor(&ver("600.10.01")).is_none());
}

#[test]
fn test_rm_alloc_accepts_nvos21_and_nvos64_only() {
    let abi = find(&ver("580.142")).unwrap().tables();
    let e = abi.escape_by_name("NV_ESC_RM_ALLOC").unwrap();
    assert_eq!(
        (e.cmd_for_size(32), e.cmd_for_size(48), e.cmd_for_size(40)),
        (Some(0xc020_462b), Some(0xc030_462b), None)
    );
}

#[test]
fn test_card_info_is_an_array_of_72_byte_entries() {
    let abi = find(&ver("535.216.03")).unwrap().tables();
    let e = abi.escape_by_name("NV_ESC_CARD_INFO").unwrap();
    assert!(e.size.accepts(32 * 72) && !e.size.accepts(100) && !e.size.accepts(0));
}

#[test]
fn test_ecc_controls_are_admin_only() {
    let abi = find(&ver("535.261.03")).unwrap().tables();
    assert_eq!(
        abi.control_by_name("NV2080_CTRL_CMD_ECC_GET_VOLATILE_COUNTS")
            .unwrap()
            .caps,
        Caps::NONE
    );
}

#[test]
fn test_versions_rendering_lists_every_node_once() {
    let out = render::versions();
    // The version column (a note's continuation lines leave it empty).
    let first_col: Vec<&str> = out
        .lines()
        .filter_map(|l| {
            let col: String = l.chars().take(38).collect();
            let v = col.trim_start_matches(['│', '├', '└', '─', ' ']).trim();
            (!v.is_empty()).then(|| l.trim_start_matches(['│', '├', '└', '─', ' ']))
        })
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    for n in nodes() {
        let v = n.version.to_string();
        assert_eq!(
            first_col.iter().filter(|c| **c == v).count(),
            1,
            "{v}\n{out}"
        );
    }
}

#[test]
fn test_show_rendering_has_hex_numbers_and_caps() {
    let n = find(&ver("550.163.01")).unwrap();
    let out = render::show(&n.version, &n.tables());
    assert!(
        out.contains("0xda")
            && out.contains("NV_ESC_WAIT_OPEN_COMPLETE")
            && out.contains("compute,utility")
    );
}

#[test]
fn test_diff_rendering_reports_size_change() {
    let (a, b) = (
        find(&ver("545.29.06")).unwrap(),
        find(&ver("550.163.01")).unwrap(),
    );
    let out = render::diff((&a.version, &a.tables()), (&b.version, &b.tables()));
    assert!(
        out.contains("NV_ESC_RM_UNMAP_MEMORY_DMA: size 40 -> 48"),
        "{out}"
    );
}

#[test]
fn test_versions_rendering_says_what_the_sha256_dash_means() {
    let out = render::versions();
    assert!(
        out.contains("sha256: of NVIDIA's x86_64 .run installer")
            && out.contains("as gVisor's version.go lists it")
            && out.contains("`-`: none listed"),
        "{out}"
    );
}

#[test]
fn test_versions_rendering_prints_the_reason_of_each_unqualified_node() {
    let out = render::versions();
    let lines: Vec<&str> = out.lines().collect();
    for n in nodes().iter().filter(|n| n.support == Support::Unqualified) {
        // The node's line and the note's continuation lines below it (no version of their own).
        let at = lines
            .iter()
            .position(|l| l.contains(&format!("{} ", n.version)))
            .unwrap();
        let note_column = lines[at].find("unqualified: ").unwrap();
        let mut note = lines[at][note_column..].to_owned();
        for l in &lines[at + 1..] {
            let more = l.get(note_column..).unwrap_or_default();
            if l[..note_column.min(l.len())].contains(|c: char| c.is_ascii_digit())
                || more.is_empty()
            {
                break;
            }
            note.push(' ');
            note.push_str(more.trim());
        }
        assert!(
            note.contains(&format!("unqualified: {}", n.reason.unwrap())),
            "{note}"
        );
    }
    let line = out.lines().find(|l| l.contains("580.159.04 ")).unwrap();
    assert!(line.contains("c1e66761b088d17b "), "{line}");
}

#[test]
fn test_versions_rendering_fits_a_wide_terminal() {
    let out = render::versions();
    let longest = out
        .lines()
        .filter(|l| !l.starts_with("sha256:") && !l.contains(" versions, "))
        .map(|l| l.chars().count())
        .max()
        .unwrap();
    assert!(longest <= 150, "{longest}\n{out}");
}

/// `VID_HEAP_CONTROL` reads `NVOS32_ATTR2_USE_EGM` from 550: `_rmVidHeapControlAllocCommon`
/// (`src/nvidia/interface/deprecated/rmapi_deprecated_vidheapctrl.c`) has no EGM branch at
/// 545.29.06 and allocates `NV_MEMORY_EXTENDED_USER` for it at 550.40.07.
#[test]
fn test_vid_heap_egm_from_550() {
    for (v, egm) in [
        ("545.29.06", false),
        ("550.40.07", true),
        ("580.65.06", true),
    ] {
        let node = nvproxy_abi::find(&v.parse().unwrap()).unwrap();
        assert_eq!(node.tables().vid_heap_egm, egm, "{v}");
    }
    assert!(
        !nvproxy_abi::nodes()[0].tables().vid_heap_egm,
        "the 535 root"
    );
}
