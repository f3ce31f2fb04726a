//! `GetPreferredAllocation`: the devices closest to each other.
//!
//! Closeness of two GPUs, most significant first: the number of PCI bridges their sysfs device
//! paths share (GPUs behind one PCIe switch share the switch's ports; the daemon reports the
//! path from `/sys/bus/pci/devices/<bus id>`); the same NUMA node; then the distance of their
//! PCI bus numbers in one domain (buses are numbered depth first, so GPUs behind one switch
//! have near numbers: the only hint the simulated driver, which has no sysfs, gives). NVLink
//! is not looked at: the instance API does not report it.

use std::collections::{BTreeMap, BTreeSet};

use crate::Gpu;

/// How close `a` and `b` are (larger: closer).
pub fn closeness(a: &Gpu, b: &Gpu) -> u64 {
    let shared = a
        .pci_path
        .iter()
        .zip(&b.pci_path)
        .take_while(|(x, y)| x == y)
        .count() as u64;
    let numa = u64::from(a.numa_node.is_some() && a.numa_node == b.numa_node);
    let bus = match (parse_bus(&a.bus_id), parse_bus(&b.bus_id)) {
        (Some((da, ba)), Some((db, bb))) if da == db => 256 - u64::from(ba.abs_diff(bb)),
        _ => 0,
    };
    (shared.min(255) << 16) | (numa << 9) | bus
}

/// (domain, bus) of `dddd:bb:dd.f`.
fn parse_bus(id: &str) -> Option<(u32, u8)> {
    let mut parts = id.split(':');
    let domain = u32::from_str_radix(parts.next()?, 16).ok()?;
    let bus = u8::from_str_radix(parts.next()?, 16).ok()?;
    Some((domain, bus))
}

/// `size` devices of `available` (ids of `gpus`; others are ignored) that include
/// `must_include` and are as close to each other as can be: grown greedily from each possible
/// start (the devices that must be included, or each available one), the set with the
/// largest sum of pairwise closeness kept; ties go to the smaller ids. Fewer than `size` when
/// there are not that many.
pub fn preferred(
    gpus: &BTreeMap<String, Gpu>,
    available: &[String],
    must_include: &[String],
    size: usize,
) -> Vec<String> {
    let avail: BTreeSet<&str> = available
        .iter()
        .map(String::as_str)
        .filter(|id| gpus.contains_key(*id))
        .collect();
    let must: BTreeSet<&str> = must_include
        .iter()
        .map(String::as_str)
        .filter(|id| gpus.contains_key(*id))
        .collect();
    let size = size.min(avail.len() + must.len());
    if must.len() >= size {
        return must.into_iter().take(size).map(str::to_owned).collect();
    }
    let pair = |a: &str, b: &str| closeness(&gpus[a], &gpus[b]);
    let starts: Vec<BTreeSet<&str>> = if must.is_empty() {
        avail.iter().map(|&id| BTreeSet::from([id])).collect()
    } else {
        vec![must.clone()]
    };
    let mut best: Option<(u64, Vec<&str>)> = None;
    for start in starts {
        let mut chosen = start;
        while chosen.len() < size {
            let next = avail
                .iter()
                .filter(|id| !chosen.contains(*id))
                .max_by(|a, b| {
                    let sa: u64 = chosen.iter().map(|c| pair(a, c)).sum();
                    let sb: u64 = chosen.iter().map(|c| pair(b, c)).sum();
                    // Equal sums: the smaller id wins (max_by keeps the last maximum).
                    sa.cmp(&sb).then_with(|| b.cmp(a))
                });
            match next {
                Some(&id) => {
                    chosen.insert(id);
                }
                None => break,
            }
        }
        let ids: Vec<&str> = chosen.into_iter().collect();
        let mut score = 0u64;
        for (i, a) in ids.iter().enumerate() {
            for b in &ids[i + 1..] {
                score += pair(a, b);
            }
        }
        if best.as_ref().is_none_or(|(s, _)| score > *s) {
            best = Some((score, ids));
        }
    }
    best.map(|(_, ids)| ids.into_iter().map(str::to_owned).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(minor: u32, bus: u8, path: &[&str], numa: Option<i64>) -> (String, Gpu) {
        (
            format!("gpu{minor}"),
            Gpu {
                minor,
                uuid: String::new(),
                bus_id: format!("0000:{bus:02x}:00.0"),
                pci_path: path.iter().map(|s| s.to_string()).collect(),
                numa_node: numa,
                memory: None,
            },
        )
    }

    fn ids(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn test_gpus_behind_one_switch_are_preferred_over_near_bus_numbers() {
        // gpu0 and gpu2 share a switch port chain; gpu1 has the nearer bus number to gpu0.
        let gpus: BTreeMap<_, _> = [
            gpu(
                0,
                0x18,
                &["pci0000:00", "0000:00:01.0", "0000:17:00.0"],
                Some(0),
            ),
            gpu(1, 0x19, &["pci0000:00", "0000:00:02.0"], Some(0)),
            gpu(
                2,
                0x30,
                &["pci0000:00", "0000:00:01.0", "0000:17:00.0"],
                Some(0),
            ),
        ]
        .into();
        let all = ids(&["gpu0", "gpu1", "gpu2"]);
        assert_eq!(preferred(&gpus, &all, &[], 2), ids(&["gpu0", "gpu2"]));
        assert_eq!(
            preferred(&gpus, &all, &ids(&["gpu1"]), 2),
            ids(&["gpu0", "gpu1"])
        );
    }

    #[test]
    fn test_without_sysfs_paths_the_bus_numbers_decide() {
        // The simulated HGX board's first four buses.
        let gpus: BTreeMap<_, _> = [
            gpu(0, 0x18, &[], None),
            gpu(1, 0x2a, &[], None),
            gpu(2, 0x3a, &[], None),
            gpu(3, 0x5d, &[], None),
        ]
        .into();
        let all = ids(&["gpu0", "gpu1", "gpu2", "gpu3"]);
        assert_eq!(preferred(&gpus, &all, &[], 2), ids(&["gpu1", "gpu2"]));
        assert_eq!(
            preferred(&gpus, &all, &ids(&["gpu3"]), 2),
            ids(&["gpu2", "gpu3"])
        );
        assert_eq!(
            preferred(&gpus, &all, &[], 3),
            ids(&["gpu0", "gpu1", "gpu2"])
        );
    }

    #[test]
    fn test_unknown_ids_are_ignored_and_sizes_are_bounded() {
        let gpus: BTreeMap<_, _> = [gpu(0, 0x18, &[], None)].into();
        assert_eq!(
            preferred(&gpus, &ids(&["gpu0", "nope"]), &[], 5),
            ids(&["gpu0"])
        );
        assert!(preferred(&gpus, &ids(&["nope"]), &[], 1).is_empty());
        assert!(preferred(&gpus, &[], &[], 0).is_empty());
    }
}
