//! Struct layouts from the compiler's debugging information: the member list of every struct
//! or union typedef, its pointers and its file-descriptor members. Sizes and alignments are
//! checked against (and alignments taken from) a generated C program; see `super::cc`.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{Result, bail};
use serde_json::{Value, json};

use super::dwarf::Dwarf;

/// Arrays whose elements hold pointers are listed element by element when that gives at most
/// this many entries; otherwise only element 0 is listed, with a `stride`.
const EXPAND_POINTERS_MAX: u64 = 8;

pub(crate) struct Layout {
    pub size: u64,
    pub fields: Vec<(String, u64, u64)>,
    pub header: String,
    pub pointers: Vec<(String, u64, String)>,
    pub fds: Vec<(String, u64, u64)>,
}

impl Layout {
    pub(crate) fn to_json(&self, align: u64) -> Value {
        let mut v = json!({
            "size": self.size,
            "align": align,
            "fields": self.fields.iter().map(|(n, o, s)| json!([n, o, s])).collect::<Vec<_>>(),
            "header": self.header,
        });
        if !self.pointers.is_empty() {
            v["pointers"] = self
                .pointers
                .iter()
                .map(|(n, o, k)| json!([n, o, k]))
                .collect();
        }
        if !self.fds.is_empty() {
            v["fds"] = self.fds.iter().map(|(n, o, s)| json!([n, o, s])).collect();
        }
        v
    }
}

fn is_cv(tag: &str) -> bool {
    matches!(
        tag,
        "DW_TAG_const_type"
            | "DW_TAG_volatile_type"
            | "DW_TAG_restrict_type"
            | "DW_TAG_atomic_type"
    )
}

fn is_record(tag: &str) -> bool {
    matches!(tag, "DW_TAG_structure_type" | "DW_TAG_union_type")
}

pub(crate) struct Types<'a> {
    pub dw: &'a Dwarf,
}

