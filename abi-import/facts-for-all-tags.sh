#!/usr/bin/env bash
# Run `abi-import from-source` over every tag of a mirror from a branch on, and print a table
# saying which reference facts file each tag's facts equal (ignoring driver_version, source and
# commit), or the closest one and how many entries differ. Writes nothing into the repository.
#
# usage: abi-import/facts-for-all-tags.sh MIRROR_GIT_DIR [FACTS_DIR] [MIN_BRANCH] [WORK_DIR]
#   defaults: FACTS_DIR=/work/shared/abi-facts MIN_BRANCH=535 WORK_DIR=/tmp/ogkm-all
# Needs python3 for the comparison. About 4 s per tag on two cores.
set -euo pipefail
mirror=${1:?usage: $0 MIRROR_GIT_DIR [FACTS_DIR] [MIN_BRANCH] [WORK_DIR]}
facts=${2:-/work/shared/abi-facts}
min=${3:-535}
work=${4:-/tmp/ogkm-all}
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=/dev/null
source <(sed -n '/^paths=(/,/^}/p' "$here/reproduce-facts.sh")
(cd "$here/.." && nice -n 10 cargo build -q -p abi-import --release)
bin="$here/../target/release/abi-import"
out="$work/facts"
mkdir -p "$work" "$out"
for t in $(git --git-dir="$mirror" tag | sort -V); do
    major=${t%%.*}
    [[ $major =~ ^[0-9]+$ ]] && [ "$major" -ge "$min" ] || continue
    extract_tag "$t" "$work/$t"
    if ! nice -n 10 "$bin" from-source "$work/$t" --out "$out/$t.json" --version "$t" \
        --commit "$(cat "$work/$t/.commit")" >"$out/$t.log" 2>&1; then
        echo "$t: from-source failed: $(tail -3 "$out/$t.log")" >&2
    fi
    rm -rf "$work/$t"
done
python3 - "$facts" "$out" <<'PY'
import glob, json, os, sys
facts, out = sys.argv[1], sys.argv[2]
def load(f):
    d = json.load(open(f))
    for k in ("driver_version", "source", "commit"):
        d.pop(k, None)
    return d
refs = {os.path.basename(f)[:-5]: load(f) for f in sorted(glob.glob(f"{facts}/*.json"))}
def ndiff(a, b):
    n = 0
    for k in set(a) | set(b):
        x, y = a.get(k), b.get(k)
        if x == y:
            continue
        if isinstance(x, dict) and isinstance(y, dict):
            n += sum(1 for q in set(x) | set(y) if x.get(q) != y.get(q))
        else:
            n += 1
    return n
def key(f):
    return [int(p) for p in os.path.basename(f)[:-5].split(".")]
print("| tag | identical to | otherwise closest (entries differing; sections) |")
print("|---|---|---|")
same_count = 0
files = sorted(glob.glob(f"{out}/*.json"), key=key)
for f in files:
    v = os.path.basename(f)[:-5]
    d = load(f)
    same = [r for r, x in refs.items() if x == d]
    if same:
        same_count += 1
        print(f"| {v} | {', '.join(same)} | |")
    else:
        best = min(refs, key=lambda r: ndiff(d, refs[r]))
        keys = [k for k in refs[best] if d.get(k) != refs[best][k] and k != "counts"]
        print(f"| {v} | – | {best}: {ndiff(d, refs[best])}; {', '.join(keys)} |")
print(f"\n{len(files)} tags, {same_count} identical to a reference file")
PY
