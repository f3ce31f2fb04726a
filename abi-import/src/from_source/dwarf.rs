//! A reader for the text that `readelf --debug-dump=info` prints: just the debugging entries
//! (DIEs) and the few attributes the layout extraction needs.

use std::collections::HashMap;

use anyhow::{Context, Result, bail};

#[derive(Debug, Default)]
pub(crate) struct Die {
    pub tag: String,
    pub name: Option<String>,
    pub ty: Option<u64>,
    pub byte_size: Option<u64>,
    pub member_location: Option<u64>,
    /// `DW_AT_upper_bound` + 1 or `DW_AT_count` of a subrange.
    pub count: Option<u64>,
    pub decl_file: Option<u64>,
    pub declaration: bool,
    pub bit_field: bool,
    pub children: Vec<usize>,
}

/// All DIEs of one object file, with `offset -> index`.
pub(crate) struct Dwarf {
    pub dies: Vec<Die>,
    by_offset: HashMap<u64, usize>,
    /// Indices of the top-level DIEs (children of the compile unit).
    pub top: Vec<usize>,
}

fn hex(s: &str) -> Option<u64> {
    u64::from_str_radix(s.trim().trim_start_matches("0x"), 16).ok()
}

fn number(s: &str) -> Option<u64> {
    let s = s.trim();
    let s = s.split_whitespace().next()?;
    if let Some(h) = s.strip_prefix("0x") {
        u64::from_str_radix(h, 16).ok()
    } else {
        s.parse().ok()
    }
}

impl Dwarf {
    pub(crate) fn parse(text: &str) -> Result<Dwarf> {
        let mut dies: Vec<Die> = Vec::new();
        let mut by_offset = HashMap::new();
        let mut top = Vec::new();
        // Stack of (depth, index) of the open DIEs.
        let mut stack: Vec<(u32, usize)> = Vec::new();
        let mut cur: Option<usize> = None;
        for line in text.lines() {
            let t = line.trim_start();
            if let Some(rest) = t.strip_prefix('<') {
                // " <1><1e>: Abbrev Number: 6 (DW_TAG_typedef)" or "    <1f>   DW_AT_name : ..."
                let Some((first, rest)) = rest.split_once('>') else {
                    continue;
                };
                if let Some(rest) = rest.strip_prefix('<') {
                    let depth: u32 = first.parse().context("DIE depth")?;
                    let (off, rest) = rest.split_once('>').context("DIE offset")?;
                    let off = hex(off).context("DIE offset")?;
                    let Some((_, tag)) = rest.split_once('(') else {
                        // "Abbrev Number: 0": end of a sibling list.
                        cur = None;
                        continue;
                    };
                    let tag = tag.trim_end_matches(')').to_owned();
                    while stack.last().is_some_and(|&(d, _)| d >= depth) {
                        stack.pop();
                    }
                    let idx = dies.len();
                    dies.push(Die {
                        tag,
                        ..Die::default()
                    });
                    by_offset.insert(off, idx);
                    match stack.last() {
                        Some(&(_, parent)) => {
                            dies[parent].children.push(idx);
                            if depth == 1 {
                                top.push(idx);
                            }
                        }
                        None if depth == 0 => {}
                        None => bail!("DIE at depth {depth} without parent"),
                    }
                    stack.push((depth, idx));
                    cur = Some(idx);
                } else if let Some(idx) = cur {
                    let rest = rest.trim_start();
                    let Some((attr, value)) = rest.split_once(':') else {
                        continue;
                    };
                    let attr = attr.trim();
                    let value = value.trim();
                    let die = &mut dies[idx];
                    match attr {
                        "DW_AT_name" => {
                            let v = if value.starts_with("(indirect") {
                                value.split_once("): ").map_or("", |x| x.1)
                            } else {
                                value
                            };
                            die.name = Some(v.trim().to_owned());
                        }
                        "DW_AT_type" => {
                            die.ty = value
                                .trim_start_matches('<')
                                .split('>')
                                .next()
                                .and_then(hex);
                        }
                        "DW_AT_byte_size" => die.byte_size = number(value),
                        "DW_AT_data_member_location" => die.member_location = number(value),
                        "DW_AT_upper_bound" => die.count = number(value).map(|u| u + 1),
                        "DW_AT_count" => die.count = number(value),
                        "DW_AT_decl_file" => die.decl_file = number(value),
                        "DW_AT_declaration" => die.declaration = true,
                        "DW_AT_bit_size" | "DW_AT_data_bit_offset" => die.bit_field = true,
                        _ => {}
                    }
                }
            }
        }
        Ok(Dwarf {
            dies,
            by_offset,
            top,
        })
    }

