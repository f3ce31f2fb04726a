#!/usr/bin/env bash
# Checks every relative link in the repository's Markdown files: the file (or directory) it
# names must exist, and a `#fragment` must be a heading of the target (GitHub's anchor rules).
# Links to other sites are not fetched. Run from anywhere; test.sh runs it (well under 1 s).
set -euo pipefail
cd "$(dirname "$0")/../.."
git ls-files -z '*.md' | python3 -c '
import os, re, sys

def anchors(path, cache={}):
    if path not in cache:
        seen, out, fence = {}, set(), False
        for line in open(path, encoding="utf-8"):
            if line.lstrip().startswith("```"):
                fence = not fence
                continue
            m = None if fence else re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
            if m:
                slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
                n = seen.get(slug, 0)
                seen[slug] = n + 1
                out.add(slug if n == 0 else f"{slug}-{n}")
        cache[path] = out
    return cache[path]

link = re.compile(r"\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
bad = 0
for md in sys.stdin.read().split("\0"):
    if not md:
        continue
    fence = False
    for no, line in enumerate(open(md, encoding="utf-8"), 1):
        if line.lstrip().startswith("```"):
            fence = not fence
            continue
        if fence:
            continue
        for target in link.findall(re.sub(r"`[^`]*`", "", line)):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):
                continue
            path, _, frag = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(md), path)) if path else md
            if not os.path.exists(dest):
                print(f"{md}:{no}: {target}: no such file {dest}", file=sys.stderr)
                bad += 1
            elif frag and dest.endswith(".md") and frag not in anchors(dest):
                print(f"{md}:{no}: {target}: no heading #{frag} in {dest}", file=sys.stderr)
                bad += 1
if bad:
    sys.exit(f"check-links: {bad} broken link(s)")
'
