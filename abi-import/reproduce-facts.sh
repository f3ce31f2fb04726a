#!/usr/bin/env bash
# Reproduce /work/shared/abi-facts-style files from NVIDIA's open-gpu-kernel-modules sources.
#
# usage: abi-import/reproduce-facts.sh MIRROR_GIT_DIR [FACTS_DIR] [WORK_DIR]
#
#   MIRROR_GIT_DIR  bare git mirror of NVIDIA/open-gpu-kernel-modules (with release tags)
#   FACTS_DIR       folder with the reference <version>.json files (default /work/shared/abi-facts)
#   WORK_DIR        where the per-tag source subsets are unpacked (default /tmp/ogkm)
#
# For every <version>.json in FACTS_DIR it unpacks only the paths the extractor reads from tag
# <version>, then runs the `from_source_reproduces_facts` test of abi-import with
# NVPROXY_DRIVER_SRC_DIR=WORK_DIR, which runs `abi-import from-source` on every tree and compares
# the result with the reference file (parsed JSON equality).
set -euo pipefail
mirror=${1:?usage: $0 MIRROR_GIT_DIR [FACTS_DIR] [WORK_DIR]}
facts=${2:-/work/shared/abi-facts}
work=${3:-/tmp/ogkm}
here=$(cd "$(dirname "$0")" && pwd)

# The paths `abi-import from-source` reads (see abi-import/src/from_source.rs).
paths=(
    version.mk
    src/common/sdk/nvidia/inc
    src/nvidia/arch/nvalloc/unix/include
    src/nvidia/arch/nvalloc/unix/src/escape.c
    src/nvidia/arch/nvalloc/unix/src/osapi.c
    src/nvidia/src/kernel/rmapi/resource_list.h
    src/nvidia/src/kernel/rmapi/embedded_param_copy.c
    src/nvidia/inc/kernel/rmapi/control.h
    src/nvidia/generated
    kernel-open/common/inc
    kernel-open/nvidia/nv.c
    kernel-open/nvidia-uvm/uvm_ioctl.h
    kernel-open/nvidia-uvm/uvm_linux_ioctl.h
    kernel-open/nvidia-uvm/uvm_types.h
)

extract_tag() { # TAG DEST
    local tag=$1 dest=$2
    [ -e "$dest/.complete" ] && return 0
    rm -rf "$dest" && mkdir -p "$dest"
    local present=()
    for p in "${paths[@]}"; do
        if git --git-dir="$mirror" cat-file -e "$tag:$p" 2>/dev/null; then present+=("$p"); fi
    done
    # Of src/nvidia/generated only the class list and the NVOC tables are needed.
    git --git-dir="$mirror" archive "$tag" -- "${present[@]/#src\/nvidia\/generated/src/nvidia/generated/g_allclasses.h}" \
        $(git --git-dir="$mirror" ls-tree --name-only "$tag" src/nvidia/generated/ | grep -E '_nvoc\.c$') |
        tar -x -C "$dest"
    git --git-dir="$mirror" rev-parse "$tag^{commit}" >"$dest/.commit"
    echo "$tag" >"$dest/.tag"
    touch "$dest/.complete"
}

mkdir -p "$work"
n=0
for f in "$facts"/*.json; do
    v=$(basename "$f" .json)
    git --git-dir="$mirror" rev-parse -q --verify "refs/tags/$v" >/dev/null || { echo "no tag $v in $mirror" >&2; exit 1; }
    extract_tag "$v" "$work/$v"
    n=$((n + 1))
done
echo "unpacked $n trees under $work"

cd "$here/.."
NVPROXY_DRIVER_SRC_DIR=$work NVPROXY_ABI_FACTS_DIR=$facts \
    nice -n 10 cargo test -p abi-import --release --test from_source -- --nocapture
