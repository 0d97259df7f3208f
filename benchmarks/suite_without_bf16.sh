#!/usr/bin/env bash
# The README's test command (.ci/run) in a fresh clone, on a CPU with native bf16 made to look like one without it:
# /proc/cpuinfo without the bf16 flags (so the node and the tests take the float32 path, as
# `sapo.speed.devices.cpu_has_native_bf16` decides), and ATen's and oneDNN's kernels capped at AVX2. It checks what
# the tests assume of the CPU, not its speed: the clock and the cores stay this machine's.
#
#   bash benchmarks/suite_without_bf16.sh CLONE_DIR [NICE]     (as root)
#
# Needs root (a private mount namespace, `unshare -m`, and a bind mount over /proc/cpuinfo in it only). CLONE_DIR is
# made with `git clone` of this repository; SAPO_CACHE_DIR is a new empty directory beside it. Output: CLONE_DIR.out.
set -euo pipefail
clone=$(realpath -m "${1:?usage: suite_without_bf16.sh CLONE_DIR [NICE]}")
niceness=${2:-0}
repo=$(cd "$(dirname "$0")/.." && pwd)
[ -e "$clone" ] && { echo "$clone exists: give a new directory" >&2; exit 2; }
git clone -q "$repo" "$clone"
mkdir -p "$clone.cache"
sed 's/ avx512_bf16//g; s/ amx_bf16//g' /proc/cpuinfo > "$clone.cpuinfo"
exec unshare -m bash -c "
    mount --bind '$clone.cpuinfo' /proc/cpuinfo
    cd '$clone'
    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 SAPO_CACHE_DIR='$clone.cache' \
        nice -n $niceness /usr/bin/time -v bash .ci/run
" > "$clone.out" 2>&1
