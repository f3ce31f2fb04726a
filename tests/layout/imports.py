#!/usr/bin/env python3
"""List the module imports inside each crate and report the import cycles.

An edge A -> B means a file of module A names a path of module B (`use crate::b::..`,
`crate::b::x(..)` in code, `super::..`, or a child module by its bare name). Comments and
string literals are skipped, and so are `#[cfg(test)]` modules unless --tests is given.
A name re-exported with `pub use` counts as an import of the module that defines it.

A cycle of two files (a module and its helper pointing at each other) is tolerated; a
strongly connected set of three or more files is reported with one of its longest-found
cycles. With --check the exit status is 1 when such a set exists (the "one-way arrows" rule
of issue 24).

    python3 tests/layout/imports.py            # every workspace crate with a src/
    python3 tests/layout/imports.py daemon     # one crate (test.sh: --check daemon nvproxy-config)
    python3 tests/layout/imports.py --edges daemon
"""

import argparse
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def strip(text):
    """Blank out comments and string/char literals, keeping line structure."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            i = j
            continue
        if text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append("\n" * text.count("\n", i, j))
            i = j
            continue
        m = re.match(r'b?r(#*)"', text[i:i + 10])
        if m and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            end = '"' + m.group(1)
            j = text.find(end, i + m.end())
            j = n if j < 0 else j + len(end)
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j
            continue
        if c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j + 1
            continue
        if c == "'":
            # A char literal ('a', '\n', '\u{..}'), not a lifetime ('a).
            m = re.match(r"'(\\u\{[0-9a-fA-F]+\}|\\.|[^\\'])'", text[i:i + 12])
            if m:
                out.append("' '")
                i += m.end()
                continue
        out.append(c)
        i += 1
    return "".join(out)


def drop_test_modules(text):
    """Remove `#[cfg(test)] mod x { .. }` blocks from stripped text."""
    while True:
        m = re.search(r"#\[cfg\(test\)\]\s*(pub(\([^)]*\))?\s+)?mod\s+\w+\s*\{", text)
        if not m:
            return text
        depth, j = 1, m.end()
        while j < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        text = text[:m.start()] + "\n" * text.count("\n", m.start(), j) + text[j:]


class Crate:
    def __init__(self, src, tests=True):
        self.src = src
        self.tests = tests
        self.files = {}  # module path tuple -> file path
        self.children = {}  # module path tuple -> set of child names
        self._texts = {}
        self._reexports = {}
        root = None
        for name in ("lib.rs", "main.rs"):
            if os.path.exists(os.path.join(src, name)):
                root = os.path.join(src, name)
                break
        if root is None:
            raise SystemExit(f"{src}: no lib.rs or main.rs")
        self._load((), root)

    def _load(self, path, file):
        self.files[path] = file
        text = strip(open(file, encoding="utf-8").read())
        if not self.tests:
            text = drop_test_modules(text)
        self.children[path] = set()
        here = os.path.dirname(file)
        base = os.path.basename(file)
        sub = here if base in ("lib.rs", "main.rs", "mod.rs") else file[:-3]
        for m in re.finditer(r"(?m)^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;", text):
            name = m.group(1)
            for cand in (os.path.join(sub, name + ".rs"), os.path.join(sub, name, "mod.rs")):
                if os.path.exists(cand):
                    self.children[path].add(name)
                    self._load(path + (name,), cand)
                    break

    def text(self, mod):
        if mod not in self._texts:
            text = strip(open(self.files[mod], encoding="utf-8").read())
            if not self.tests:
                text = drop_test_modules(text)
            self._texts[mod] = text
        return self._texts[mod]

    def reexports(self, mod):
        """Names a module re-exports with `pub use`: name -> the path it stands for."""
        if mod in self._reexports:
            return self._reexports[mod]
        names = {}
        self._reexports[mod] = names
        for m in re.finditer(r"\bpub(?:\([^)]*\))?\s+use\s+([^;]+);", self.text(mod)):
            for path in expand(m.group(1), keep_glob=True):
                if path and path[-1] == "*":
                    target = self._anchor(mod, 0, path[:-1])
                    if target is not None and target != mod:
                        for name in self.items(target):
                            names.setdefault(name, (target, [name]))
                elif path:
                    names[path[-1]] = (mod, path)
        return names

    def items(self, mod):
        text = self.text(mod)
        found = set(re.findall(
            r"\bpub(?:\([^)]*\))?\s+(?:unsafe\s+)?(?:struct|enum|fn|const|static|type|trait|"
            r"union|mod)\s+(\w+)", text))
        return found | set(self.reexports(mod))

    def resolve(self, parts, seen=None):
        """The module that defines what a path of identifiers from the crate root names."""
        mod = ()
        for i, p in enumerate(parts):
            if p in self.children.get(mod, ()):
                mod = mod + (p,)
                continue
            ex = self.reexports(mod).get(p)
            seen = seen or set()
            if ex is not None and (mod, p) not in seen:
                seen.add((mod, p))
                owner, path = ex
                target = self._anchor(owner, 0, path, seen)
                if target is not None:
                    return target
            break
        return mod

    def name(self, mod):
        return os.path.relpath(self.files[mod], self.src)

    def edges(self):
        result = {m: set() for m in self.files}
        for mod in self.files:
            for target in self._refs(mod, self.text(mod)):
                if target != mod and target in self.files:
                    result[mod].add(target)
        return result

    def _refs(self, mod, text):
        inline = inline_modules(text)

        def depth(pos):
            return sum(1 for a, b in inline if a <= pos < b)

        # use trees: expand braces
        for m in re.finditer(r"\buse\s+([^;]+);", text):
            for path in expand(m.group(1)):
                t = self._anchor(mod, depth(m.start()), path)
                if t is not None:
                    yield t
        # inline paths
        for m in re.finditer(r"(?<![\w:$])((?:crate|super|self|\w+)(?:::\w+)+)", text):
            t = self._anchor(mod, depth(m.start()), m.group(1).split("::"))
            if t is not None:
                yield t

    def _anchor(self, mod, inner, parts, seen=None):
        """Resolve a path written in module `mod`, `inner` inline modules deep."""
        parts = [p for p in parts if p]
        if not parts:
            return None
        if parts[0] == "crate":
            return self.resolve(parts[1:], seen)
        if parts[0] in ("super", "self"):
            base = list(mod)
            while parts and parts[0] in ("super", "self"):
                if parts[0] == "super":
                    if inner:
                        inner -= 1
                    else:
                        base = base[:-1]
                parts = parts[1:]
            if inner:
                return None  # a path inside an inline module's own items
            return self.resolve(base + parts, seen)
        if inner == 0 and parts[0] in self.children.get(mod, ()):
            return self.resolve(list(mod) + parts, seen)
        return None


def inline_modules(text):
    """(start, end) of each `mod name { .. }` block in stripped text."""
    spans = []
    for m in re.finditer(r"\bmod\s+\w+\s*\{", text):
        depth, j = 1, m.end()
        while j < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        spans.append((m.end(), j))
    return spans


def expand(tree, keep_glob=False):
    """`crate::{a::b, c::{self, d}}` -> [[crate, a, b], [crate, c], [crate, c, d]]."""
    tree = re.sub(r"\s+", "", tree)
    tree = re.sub(r"\bas\w+", "", tree)
    out = []

    def walk(prefix, s):
        depth, start, items = 0, 0, []
        for i, ch in enumerate(s):
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            elif ch == "," and depth == 0:
                items.append(s[start:i])
                start = i + 1
        items.append(s[start:])
        for item in items:
            if not item:
                continue
            b = item.find("{")
            if b >= 0:
                head = [p for p in item[:b].split("::") if p]
                walk(prefix + head, item[b + 1:item.rfind("}")])
            else:
                parts = [p for p in item.split("::") if p and (keep_glob or p != "*")]
                if parts == ["self"]:
                    parts = []
                out.append(prefix + parts)

    walk([], tree)
    return out


def sccs(graph):
    index, low, stack, on, result = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            result.append(comp)

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return result


def long_cycle(graph, comp):
    """A simple cycle of three or more nodes inside comp (the longest a bounded search finds)."""
    members = set(comp)
    best = []
    budget = [200000]

    def dfs(start, v, path, seen):
        if budget[0] <= 0:
            return
        budget[0] -= 1
        for w in sorted(graph[v]):
            if w not in members:
                continue
            if w == start and len(path) >= 3 and len(path) > len(best):
                best[:] = path[:]
            elif w not in seen and w > start:
                seen.add(w)
                path.append(w)
                dfs(start, w, path, seen)
                path.pop()
                seen.discard(w)

    for s in sorted(comp):
        dfs(s, s, [s], {s})
    return best


def levels(graph):
    """Import depth of each module: 0 imports nothing inside the crate (cycles collapsed)."""
    comps = sccs(graph)
    of = {v: i for i, c in enumerate(comps) for v in c}
    level = {}
    for i, c in enumerate(comps):  # Tarjan emits sinks first
        deps = {of[w] for v in c for w in graph[v]} - {i}
        level[i] = 1 + max((level[d] for d in deps), default=-1)
    return {v: level[of[v]] for v in graph}


def crate_dirs(args):
    if args:
        return [os.path.join(ROOT, a) if not os.path.isabs(a) else a for a in args]
    dirs = []
    for dirpath, dirnames, filenames in os.walk(ROOT):
        dirnames[:] = [d for d in dirnames if d not in ("target", ".git", "fuzz", "node_modules")]
        if "Cargo.toml" in filenames and os.path.isdir(os.path.join(dirpath, "src")):
            dirs.append(dirpath)
    return sorted(dirs)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("crates", nargs="*", help="crate directories (default: all)")
    ap.add_argument("--edges", action="store_true", help="print every edge")
    ap.add_argument("--levels", action="store_true", help="print each module's import depth")
    ap.add_argument("--tests", action="store_true", help="count #[cfg(test)] modules too")
    ap.add_argument("--check", action="store_true", help="exit 1 on a cycle of 3+ files")
    args = ap.parse_args()
    bad = 0
    for d in crate_dirs(args.crates):
        src = os.path.join(d, "src")
        crate = Crate(src, tests=args.tests)
        graph = crate.edges()
        rel = os.path.relpath(d, ROOT)
        nedges = sum(len(v) for v in graph.values())
        comps = [sorted(c) for c in sccs(graph) if len(c) > 2]
        long = [(c, long_cycle(graph, c)) for c in comps]
        long = [(c, cyc) for c, cyc in long if cyc]
        lv = levels(graph)
        depth = 1 + max(lv.values()) if lv else 0
        print(f"{rel}: {len(graph)} files, {nedges} edges, {depth} levels, "
              f"{len(long)} cycle set(s) of 3+ files")
        if args.edges:
            for v in sorted(graph):
                for w in sorted(graph[v]):
                    print(f"  {crate.name(v)} -> {crate.name(w)}")
        if args.levels:
            for v in sorted(graph, key=lambda v: (lv[v], v)):
                print(f"  level {lv[v]:2}  {crate.name(v)}")
        for c, cyc in long:
            bad += 1
            names = ", ".join(crate.name(v) for v in c)
            print(f"  CYCLE SET ({len(c)} files): {names}")
            print("    e.g. " + " -> ".join(crate.name(v) for v in cyc + [cyc[0]]))
        twos = sorted({tuple(sorted((v, w))) for v in graph for w in graph[v] if v in graph[w]})
        for v, w in twos:
            print(f"  two-file cycle: {crate.name(v)} <-> {crate.name(w)}")
    if args.check and bad:
        sys.exit(1)


if __name__ == "__main__":
    main()
