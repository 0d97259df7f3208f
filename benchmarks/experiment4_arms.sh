#!/usr/bin/env bash
# Experiment 4's registered arms (benchmarks/preregistered/default_mix_equal.md) on a machine of their own:
#   benchmarks/experiment4_arms.sh start   a clean worktree of the frozen commit in DIR/frozen, the runs this clone's
#                                          archive holds restored so that only the missing ones start (a run of a seed
#                                          whose other runs recorded another CPU model is not started), niced, detached
#          pause | resume                  SIGSTOP / SIGCONT to the arms' whole process tree (for a timing run alone)
#          stop                            SIGTERM to sapo_table: the nodes finish their step, checkpoint and leave
#          log "what shared the machine"   a line in DIR/shared_machine.log
# DIR is $EXPERIMENT4_DIR (default ../exp4 beside this clone). A run resumes from its checkpoints in DIR/runs while
# DIR survives; a finished run is archived in DIR/results/sapo_table_runs, from where campaign_report --archive
# copies it into benchmarks/results/campaign.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
dir=${EXPERIMENT4_DIR:-$(dirname "$repo")/exp4}
frozen_commit=c908829
profile=cpu-default-equal
archive=$repo/benchmarks/results/campaign/default_mix_equal/$profile
python=${PYTHON:-$repo/.venv/bin/python}

log() { echo "$(date -u +%FT%TZ) $*" >> "$dir/shared_machine.log"; }

tree() {  # the PIDs of $1's descendants
    local child
    for child in $(pgrep -P "$1"); do
        echo "$child"
        tree "$child"
    done
}

arms_pid() {
    local pid
    pid=$(cat "$dir/arms.pid" 2>/dev/null) || { echo "no arms started from $dir" >&2; exit 1; }
    kill -0 "$pid" 2>/dev/null || { echo "the arms ($pid) are not running" >&2; exit 1; }
    echo "$pid"
}

case "${1:-}" in
start)
    mkdir -p "$dir/runs" "$dir/results/sapo_table_runs"
    [ -d "$dir/frozen" ] || git -C "$repo" worktree add --detach "$dir/frozen" "$frozen_commit" >/dev/null
    [ -f "$dir/shared_machine.log" ] || cp "$archive/../shared_machine.log" "$dir/shared_machine.log"
    cp -rn "$archive" "$dir/results/sapo_table_runs/"
    log "exp4: arms start or resume (8/0,4/4,4/4r seeds 20-26, seed 26 in place of 22; frozen $frozen_commit, nice 10)"
    cd "$dir/frozen"
    PYTHONPATH="$dir/frozen" setsid nohup bash -c '
        nice -n 10 "$0" -m benchmarks.sapo_table --profile '"$profile"' --settings 8/0,4/4,4/4r \
            --seeds 20,21,22,23,24,25,26 --runs-dir "$1/runs" --results-dir "$1/results" -- --bf16 false
        echo "$(date -u +%FT%TZ) exp4: arms invocation ends (exit $?)" >> "$1/shared_machine.log"' \
        "$python" "$dir" > "$dir/arms.out" 2>&1 &
    echo $! > "$dir/arms.pid"
    echo "arms started (PID $!), output in $dir/arms.out"
    ;;
pause | resume)
    signal=$([ "$1" = pause ] && echo STOP || echo CONT)
    root=$(arms_pid)
    pids="$root $(tree "$root")"
    kill -"$signal" $pids
    log "lead: arms SIG$signal to $(echo $pids | wc -w) processes"
    ;;
stop)
    root=$(arms_pid)
    kill -CONT $root $(tree "$root") 2>/dev/null || true
    kill -TERM $(pgrep -P "$root" -f benchmarks.sapo_table)
    log "lead: arms stopped by SIGTERM to sapo_table; they resume from checkpoints with start"
    ;;
log)
    shift
    log "lead: $*"
    ;;
*)
    echo "usage: $0 start | pause | resume | stop | log MESSAGE" >&2
    exit 2
    ;;
esac
