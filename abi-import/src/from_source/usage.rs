//! Facts about how the kernel uses the structs, parsed from the kernel sources named in
//! `abi-facts/README.md`: the escape handlers (`escape.c`, `osapi.c`, `nv.c`), the resource
//! table (`resource_list.h`), the NVOC exported-method tables (`generated/g_*_nvoc.c`) and the
//! embedded-pointer copy table (`embedded_param_copy.c`).
//!
//! The parsers are deliberately simple text scanners (comments stripped, balanced braces and
//! parentheses); they fail with an error rather than guess when a file is missing.

use std::collections::{BTreeMap, BTreeSet, HashMap, btree_map};

use anyhow::{Context, Result};
use serde_json::{Map, Value, json};

use super::numbers::{Numbers, code, literal, num_json};
use super::source_tree::Tree;

pub(crate) struct Usage {
    pub escape_params: Value,
    pub escape_size_check: Value,
    pub uvm_ioctl_params: Value,
    pub class_alloc_params: Value,
    pub control_params: Map<String, Value>,
    pub control_params_inferred: Value,
    pub control_flags: Value,
    pub unnamed_control_methods: Value,
    pub embedded: Map<String, Value>,
    pub unresolved: Map<String, Value>,
}

/// Removes `/* */` and `//` comments (string literals are not special-cased; the parsed files
/// have no comment markers inside strings that matter here).
pub(crate) fn strip_comments(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let mut start = 0;
    let mut in_str = false;
    while i < b.len() {
        if in_str {
            if b[i] == b'\\' {
                i += 2;
                continue;
            }
            if b[i] == b'"' || b[i] == b'\n' {
                in_str = false;
            }
            i += 1;
            continue;
        }
        if b[i] == b'"' {
            in_str = true;
            i += 1;
            continue;
        }
        if b[i] == b'/' && i + 1 < b.len() && (b[i + 1] == b'*' || b[i + 1] == b'/') {
            out.push_str(&text[start..i]);
            if b[i + 1] == b'*' {
                let end = text[i + 2..].find("*/").map_or(b.len(), |e| i + 2 + e + 2);
                // keep line structure
                out.extend(text[i..end].chars().filter(|&c| c == '\n'));
                i = end;
            } else {
                let end = text[i..].find('\n').map_or(b.len(), |e| i + e);
                i = end;
            }
            start = i;
            continue;
        }
        i += 1;
    }
    out.push_str(&text[start..]);
    out
}

/// The text between the bracket at or after `from` (`open`) and its match, exclusive.
fn balanced(text: &str, from: usize, open: u8, close: u8) -> Option<(usize, usize)> {
    let b = text.as_bytes();
    let s = from + text[from..].find(open as char)?;
    let mut depth = 0usize;
    for (k, &c) in b.iter().enumerate().skip(s) {
        if c == open {
            depth += 1;
        } else if c == close {
            depth -= 1;
            if depth == 0 {
                return Some((s + 1, k));
            }
        }
    }
    None
}

