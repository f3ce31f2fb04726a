#!/usr/bin/env bash
# Checks systemd/nvproxy.service: `systemd-analyze verify` (syntax, and that every Exec* command
# exists: the unit's /usr/local/bin/nvproxy is replaced by the built binary in a temporary copy)
# and `systemd-analyze security --offline=true`, failing above exposure 5.0 (the issue's target).
# Usage: systemd/check-unit.sh [NVPROXY_BINARY]     (default: <cargo target dir>/debug/nvproxy)
set -euo pipefail
cd "$(dirname "$0")/.."
command -v systemd-analyze >/dev/null || { echo "check-unit: systemd-analyze is missing (apt-get install systemd)" >&2; exit 1; }
bin=${1:-}
if [[ -z $bin ]]; then
  target_dir=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
  bin=$target_dir/debug/nvproxy
fi
[[ -x $bin ]] || { echo "check-unit: $bin is missing: cargo build -p daemon" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
sed "s#/usr/local/bin/nvproxy#$(realpath "$bin")#g" systemd/nvproxy.service >"$tmp/nvproxy.service"
echo "check-unit: systemd-analyze verify" >&2
systemd-analyze verify "$tmp/nvproxy.service"
echo "check-unit: systemd-analyze security --offline=true (fails above 5.0)" >&2
systemd-analyze security --offline=true --no-pager "$tmp/nvproxy.service" | grep -v '✓' || true
systemd-analyze security --offline=true --threshold=50 "$tmp/nvproxy.service" >/dev/null