impl Types<'_> {
    fn strip_cv(&self, mut i: usize) -> usize {
        while is_cv(&self.dw.dies[i].tag) {
            match self.dw.ty(i) {
                Some(t) => i = t,
                None => break,
            }
        }
        i
    }

    /// Strips qualifiers and typedefs.
    pub(crate) fn resolve(&self, mut i: usize) -> usize {
        loop {
            let d = &self.dw.dies[i];
            if is_cv(&d.tag) || d.tag == "DW_TAG_typedef" {
                match self.dw.ty(i) {
                    Some(t) => i = t,
                    None => return i,
                }
            } else {
                return i;
            }
        }
    }

    fn dims(&self, arr: usize) -> Vec<Option<u64>> {
        self.dw.dies[arr]
            .children
            .iter()
            .filter(|&&c| self.dw.dies[c].tag == "DW_TAG_subrange_type")
            .map(|&c| self.dw.dies[c].count)
            .collect()
    }

    pub(crate) fn size_of(&self, i: usize) -> u64 {
        let r = self.resolve(i);
        let d = &self.dw.dies[r];
        if d.tag == "DW_TAG_array_type" {
            let elem = self.dw.ty(r).map_or(0, |e| self.size_of(e));
            self.dims(r).iter().map(|c| c.unwrap_or(0)).product::<u64>() * elem
        } else {
            d.byte_size.unwrap_or(0)
        }
    }

    fn unnamed_record(&self, i: usize) -> Option<usize> {
        let t = self.strip_cv(i);
        let d = &self.dw.dies[t];
        (is_record(&d.tag) && d.name.is_none()).then_some(t)
    }

    /// `[name, offset, size]` of the members of record `rec`, as described in the README.
    pub(crate) fn fields(
        &self,
        rec: usize,
        prefix: &str,
        base: u64,
        out: &mut Vec<(String, u64, u64)>,
    ) -> Result<()> {
        for &m in &self.dw.dies[rec].children {
            let md = &self.dw.dies[m];
            if md.tag != "DW_TAG_member" {
                continue;
            }
            if md.bit_field {
                bail!("bit-field member in a struct");
            }
            let off = base + md.member_location.unwrap_or(0);
            let Some(mt) = self.dw.ty(m) else { continue };
            match &md.name {
                None => {
                    let t = self.resolve(mt);
                    self.fields(t, prefix, off, out)?;
                }
                Some(name) => {
                    let path = format!("{prefix}{name}");
                    out.push((path.clone(), off, self.size_of(mt)));
                    if let Some(r) = self.unnamed_record(mt) {
                        self.fields(r, &format!("{path}."), off, out)?;
                    } else {
                        let t = self.strip_cv(mt);
                        if self.dw.dies[t].tag == "DW_TAG_array_type"
                            && let Some(r) = self.dw.ty(t).and_then(|e| self.unnamed_record(e))
                        {
                            let n = self.dims(t).len();
                            self.fields(r, &format!("{path}{}.", "[0]".repeat(n)), off, out)?;
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Pointers inside an object of type `i` at `off`, named from `path` ("" for the outer
    /// struct itself).
    pub(crate) fn pointers(
        &self,
        i: usize,
        path: &str,
        off: u64,
        out: &mut Vec<(String, u64, String)>,
    ) {
        let mut t = i;
        loop {
            let d = &self.dw.dies[t];
            if d.tag == "DW_TAG_typedef" && d.name.as_deref() == Some("NvP64") {
                out.push((path.to_owned(), off, "NvP64".to_owned()));
                return;
            }
            if d.tag == "DW_TAG_typedef" || is_cv(&d.tag) {
                match self.dw.ty(t) {
                    Some(n) => t = n,
                    None => return,
                }
            } else {
                break;
            }
        }
        let d = &self.dw.dies[t];
        match d.tag.as_str() {
            "DW_TAG_pointer_type" => out.push((path.to_owned(), off, "ptr".to_owned())),
            "DW_TAG_structure_type" | "DW_TAG_union_type" => {
                for &m in &d.children {
                    let md = &self.dw.dies[m];
                    if md.tag != "DW_TAG_member" {
                        continue;
                    }
                    let Some(mt) = self.dw.ty(m) else { continue };
                    let moff = off + md.member_location.unwrap_or(0);
                    match &md.name {
                        None => self.pointers(mt, path, moff, out),
                        Some(n) if path.is_empty() => self.pointers(mt, n, moff, out),
                        Some(n) => self.pointers(mt, &format!("{path}.{n}"), moff, out),
                    }
                }
            }
            "DW_TAG_array_type" => {
                let Some(elem) = self.dw.ty(t) else { return };
                let dims = self.dims(t);
                self.array_pointers(elem, &dims, path, off, out);
            }
            _ => {}
        }
    }

    fn array_pointers(
        &self,
        elem: usize,
        dims: &[Option<u64>],
        path: &str,
        off: u64,
        out: &mut Vec<(String, u64, String)>,
    ) {
        let Some((&first, rest)) = dims.split_first() else {
            self.pointers(elem, path, off, out);
            return;
        };
        let n = first.unwrap_or(0);
        if n == 0 {
            return;
        }
        let stride = rest.iter().map(|c| c.unwrap_or(0)).product::<u64>() * self.size_of(elem);
        let mut sub = Vec::new();
        self.array_pointers(elem, rest, "", 0, &mut sub);
        if sub.is_empty() {
            return;
        }
        let join = |idx: &str, p: &str| {
            if p.is_empty() {
                format!("{path}[{idx}]")
            } else if p.starts_with('[') {
                format!("{path}[{idx}]{p}")
            } else {
                format!("{path}[{idx}].{p}")
            }
        };
        if n * sub.len() as u64 <= EXPAND_POINTERS_MAX {
            for k in 0..n {
                for (p, o, kind) in &sub {
                    out.push((join(&k.to_string(), p), off + k * stride + o, kind.clone()));
                }
            }
        } else {
            for (p, o, kind) in &sub {
                out.push((
                    join(&format!("0..{}", n - 1), p),
                    off + o,
                    format!("{kind} stride {stride}"),
                ));
            }
        }
    }

    /// Integer members named like file descriptors, at any depth of nested structs and unions
    /// (`params.fd` for a member `params` of a named struct type; anonymous members' fds by
    /// their own names, as C spells them).
    pub(crate) fn fds(&self, rec: usize, base: u64, out: &mut Vec<(String, u64, u64)>) {
        self.fds_in(rec, base, "", out);
    }

    fn fds_in(&self, rec: usize, base: u64, prefix: &str, out: &mut Vec<(String, u64, u64)>) {
        for &m in &self.dw.dies[rec].children {
            let md = &self.dw.dies[m];
            if md.tag != "DW_TAG_member" {
                continue;
            }
            let Some(mt) = self.dw.ty(m) else { continue };
            let off = base + md.member_location.unwrap_or(0);
            let Some(name) = &md.name else {
                let r = self.resolve(mt);
                if is_record(&self.dw.dies[r].tag) {
                    self.fds_in(r, off, prefix, out);
                }
                continue;
            };
            let r = self.resolve(mt);
            let rd = &self.dw.dies[r];
            if is_record(&rd.tag) {
                self.fds_in(r, off, &format!("{prefix}{name}."), out);
                continue;
            }
            let int = matches!(
                rd.tag.as_str(),
                "DW_TAG_base_type" | "DW_TAG_enumeration_type"
            );
            let size = rd.byte_size.unwrap_or(0);
            if int && size >= 4 && fd_name(name) {
                out.push((format!("{prefix}{name}"), off, size));
            }
        }
    }
}

/// `fd`, `ctl_fd`, `rmCtrlFd`, `uvmFd`, …
fn fd_name(name: &str) -> bool {
    name == "fd" || name.ends_with("_fd") || name.ends_with("Fd")
}

/// Every typedef (at file scope) naming a complete struct or union, directly or through other
/// typedefs: name -> (typedef DIE, record DIE). `header_of` maps a typedef to its header path
/// relative to the tree, or `None` for files outside it.
pub(crate) fn record_typedefs(
    dw: &Dwarf,
    header_of: &dyn Fn(usize) -> Option<String>,
) -> BTreeMap<String, (usize, usize, String)> {
    let types = Types { dw };
    let mut out = BTreeMap::new();
    for &i in &dw.top {
        let d = &dw.dies[i];
        if d.tag != "DW_TAG_typedef" {
            continue;
        }
        let Some(name) = &d.name else { continue };
        let Some(t) = dw.ty(i) else { continue };
        let r = types.resolve(t);
        let rd = &dw.dies[r];
        if !is_record(&rd.tag) || rd.declaration {
            continue;
        }
        let Some(h) = header_of(i) else { continue };
        out.insert(name.clone(), (i, r, h));
    }
    out
}

/// Named record types reachable from `roots` through members (including arrays), by typedef name.
pub(crate) fn reachable(dw: &Dwarf, roots: &[usize]) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut names = BTreeSet::new();
    let mut stack: Vec<usize> = roots.to_vec();
    while let Some(i) = stack.pop() {
        if !seen.insert(i) {
            continue;
        }
        let d = &dw.dies[i];
        if d.tag == "DW_TAG_typedef"
            && let Some(n) = &d.name
        {
            names.insert(n.clone());
        }
        if let Some(t) = dw.ty(i) {
            stack.push(t);
        }
        if is_record(&d.tag) {
            stack.extend(d.children.iter().copied());
        }
    }
    names
}

pub(crate) fn layout(dw: &Dwarf, rec: usize, header: String) -> Result<Layout> {
    let types = Types { dw };
    let mut fields = Vec::new();
    types.fields(rec, "", 0, &mut fields)?;
    let mut pointers = Vec::new();
    types.pointers(rec, "", 0, &mut pointers);
    let mut fds = Vec::new();
    types.fds(rec, 0, &mut fds);
    Ok(Layout {
        size: dw.dies[rec].byte_size.unwrap_or(0),
        fields,
        header,
        pointers,
        fds,
    })
}