/// Splits at top-level commas.
fn split_args(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut cur = String::new();
    for c in s.chars() {
        match c {
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => depth -= 1,
            ',' if depth == 0 => {
                out.push(cur.trim().to_owned());
                cur.clear();
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    if !cur.trim().is_empty() {
        out.push(cur.trim().to_owned());
    }
    out
}

fn ident_at(text: &str, at: usize) -> &str {
    let rest = &text[at..];
    let end = rest
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(rest.len());
    &rest[..end]
}

fn squash(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join("")
}

fn base_size(t: &str) -> Option<u64> {
    Some(match t {
        "NvU8" | "NvS8" | "NvBool" | "char" | "NvV8" => 1,
        "NvU16" | "NvS16" | "NvV16" => 2,
        "NvU32" | "NvS32" | "NvV32" | "NvHandle" | "int" | "NvF32" => 4,
        "NvU64" | "NvS64" | "NvP64" | "NvUPtr" | "NvLength" | "NvF64" => 8,
        _ => return None,
    })
}

// ---------------------------------------------------------------- escapes

/// One handler segment: the escapes it handles and its body.
struct Segment {
    names: Vec<String>,
    body: String,
}

fn segments(text: &str, escapes: &BTreeSet<&str>) -> Vec<Segment> {
    let mut out: Vec<Segment> = Vec::new();
    let mut pos = 0;
    while let Some(k) = text[pos..].find("NV_ESC_") {
        let at = pos + k;
        pos = at + 7;
        let name = ident_at(text, at);
        if !escapes.contains(name) {
            continue;
        }
        let before = text[..at].trim_end();
        let after = text[at + name.len()..].trim_start();
        let is_case = before.ends_with("case") && after.starts_with(':');
        let is_if = before.ends_with("==") && {
            let line_start = text[..at].rfind('\n').map_or(0, |x| x + 1);
            text[line_start..at].trim_start().starts_with("if")
        };
        if !(is_case || is_if) {
            continue;
        }
        // Labels that fall through into the same block.
        let open = match text[at..].find('{') {
            Some(o) => at + o,
            None => continue,
        };
        let between = &text[at + name.len()..open];
        if is_case && between.contains("case ") {
            // another label follows; it shares the block with this one
            let mut names = vec![name.to_owned()];
            let mut p = at + name.len();
            while let Some(c) = text[p..open].find("NV_ESC_") {
                let n = ident_at(text, p + c);
                names.push(n.to_owned());
                p = p + c + n.len();
            }
            if let Some((s, e)) = balanced(text, open, b'{', b'}') {
                out.push(Segment {
                    names,
                    body: text[s..e].to_owned(),
                });
                pos = e;
            }
            continue;
        }
        if let Some((s, e)) = balanced(text, open, b'{', b'}') {
            if is_case
                && !text[at + name.len()..open]
                    .trim()
                    .trim_start_matches(':')
                    .trim()
                    .is_empty()
            {
                // `case X:` without a braced block: take the text up to the next `case`/`default`.
                let rest = &text[at + name.len() + 1..];
                let end = ["case ", "default:"]
                    .iter()
                    .filter_map(|m| rest.find(m))
                    .min()
                    .unwrap_or(rest.len());
                out.push(Segment {
                    names: vec![name.to_owned()],
                    body: rest[..end].to_owned(),
                });
                continue;
            }
            out.push(Segment {
                names: vec![name.to_owned()],
                body: text[s..e].to_owned(),
            });
            pos = e;
        }
    }
    out
}

/// `TYPE *var` and `TYPE var` declarations of known types, in order.
fn declarations(body: &str, known: &dyn Fn(&str) -> bool) -> Vec<(String, String, bool)> {
    let mut out = Vec::new();
    let toks: Vec<&str> = body
        .split(|c: char| c.is_whitespace())
        .filter(|t| !t.is_empty())
        .collect();
    for w in toks.windows(2) {
        let ty = w[0];
        if !known(ty) {
            continue;
        }
        let v = w[1];
        let (ptr, v) = match v.strip_prefix('*') {
            Some(r) => (true, r),
            None => (false, v),
        };
        let name: String = v
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if !name.is_empty() {
            out.push((ty.to_owned(), name, ptr));
        }
    }
    out
}

/// (payload types, size check) of one handler body.
fn analyse(body: &str, known: &dyn Fn(&str) -> bool) -> (Vec<String>, Option<&'static str>) {
    let decls = declarations(body, known);
    let type_of = |v: &str| decls.iter().find(|d| d.1 == v).map(|d| d.0.clone());
    let mut checked: Vec<(String, &'static str)> = Vec::new();
    let mut pos = 0;
    while let Some(k) = body[pos..].find("sizeof") {
        let at = pos + k;
        pos = at + 6;
        let Some((s, e)) = balanced(body, at, b'(', b')') else {
            break;
        };
        if !body[at + 6..s - 1].trim().is_empty() {
            continue;
        }
        let arg = body[s..e].trim();
        let ty = if let Some(v) = arg.strip_prefix('*') {
            type_of(v.trim())
        } else if known(arg) {
            Some(arg.to_owned())
        } else {
            type_of(arg)
        };
        let Some(ty) = ty else { continue };
        // The comparison the sizeof takes part in, within its statement.
        let stmt_start = body[..at].rfind([';', '{', '}']).map_or(0, |x| x + 1);
        let before = &body[stmt_start..at];
        if !(before.contains("dataSize") || before.contains("arg_size") || before.contains("Size"))
        {
            continue;
        }
        let op = before.trim_end();
        let kind = if op.ends_with("!=") || op.ends_with("==") {
            "exact"
        } else if op.ends_with('<') || op.ends_with(">=") {
            "min"
        } else if op.ends_with('/') || op.ends_with('%') {
            "array"
        } else {
            continue;
        };
        checked.push((ty, kind));
    }
    if !checked.is_empty() {
        let kind = checked[0].1;
        let mut types: Vec<String> = Vec::new();
        // Declaration order first (pointers the payload is read through), then the rest.
        for d in &decls {
            if checked.iter().any(|c| c.0 == d.0) && !types.contains(&d.0) {
                types.push(d.0.clone());
            }
        }
        for c in &checked {
            if !types.contains(&c.0) {
                types.push(c.0.clone());
            }
        }
        let types = types
            .into_iter()
            .map(|t| {
                if kind == "array" && base_size(&t).is_some() {
                    format!("{t}[]")
                } else {
                    t
                }
            })
            .collect();
        return (types, Some(kind));
    }
    let payload: Vec<String> = decls
        .iter()
        .filter(|d| d.2 && base_size(&d.0).is_none())
        .filter(|d| {
            let pat = format!("{} = ", d.1);
            body.find(&pat).is_some_and(|p| {
                let rhs = ident_at(body, p + pat.len());
                matches!(rhs, "data" | "arg_copy" | "pData")
            }) || body.contains(&format!("*{} = data", d.1))
                || body.contains(&format!("*{} = arg_copy", d.1))
                || body.contains(&format!("*{} = pData", d.1))
        })
        .map(|d| d.0.clone())
        .collect();
    (payload, if decls.is_empty() { None } else { Some("none") })
}

/// Function bodies of a file, by name.
fn functions(text: &str) -> HashMap<String, String> {
    let mut out = HashMap::new();
    for (i, line) in text.lines().enumerate() {
        let _ = i;
        let t = line.trim_end();
        if line.starts_with([' ', '\t', '#', '{', '}']) || !t.contains('(') || t.ends_with(';') {
            continue;
        }
        let head = &t[..t.find('(').unwrap_or(0)];
        let Some(name) = head.split_whitespace().last() else {
            continue;
        };
        let name = name.trim_start_matches('*');
        let off = line.as_ptr() as usize - text.as_ptr() as usize;
        if let Some((s, e)) = balanced(text, off, b'{', b'}') {
            // the brace must follow the parameter list directly
            if let Some((_, pe)) = balanced(text, off, b'(', b')')
                && text[pe + 1..s - 1].trim().is_empty()
            {
                out.insert(name.to_owned(), text[s..e].to_owned());
            }
        }
    }
    out
}

/// Analyses the functions `body` passes the payload (`arg_copy`, `pData`, `data`) to.
fn follow(
    body: &str,
    funcs: &HashMap<String, String>,
    known: &dyn Fn(&str) -> bool,
    depth: u32,
) -> Option<(Vec<String>, Option<&'static str>)> {
    if depth == 0 {
        return None;
    }
    let mut pos = 0;
    while let Some(k) = body[pos..].find('(') {
        let at = pos + k;
        pos = at + 1;
        let start = body[..at]
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .map_or(0, |x| x + 1);
        let f = &body[start..at];
        let Some((s, e)) = balanced(body, at, b'(', b')') else {
            continue;
        };
        let args = split_args(&body[s..e]);
        if !args
            .iter()
            .any(|a| matches!(a.as_str(), "arg_copy" | "pData" | "data"))
        {
            continue;
        }
        if let Some(fb) = funcs.get(f) {
            let (t2, k2) = analyse(fb, known);
            if !t2.is_empty() {
                return Some((t2, k2));
            }
            if let Some(r) = follow(fb, funcs, known, depth - 1) {
                return Some(r);
            }
        }
    }
    None
}

fn escapes(
    tree: &Tree,
    nums: &Numbers,
    structs: &BTreeMap<String, Value>,
) -> Result<(Value, Value)> {
    let names: BTreeSet<&str> = nums.escapes.iter().map(|(n, _)| n.as_str()).collect();
    let known = |t: &str| structs.contains_key(t) || t == "NvU32";
    let files = [
        "src/nvidia/arch/nvalloc/unix/src/escape.c",
        "src/nvidia/arch/nvalloc/unix/src/osapi.c",
        "kernel-open/nvidia/nv.c",
    ];
    let mut texts = Vec::new();
    for f in files {
        texts.push(strip_comments(&tree.read(f)?));
    }
    let mut funcs = HashMap::new();
    for t in &texts {
        funcs.extend(functions(t));
    }
    // Size-validation tables (`_NV_IOCTL_ENTRY(NV_ESC_X, type, isArray)`, 595 and later) are
    // checked before any handler runs, so they decide the size check.
    let mut table: BTreeMap<String, (String, bool)> = BTreeMap::new();
    for t in &texts {
        let mut pos = 0;
        while let Some(k) = t[pos..].find("_IOCTL_ENTRY(") {
            let at = pos + k;
            pos = at + 13;
            let Some((s, e)) = balanced(t, at, b'(', b')') else {
                break;
            };
            let args = split_args(&t[s..e]);
            if args.len() < 2 || !names.contains(args[0].as_str()) {
                continue;
            }
            let array = args.get(2).is_some_and(|a| a == "NV_TRUE");
            table
                .entry(args[0].clone())
                .or_insert((args[1].clone(), array));
        }
    }
    let mut params = Map::new();
    let mut checks = Map::new();
    for t in &texts {
        for seg in segments(t, &names) {
            let (mut types, mut kind) = analyse(&seg.body, &known);
            if types.is_empty() {
                // The handler passes the payload on: look into the functions it calls.
                if let Some((t2, k2)) = follow(&seg.body, &funcs, &known, 3) {
                    types = t2;
                    kind = k2;
                }
            }
            if types.is_empty() {
                continue;
            }
            for n in &seg.names {
                if params.contains_key(n) {
                    continue;
                }
                params.insert(n.clone(), json!(types));
                checks.insert(n.clone(), json!(kind.unwrap_or("none")));
            }
        }
    }
    for (n, (ty, array)) in table {
        let kind = if array { "array" } else { "exact" };
        let ty = if array && base_size(&ty).is_some() {
            format!("{ty}[]")
        } else {
            ty
        };
        params.entry(n.clone()).or_insert_with(|| json!([ty]));
        checks.insert(n, json!(kind));
    }
    Ok((Value::Object(params), Value::Object(checks)))
}

// ---------------------------------------------------------------- classes

fn class_alloc(tree: &Tree, nums: &Numbers) -> Result<Value> {
    let file = "src/nvidia/src/kernel/rmapi/resource_list.h";
    let text = strip_comments(&tree.read(file)?);
    let classes: BTreeSet<&str> = nums.classes.iter().map(|(n, _)| n.as_str()).collect();
    let mut out = Map::new();
    let mut pos = 0;
    while let Some(k) = text[pos..].find("RS_ENTRY(") {
        let at = pos + k;
        let Some((s, e)) = balanced(&text, at, b'(', b')') else {
            break;
        };
        pos = e;
        let body: String = text[s..e]
            .lines()
            .filter(|l| !l.trim_start().starts_with('#'))
            .collect::<Vec<_>>()
            .join("\n");
        let args = split_args(&body);
        if args.len() < 7 {
            continue;
        }
        let class = args[0].trim();
        if !classes.contains(class) || out.contains_key(class) {
            continue;
        }
        let ap = squash(&args[4]);
        let (params, required) = if let Some(t) = ap.strip_prefix("RS_REQUIRED(") {
            (json!(t.trim_end_matches(')')), true)
        } else if let Some(t) = ap.strip_prefix("RS_OPTIONAL(") {
            (json!(t.trim_end_matches(')')), false)
        } else {
            (Value::Null, false)
        };
        let flags: BTreeSet<String> = args[6].split('|').map(|f| f.trim().to_owned()).collect();
        out.insert(
            class.to_owned(),
            json!({
                "params": params,
                "required": required,
                "non_privileged": flags.contains("RS_FLAGS_ALLOC_NON_PRIVILEGED"),
                "privileged": flags.contains("RS_FLAGS_ALLOC_PRIVILEGED"),
                "kernel_privileged": flags.contains("RS_FLAGS_ALLOC_KERNEL_PRIVILEGED"),
            }),
        );
    }
    Ok(Value::Object(out))
}

// ---------------------------------------------------------------- NVOC tables

struct Method {
    id: i128,
    params: Option<String>,
    flags: i128,
}

fn nvoc_methods(tree: &Tree) -> Result<Vec<Method>> {
    let dir = "src/nvidia/generated";
    let mut out = Vec::new();
    for f in tree.list(dir, "g_", "_nvoc.c")? {
        let text = tree.read(&f)?;
        let mut pos = 0;
        while let Some(k) = text[pos..].find("/*flags=*/") {
            let at = pos + k;
            pos = at + 10;
            let field = |key: &str| -> Option<String> {
                let p = at + text[at..].find(key)?;
                let v = &text[p + key.len()..];
                let end = v.find(",\n").or_else(|| v.find('\n'))?;
                Some(v[..end].trim().trim_end_matches(',').trim().to_owned())
            };
            let flags = field("/*flags=*/").and_then(|v| literal(&v));
            let id = field("/*methodId=*/").and_then(|v| literal(&v));
            let size = field("/*paramSize=*/");
            let (Some(flags), Some(id), Some(size)) = (flags, id, size) else {
                continue;
            };
            let params = size
                .strip_prefix("sizeof(")
                .map(|s| s.trim_end_matches(')').trim().to_owned());
            out.push(Method { id, params, flags });
        }
    }
    Ok(out)
}

// ---------------------------------------------------------------- embedded pointers

fn member_of(arg: &str) -> Option<String> {
    let a = squash(arg);
    let p = a.rfind("->")?;
    Some(a[p + 2..].to_owned())
}

fn field_offset(structs: &BTreeMap<String, Value>, s: &str, path: &str) -> Option<u64> {
    structs.get(s)?["fields"]
        .as_array()?
        .iter()
        .find(|f| f[0].as_str() == Some(path))
        .and_then(|f| f[1].as_u64())
}

fn embedded(
    tree: &Tree,
    nums: &Numbers,
    structs: &BTreeMap<String, Value>,
) -> Result<Map<String, Value>> {
    let file = "src/nvidia/src/kernel/rmapi/embedded_param_copy.c";
    let raw = strip_comments(&tree.read(file)?);
    let funcs = functions(&raw);
    let body = funcs
        .get("embeddedParamCopyIn")
        .context("embedded_param_copy.c has no embeddedParamCopyIn")?;
    let controls: HashMap<&str, i128> = nums
        .controls
        .iter()
        .map(|(n, v)| (n.as_str(), *v))
        .collect();
    let mut out = Map::new();
    let mut pos = 0;
    while let Some(k) = body[pos..].find("case ") {
        let at = pos + k;
        pos = at + 5;
        let name = ident_at(body, at + 5);
        // Cases of commands the SDK headers do not define (guarded by `#ifdef NAME`) are kept,
        // without `cmd`.
        let cmd = controls.get(name).copied();
        let Some((s, e)) = balanced(body, at, b'{', b'}') else {
            continue;
        };
        let block = &body[s..e];
        // #ifdef around the case?
        let mut only_if = None;
        let mut depth_ifdef: Vec<String> = Vec::new();
        for l in body[..at].lines() {
            let t = l.trim();
            if let Some(c) = t.strip_prefix("#ifdef") {
                depth_ifdef.push(c.trim().to_owned());
            } else if t.starts_with("#if") {
                depth_ifdef.push(String::new());
            } else if t.starts_with("#endif") {
                depth_ifdef.pop();
            }
        }
        if let Some(c) = depth_ifdef.iter().rev().find(|c| !c.is_empty()) {
            only_if = Some(c.clone());
        }
        let params = block.find("CHECK_PARAMS_OR_RETURN(").and_then(|p| {
            let (a, b) = balanced(block, p, b'(', b')')?;
            split_args(&block[a..b]).get(1).cloned()
        });
        let Some(params) = params else { continue };
        let mut copies: Vec<Value> = Vec::new();
        let mut p = 0;
        while let Some(k) = block[p..].find("RMAPI_PARAM_COPY_INIT(") {
            let at2 = p + k;
            let Some((a, b)) = balanced(block, at2, b'(', b')') else {
                break;
            };
            p = b;
            let args = split_args(&block[a..b]);
            if args.len() < 5 {
                continue;
            }
            let index: u64 = squash(&args[0])
                .trim_start_matches("paramCopies[")
                .trim_end_matches(']')
                .parse()
                .unwrap_or(copies.len() as u64);
            let ptr = member_of(&args[1]).unwrap_or_else(|| squash(&args[1]));
            let count = match member_of(&args[3]) {
                Some(m) => json!(m),
                None => match literal(&code(&args[3])) {
                    Some(v) => num_json(v)?,
                    None => json!(squash(&args[3])),
                },
            };
            let es = squash(&args[4]);
            let mut c = Map::new();
            c.insert("index".into(), json!(index));
            c.insert("ptr".into(), json!(ptr));
            c.insert("count".into(), count);
            if let Some(t) = es.strip_prefix("sizeof(").map(|t| t.trim_end_matches(')')) {
                let size = base_size(t).or_else(|| structs.get(t).and_then(|s| s["size"].as_u64()));
                c.insert("elem_size".into(), json!(size));
                c.insert("elem_type".into(), json!(t));
            } else if let Some(v) = literal(&es) {
                c.insert("elem_size".into(), num_json(v)?);
            } else {
                c.insert("elem_size".into(), json!(es));
            }
            let flag_of = |f: &str| {
                squash(block).contains(&format!(
                    "paramCopies[{index}].flags|=RMAPI_PARAM_COPY_FLAGS_{f}"
                ))
            };
            c.insert("copy_in".into(), json!(!flag_of("SKIP_COPYIN")));
            c.insert("copy_out".into(), json!(!flag_of("SKIP_COPYOUT")));
            if flag_of("ZERO_BUFFER") {
                c.insert("zero_buffer".into(), json!(true));
            }
            let sq = squash(block);
            let pat = format!("paramCopies[{index}].flags|=RMAPI_PARAM_COPY_FLAGS_");
            let mut other = Vec::new();
            let mut q = 0;
            while let Some(k) = sq[q..].find(&pat) {
                let f = ident_at(&sq, q + k + pat.len());
                if !matches!(f, "SKIP_COPYIN" | "SKIP_COPYOUT" | "ZERO_BUFFER")
                    && !other.contains(&f.to_owned())
                {
                    other.push(f.to_owned());
                }
                q = q + k + pat.len();
            }
            if !other.is_empty() {
                c.insert("other_flags".into(), json!(other));
            }
            if let Some(o) = field_offset(structs, &params, &ptr) {
                c.insert("ptr_offset".into(), json!(o));
            }
            copies.push(Value::Object(c));
        }
        let mut entry = Map::new();
        entry.insert("params".into(), json!(params));
        if copies.is_empty() && block.contains("i2cTransactionCopyIn") {
            // The I2C transaction helper picks the union member from transType.
            entry.insert(
                "special".into(),
                json!("pointer location depends on transType (i2c transaction union)"),
            );
        }
        entry.insert("copies".into(), Value::Array(copies));
        if let Some(c) = only_if {
            entry.insert("only_if".into(), json!(c));
        }
        if let Some(cmd) = cmd {
            entry.insert("cmd".into(), num_json(cmd)?);
        }
        out.insert(name.to_owned(), Value::Object(entry));
    }
    Ok(out)
}

pub(crate) fn parse(
    tree: &Tree,
    nums: &Numbers,
    structs: &BTreeMap<String, Value>,
) -> Result<Usage> {
    let mut uvm_ioctl_params = Map::new();
    for (n, _) in &nums.uvm_ioctls {
        let p = format!("{n}_PARAMS");
        uvm_ioctl_params.insert(
            n.clone(),
            if structs.contains_key(&p) {
                json!(p)
            } else {
                Value::Null
            },
        );
    }
    let (escape_params, escape_size_check) = escapes(tree, nums, structs)?;
    let class_alloc_params = class_alloc(tree, nums)?;

    // Controls: NVOC tables first, then the FINN message-id link, then the naming convention.
    let methods = nvoc_methods(tree)?;
    let mut by_id: HashMap<i128, &Method> = HashMap::new();
    for m in &methods {
        by_id.entry(m.id).or_insert(m);
    }
    let mut control_params = Map::new();
    let mut inferred = Map::new();
    let mut flags = Map::new();
    let values: BTreeSet<i128> = nums.controls.iter().map(|(_, v)| *v).collect();
    for (n, v) in &nums.controls {
        if let Some(m) = by_id.get(v) {
            control_params.insert(n.clone(), json!(m.params));
            flags.insert(n.clone(), num_json(m.flags)?);
            continue;
        }
        let finn = nums.sdk_defines.get(n).and_then(|d| {
            let b = &d.body;
            let p = b.find("finn: Evaluated from")?;
            let q = b[p..].find("_MESSAGE_ID")? + p;
            let start = b[..q].rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))? + 1;
            // Only the usual form `(… << 8) | X_MESSAGE_ID` is read as a link, as in the
            // reference files (NV0050's `(… << 8 | X_MESSAGE_ID)` before 550 is not).
            if !b[..start]
                .trim_end()
                .strip_suffix('|')?
                .trim_end()
                .ends_with(')')
            {
                return None;
            }
            let s = b[start..q].to_owned();
            structs.contains_key(&s).then_some(s)
        });
        if let Some(s) = finn {
            control_params.insert(n.clone(), json!(s));
            inferred.insert(n.clone(), json!("finn"));
            continue;
        }
        let guess = format!("{}_PARAMS", n.replacen("_CTRL_CMD_", "_CTRL_", 1));
        if structs.contains_key(&guess) {
            control_params.insert(n.clone(), json!(guess));
            inferred.insert(n.clone(), json!("name"));
        }
    }
    let mut unnamed: BTreeMap<i128, Value> = BTreeMap::new();
    for m in &methods {
        if !values.contains(&m.id)
            && let btree_map::Entry::Vacant(e) = unnamed.entry(m.id)
        {
            e.insert(json!([num_json(m.id)?, m.params, num_json(m.flags)?]));
        }
    }
    let embedded = embedded(tree, nums, structs)?;

    // Struct names referenced by the maps but missing from `structs`.
    let mut unresolved = Map::new();
    let mut refer = |name: &str, by: &str| {
        let base = name.trim_end_matches("[]");
        if !structs.contains_key(base) && base_size(base).is_none() {
            let e = unresolved
                .entry(base.to_owned())
                .or_insert_with(|| json!([]));
            if let Some(a) = e.as_array_mut() {
                a.push(json!(by));
            }
        }
    };
    for (k, v) in &control_params {
        if let Some(s) = v.as_str() {
            refer(s, k);
        }
    }
    if let Some(o) = class_alloc_params.as_object() {
        for (k, v) in o {
            if let Some(s) = v["params"].as_str() {
                refer(s, k);
            }
        }
    }
    if let Some(o) = escape_params.as_object() {
        for (k, v) in o {
            for s in v.as_array().into_iter().flatten().filter_map(Value::as_str) {
                refer(s, k);
            }
        }
    }
    Ok(Usage {
        escape_params,
        escape_size_check,
        uvm_ioctl_params: Value::Object(uvm_ioctl_params),
        class_alloc_params,
        control_params,
        control_params_inferred: Value::Object(inferred),
        control_flags: Value::Object(flags),
        unnamed_control_methods: Value::Array(unnamed.into_values().collect()),
        embedded,
        unresolved,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comments_are_removed_but_lines_kept() {
        let t = "a /* x\ny */ b // c\n\"/* s */\" d";
        assert_eq!(strip_comments(t), "a \n b \n\"/* s */\" d");
    }

    #[test]
    fn args_split_at_top_level() {
        assert_eq!(
            split_args(" a, f(b, c), (d,e) ,g"),
            ["a", "f(b, c)", "(d,e)", "g"]
        );
    }

    #[test]
    fn size_checks() {
        let known = |t: &str| t.starts_with("NVOS") || t == "NvU32";
        let body = "NVOS21_PARAMETERS *pApi = data; NVOS64_PARAMETERS *pAcc = data;\n\
                    NvBool b = (dataSize == sizeof(NVOS64_PARAMETERS));\n\
                    if ((dataSize != sizeof(*pApi)) && (dataSize != sizeof(*pAcc))) {}";
        let (t, k) = analyse(body, &known);
        assert_eq!(t, ["NVOS21_PARAMETERS", "NVOS64_PARAMETERS"]);
        assert_eq!(k, Some("exact"));
        let (t, k) = analyse(
            "size_t n = arg_size / sizeof(NvU32); if (arg_size % sizeof(NvU32) != 0) {}",
            &known,
        );
        assert_eq!(t, ["NvU32[]"]);
        assert_eq!(k, Some("array"));
        let (t, k) = analyse("NVOS00_PARAMETERS *p = data; use(p);", &known);
        assert_eq!(t, ["NVOS00_PARAMETERS"]);
        assert_eq!(k, Some("none"));
    }
}
