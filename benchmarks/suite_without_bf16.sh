#!/usr/bin/env bash
# The README's test command (.ci/run) in a fresh clone, on a CPU with native bf16 made to look like one without it:
# /proc/cpuinfo without the bf16 flags (so the node and the tests take the float32 path, as
# `sapo.speed.devices.cpu_has_native_bf16` decides), and ATen's and oneDNN's kernels capped at AVX2. It checks what
# the tests assume of the CPU; its speed only with CORES, which caps the run at that many of this machine's cores
# (a cgroup v1 CPU quota: 0.8 gives the whole run 80 ms of CPU in every 100 ms, as two cores 2.5 times slower would).
#
#   bash benchmarks/suite_without_bf16.sh CLONE_DIR [NICE] [CORES]     (as root)
#
# Needs root (a private mount namespace, `unshare -m`, a bind mount over /proc/cpuinfo in it only, and with CORES a
# cgroup under /sys/fs/cgroup/cpu, removed at the end). CLONE_DIR is made with `git clone` of this repository;
# SAPO_CACHE_DIR is a new empty directory beside it. Output: CLONE_DIR.out.
set -euo pipefail
clone=$(realpath -m "${1:?usage: suite_without_bf16.sh CLONE_DIR [NICE] [CORES]}")
niceness=${2:-0}
cores=${3:-}
repo=$(cd "$(dirname "$0")/.." && pwd)
[ -e "$clone" ] && { echo "$clone exists: give a new directory" >&2; exit 2; }
git clone -q "$repo" "$clone"
mkdir -p "$clone.cache"
sed 's/ avx512_bf16//g; s/ amx_bf16//g' /proc/cpuinfo > "$clone.cpuinfo"
if [ -n "$cores" ]; then
    group=/sys/fs/cgroup/cpu/sapo_suite_$$
    mkdir "$group"
    # However the run ends: this shell back to the root group, and the capped one removed once the processes the
    # run left have ended (any still there after 30 s are named: the suite should leave none).
    trap 'echo $$ > /sys/fs/cgroup/cpu/cgroup.procs
          for _ in $(seq 30); do [ -s "$group/cgroup.procs" ] || break; sleep 1; done
          for pid in $(cat "$group/cgroup.procs"); do echo "left running: $(ps -o pid=,cmd= -p "$pid")" >&2; done
          rmdir "$group"' EXIT
    period=$(cat /sys/fs/cgroup/cpu/cpu.cfs_period_us)
    awk -v c="$cores" -v p="$period" 'BEGIN { printf "%d\n", c * p }' > "$group/cpu.cfs_quota_us"
    echo $$ > "$group/cgroup.procs"
fi
unshare -m bash -c "
    mount --bind '$clone.cpuinfo' /proc/cpuinfo
    cd '$clone'
    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 SAPO_CACHE_DIR='$clone.cache' \
        nice -n $niceness /usr/bin/time -v bash .ci/run
" > "$clone.out" 2>&1
