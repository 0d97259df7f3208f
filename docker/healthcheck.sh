#!/usr/bin/env bash
# Docker HEALTHCHECK of a sapo-node container: exits 0 when the node is alive, 1 otherwise.
#
# Alive means: a `sapo-node` process runs, its output directory holds an address.txt written since that process
# started (the node writes it once it has joined the swarm), and metrics.jsonl (one line per training step) or
# address.txt (a fresh start, still in its first step) changed within SAPO_HEALTH_MAX_AGE seconds (default 1800).
#
# The output directory is read from the node's command line (--output-dir / --output_dir / --set
# output_dir=...), relative to the node's working directory, as the node resolves it; SAPO_HEALTH_DIR
# overrides it (e.g. when the output directory comes from a --config file).
set -uo pipefail

max_age=${SAPO_HEALTH_MAX_AGE:-1800}

unhealthy() {
    echo "unhealthy: $*"
    exit 1
}

# The node's process: the first one whose command line has an argument named sapo-node and whose root
# directory is this script's (in a container without its own process namespace, such as `buildah run`, /proc
# also lists the host's processes: a sapo-node running on the host must not make this container healthy).
pid=""
own_root=$(stat -L -c %d:%i /proc/self/root 2>/dev/null) || own_root=""
for dir in /proc/[0-9]*; do
    [[ -r $dir/cmdline ]] || continue
    if [[ -n $own_root ]]; then
        [[ $(stat -L -c %d:%i "$dir/root" 2>/dev/null) == "$own_root" ]] || continue
    fi
    mapfile -d '' -t argv <"$dir/cmdline" 2>/dev/null || continue
    for arg in "${argv[@]:0:2}"; do
        if [[ ${arg##*/} == sapo-node ]]; then
            pid=${dir#/proc/}
            break 2
        fi
    done
done
[[ -n $pid ]] || unhealthy "no sapo-node process"

# Its output directory, parsed as the node parses it: the last flag wins, --set wins over flags.
output_dir=sapo-output
set_dir=""
n=${#argv[@]}
for ((i = 0; i < n; i++)); do
    arg=${argv[i]}
    next=${argv[i + 1]:-}
    case $arg in
        --output-dir | --output_dir) output_dir=$next ;;
        --output-dir=* | --output_dir=*) output_dir=${arg#*=} ;;
        --set) [[ $next == output_dir=* ]] && set_dir=${next#output_dir=} ;;
        --set=output_dir=*) set_dir=${arg#--set=output_dir=} ;;
    esac
done
[[ -n $set_dir ]] && output_dir=$set_dir
output_dir=${SAPO_HEALTH_DIR:-$output_dir}
if [[ $output_dir != /* ]]; then
    cwd=$(readlink "/proc/$pid/cwd" 2>/dev/null) || cwd=$PWD
    output_dir=$cwd/$output_dir
fi

[[ -f $output_dir/address.txt ]] || unhealthy "no $output_dir/address.txt yet (loading or joining the swarm)"

# address.txt must be this node's: a restarted container still holds the previous run's until the node rejoins.
# The process's start, in seconds since the epoch: boot time + field 22 of /proc/PID/stat (clock ticks since boot;
# the fields after the command name, which may hold spaces, are counted from its closing parenthesis).
stat_line=$(<"/proc/$pid/stat")
read -r -a after_name <<<"${stat_line##*) }"
boot=$(awk '/^btime/ {print $2}' /proc/stat)
started=$((boot + after_name[19] / $(getconf CLK_TCK)))
written=$(stat -c %Y "$output_dir/address.txt")
((written >= started)) || unhealthy "$output_dir/address.txt is from an earlier run (this node is loading or joining)"

now=$(date +%s)
newest=$(stat -c %Y "$output_dir/address.txt")
if [[ -f $output_dir/metrics.jsonl ]]; then
    metrics=$(stat -c %Y "$output_dir/metrics.jsonl")
    ((metrics > newest)) && newest=$metrics
fi
age=$((now - newest))
((age <= max_age)) || unhealthy "no training step logged in $output_dir/metrics.jsonl for ${age}s (limit ${max_age}s)"
echo "healthy: pid $pid, last activity ${age}s ago in $output_dir"
exit 0