    pub(crate) fn ty(&self, die: usize) -> Option<usize> {
        self.dies[die]
            .ty
            .and_then(|o| self.by_offset.get(&o).copied())
    }
}

/// The file name table of `readelf --debug-dump=rawline`: file number -> full path.
pub(crate) fn file_table(text: &str) -> Result<HashMap<u64, String>> {
    let mut dirs: HashMap<u64, String> = HashMap::new();
    let mut files = HashMap::new();
    let mut section = 0;
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with("The Directory Table") {
            section = 1;
            continue;
        }
        if t.starts_with("The File Name Table") {
            section = 2;
            continue;
        }
        if t.is_empty() || t.starts_with("Entry") {
            continue;
        }
        if t.starts_with("Line Number Statements") || t.starts_with("No Line Number") {
            if section == 2 {
                break;
            }
            continue;
        }
        let name_of = |s: &str| -> String {
            if s.starts_with("(indirect") {
                s.split_once("): ").map_or("", |x| x.1).to_owned()
            } else {
                s.to_owned()
            }
        };
        let mut parts = t.splitn(2, char::is_whitespace);
        let Some(entry) = parts.next().and_then(|e| e.parse::<u64>().ok()) else {
            continue;
        };
        let rest = parts.next().unwrap_or("").trim();
        match section {
            1 => {
                dirs.insert(entry, name_of(rest));
            }
            2 => {
                let mut p = rest.splitn(2, char::is_whitespace);
                let dir: u64 = p.next().and_then(|d| d.parse().ok()).unwrap_or(0);
                let name = name_of(p.next().unwrap_or("").trim());
                let full = if name.starts_with('/') {
                    name
                } else {
                    format!("{}/{}", dirs.get(&dir).map_or("", String::as_str), name)
                };
                files.insert(entry, full);
            }
            _ => {}
        }
    }
    if files.is_empty() {
        bail!("no file name table in the line information");
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    const INFO: &str = " <0><c>: Abbrev Number: 96 (DW_TAG_compile_unit)
    <12>   DW_AT_name        : (indirect line string, offset: 0x5): /tmp/tu1.c
 <1><1e>: Abbrev Number: 6 (DW_TAG_typedef)
    <1f>   DW_AT_name        : (indirect string, offset: 0x148d5): S_T
    <23>   DW_AT_decl_file   : 1
    <26>   DW_AT_type        : <0x2a>
 <1><2a>: Abbrev Number: 7 (DW_TAG_structure_type)
    <2b>   DW_AT_byte_size   : 16
 <2><2c>: Abbrev Number: 8 (DW_TAG_member)
    <2d>   DW_AT_name        : a
    <30>   DW_AT_type        : <0x40>
    <34>   DW_AT_data_member_location: 8
 <2><38>: Abbrev Number: 0
 <1><40>: Abbrev Number: 59 (DW_TAG_base_type)
    <41>   DW_AT_byte_size   : 8
    <42>   DW_AT_name        : long unsigned int
";

    #[test]
    fn parses_dies() {
        let dw = Dwarf::parse(INFO).unwrap();
        assert_eq!(dw.top.len(), 3);
        let td = dw.top[0];
        assert_eq!(dw.dies[td].name.as_deref(), Some("S_T"));
        let s = dw.ty(td).unwrap();
        assert_eq!(dw.dies[s].byte_size, Some(16));
        let m = dw.dies[s].children[0];
        assert_eq!(dw.dies[m].member_location, Some(8));
        assert_eq!(dw.dies[dw.ty(m).unwrap()].byte_size, Some(8));
    }

    #[test]
    fn file_table() {
        let t = " The Directory Table (offset 0x22, lines 2, columns 1):
  Entry\tName
  0\t(indirect line string, offset: 0x10): /tmp
  1\t(indirect line string, offset: 0x1a): /src/inc

 The File Name Table (offset 0x81, lines 2, columns 2):
  Entry\tDir\tName
  0\t0\t(indirect line string, offset: 0x434): tu1.c
  1\t1\t(indirect line string, offset: 0x43a): nvtypes.h

 No Line Number Statements.
";
        let f = super::file_table(t).unwrap();
        assert_eq!(f[&1], "/src/inc/nvtypes.h");
    }
}
