#!/usr/bin/env bash
# Builds the CPU community-node image from this repository and runs it, without a Docker engine or a registry.
#
#   sudo bash docker/build_check.sh [LOG.md]       # e.g. benchmarks/results/docker_build_check.md
#
# Root, Debian's packages (buildah, podman, debootstrap) and PyPI are all it needs:
#   0. parse checks of both variants (tests/test_dockerfile*.py; the CUDA image cannot be built here: its base
#      comes from a registry);
#   1. installs buildah, podman and debootstrap when missing;
#   2. makes a local base image, localhost/bookworm-python:3.11 (Debian bookworm minbase with python3, its
#      venv module, pip and ca-certificates, by debootstrap; a stand-in for python:3.11-slim), once: skipped
#      when the image exists;
#   3. puts the host's CPU torch wheel in docker/wheels (pip's own lookup, pinned to a +cpu build: never the
#      CUDA build) and builds the image with `buildah bud` (TORCH_WHEELS=docker/wheels, the rest from PyPI),
#      then rebuilds it after a source change to time the layer cache;
#   4. runs it with `buildah from` + `buildah run` (`podman run` fails in some sandboxes): a sapo-node on the
#      host (outside the image, 127.0.0.1) and the image's sapo-node, started with the image's own ENTRYPOINT
#      and CMD plus a few small settings, form a swarm; the image's node must train, write its identity,
#      address, metrics and checkpoints into the volume as the image's non-root user, be healthy by the
#      image's HEALTHCHECK while it trains and unhealthy after it stopped; a second run on the same volume
#      must keep the peer id and resume from the checkpoint; a third run is stopped as `docker stop` stops a
#      container (SIGTERM to its entrypoint, SIGKILL after Docker's default grace, STOP_TIMEOUT) during a step and
#      must exit 0 within the grace leaving a checkpoint of its last completed step, which a fourth run
#      resumes from.
# Every process it starts is stopped by its id on exit. Every node listens on 127.0.0.1 only (the image's
# default command listens on 0.0.0.0; with the host's network that would open the port beyond this machine).
#
# Environment: IMAGE (localhost/sapo-node:check), BASE_IMAGE (localhost/bookworm-python:3.11), WORK (scratch
# directory, /tmp/sapo-build-check), CA_BUNDLE (/etc/ssl/certs/ca-certificates.crt: pip's CA bundle in the build,
# copied into the build context's docker/ca/), STEPS (2: steps of the first run; the second run trains one more),
# REBUILD (1: time a rebuild after a source change), KEEP_IMAGE (1), STOP_TIMEOUT (10: `docker stop`'s default
# grace), NICE (nice -n 19 ionice -c 3: the
# build and the nodes run at the lowest priority), NODE_ARGS (small settings for both nodes), HOST_PYTHON (the
# Python of the host node: this clone's .venv/bin/python, made by setup.sh when the clone has no .venv and given
# the dependencies pyproject.toml added since).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
LOG_MD=${1:-}
IMAGE=${IMAGE:-localhost/sapo-node:check}
BASE_IMAGE=${BASE_IMAGE:-localhost/bookworm-python:3.11}
WORK=${WORK:-/tmp/sapo-build-check}
STEPS=${STEPS:-2}
STOP_TIMEOUT=${STOP_TIMEOUT:-10}
REBUILD=${REBUILD:-1}
KEEP_IMAGE=${KEEP_IMAGE:-1}
read -r -a NICE <<<"${NICE:-nice -n 19 ionice -c 3}"
# Small settings so that a step of the default model takes seconds on a CPU, not minutes.
read -r -a NODE_ARGS <<<"${NODE_ARGS:---max-completion-length 16 --eval-strategy no --dataset-size 256 --save-steps 2}"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# The Python that runs the host node (and the parse checks): one with this project installed. Default: the clone's
# .venv, which the script makes with setup.sh (the README's install) when the clone has none.
HOST_PYTHON=${HOST_PYTHON:-$ROOT/.venv/bin/python}
# The host's CA bundle, given to pip in the build stages as docker/ca/ca-bundle.crt of the build context (a package
# index or proxy whose certificate only the host trusts); the image's own stage never holds it.
CA_BUNDLE=${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}

SCRIPT_START=$(date +%s)
REPORT=()    # markdown lines for the log
FAILURES=()
CTR=""
HOST_NODE_PID=""
IMAGE_NODE_PID=""

say() { echo "build_check: $*" >&2; }
note() { REPORT+=("$*"); say "$*"; }
check() {  # check NAME CONDITION-STATUS DETAIL
    local name=$1 ok=$2 detail=${3:-}
    if [[ $ok == 0 ]]; then
        REPORT+=("| $name | ok | $detail |")
        say "ok: $name ${detail:+($detail)}"
    else
        REPORT+=("| $name | **FAILED** | $detail |")
        FAILURES+=("$name")
        say "FAILED: $name ${detail:+($detail)}"
    fi
}
seconds_since() { echo $(($(date +%s) - $1)); }

stop_group() {  # stop_group PID: SIGTERM the process group a node was started in, SIGKILL after 120 s
    local pid=$1
    [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null || return 0
    kill -TERM -- "-$pid" 2>/dev/null || true
    for _ in $(seq 120); do
        kill -0 "$pid" 2>/dev/null || return 0
        sleep 1
    done
    kill -KILL -- "-$pid" 2>/dev/null || true
}

cleanup() {
    stop_group "$IMAGE_NODE_PID"
    stop_group "$HOST_NODE_PID"
    [[ -n $CTR ]] && buildah rm "$CTR" >/dev/null 2>&1 || true
    if [[ $KEEP_IMAGE != 1 ]]; then buildah rmi "$IMAGE" >/dev/null 2>&1 || true; fi
}
trap cleanup EXIT
trap 'exit 143' TERM INT

mkdir -p "$WORK"
COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
DIRTY=$(git status --porcelain --untracked-files=no 2>/dev/null | awk '{ print $2 }' | tr '\n' ' ')

# ----------------------------------------------------------------------------------------------------
# the host's Python
can_run_node() { [[ -x $1 ]] && "$1" -c "import sapo.node.cli, sapo.node.runner, swarm, torch" 2>/dev/null; }
if ! can_run_node "$HOST_PYTHON" && [[ $HOST_PYTHON == "$ROOT/.venv/bin/python" && ! -e $ROOT/.venv ]]; then
    say "this clone has no .venv: making one with setup.sh for the host node (or set HOST_PYTHON to a Python with"
    say "this project installed)"
    "${NICE[@]}" bash "$ROOT/setup.sh" >"$WORK/setup.log" 2>&1 || { tail -20 "$WORK/setup.log" >&2; exit 2; }
fi
if [[ $HOST_PYTHON == "$ROOT/.venv/bin/python" && -x $HOST_PYTHON ]]; then
    # The clone's own environment: dependencies added to pyproject.toml since setup.sh made it are installed now
    # (seconds when nothing is missing), so a pulled clone does not run its host node without them.
    "${NICE[@]}" "$HOST_PYTHON" -m pip install --quiet -e ".[dev]" >"$WORK/pip-update.log" 2>&1 \
        || { tail -20 "$WORK/pip-update.log" >&2; exit 2; }
fi
if ! can_run_node "$HOST_PYTHON"; then
    say "$HOST_PYTHON cannot run sapo-node (import sapo.node.cli, torch failed): set HOST_PYTHON to a Python with"
    say "this project installed, or run bash setup.sh in this clone"
    exit 2
fi
note "Host node's Python: $HOST_PYTHON ($("$HOST_PYTHON" --version 2>&1))"

# ----------------------------------------------------------------------------------------------------
# 0. parse checks (both variants)
if [[ -x $HOST_PYTHON ]] && "$HOST_PYTHON" -c "import pytest, dockerfile_parse" 2>/dev/null; then
    parse_checks=(tests/test_dockerfile.py tests/test_dockerfile_run.py)
    out=$("${NICE[@]}" "$HOST_PYTHON" -m pytest -q -p no:cacheprovider "${parse_checks[@]}" 2>&1) && ok=0 || ok=1
    check "parse checks, CPU and CUDA variants (tests/test_dockerfile*.py)" $ok "$(tail -1 <<<"$out")"
else
    say "no $HOST_PYTHON with pytest: parse checks skipped (bash setup.sh makes one)"
fi

# ----------------------------------------------------------------------------------------------------
# 1. tools
missing=()
for tool in buildah podman debootstrap; do command -v "$tool" >/dev/null || missing+=("$tool"); done
if ((${#missing[@]})); then
    say "installing ${missing[*]}"
    "${NICE[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${NICE[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null
fi
BUILDAH_VERSION=$(buildah --version)

# ----------------------------------------------------------------------------------------------------
# 2. the base image (cached)
if buildah inspect --type image "$BASE_IMAGE" >/dev/null 2>&1; then
    base_note="existed already (cached), not rebuilt"
else
    start=$(date +%s)
    rm -rf "$WORK/rootfs"
    "${NICE[@]}" debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates \
        bookworm "$WORK/rootfs" >"$WORK/debootstrap.log" 2>&1
    rm -rf "$WORK"/rootfs/var/cache/apt/archives/*.deb "$WORK"/rootfs/var/lib/apt/lists/*
    # python:3.11-slim's PATH and locale; without a PATH the Dockerfile's ENV PATH=/opt/venv/bin:$PATH
    # would hide /usr/sbin (useradd).
    tar -C "$WORK/rootfs" -c . | "${NICE[@]}" podman import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' - "$BASE_IMAGE" >/dev/null
    rm -rf "$WORK/rootfs"
    base_note="built by debootstrap in $(seconds_since "$start") s"
fi
BASE_SIZE=$(podman image inspect --format '{{.Size}}' "$BASE_IMAGE")

# ----------------------------------------------------------------------------------------------------
# 3. build
TORCH_PIN=$(grep -oE 'torch==[0-9][0-9a-z.]*' setup.sh | head -1)
mkdir -p docker/wheels
if ! ls docker/wheels/"torch-${TORCH_PIN#torch==}+cpu"-*.whl >/dev/null 2>&1; then
    # The +cpu pin can only match a CPU build (a local find-links directory or PyTorch's CPU index); the
    # host's pip configuration decides where it looks.
    say "fetching ${TORCH_PIN}+cpu into docker/wheels"
    "${NICE[@]}" "$HOST_PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.11 \
        --retries 1 --timeout 20 ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"} \
        -d docker/wheels "${TORCH_PIN}+cpu"
fi
TORCH_WHEEL=$(basename "$(ls docker/wheels/"torch-${TORCH_PIN#torch==}+cpu"-*.whl | head -1)")

steps_run() {  # the RUN and COPY steps of a build log that did not come from the layer cache
    python3 - "$1" <<'PY'
import re, sys
steps, current = [], None
for line in open(sys.argv[1], errors="replace"):
    m = re.match(r"^(?:\[\d+/\d+\] )?STEP \d+/\d+: ((?:RUN|COPY)\b.*)", line)
    if m:
        current = m.group(1)
        steps.append([current, False])
    elif line.startswith("--> Using cache") and steps:
        steps[-1][1] = True
ran = [s for s, cached in steps if not cached]
short = lambda s: re.sub(r"\s+", " ", s.replace("|", "/"))[:70]
print(f"{len(ran)} of {len(steps)}: " + "; ".join(f"`{short(s)}`" for s in ran) if ran else f"none of {len(steps)}")
PY
}

build() {  # build CONTEXT TAG LOGFILE
    "${NICE[@]}" buildah bud --isolation chroot --network host --layers --format docker \
        --build-arg BASE_IMAGE="$BASE_IMAGE" \
        --build-arg TORCH_WHEELS=docker/wheels \
        -t "$2" "$1" >"$3" 2>&1
}

# The build context is a copy of the repository's files (tracked and untracked, git's ignores applied, plus
# the wheel), so that the rebuild check below can change a source file without touching the work tree.
CONTEXT=$WORK/context
rm -rf "$CONTEXT"
mkdir -p "$CONTEXT"
{ git ls-files -co --exclude-standard; echo "docker/wheels/$TORCH_WHEEL"; } | sort -u \
    | while read -r f; do [[ -e $f ]] && echo "$f"; done | tar -c -T - | tar -C "$CONTEXT" -x
if [[ -s $CA_BUNDLE ]]; then mkdir -p "$CONTEXT/docker/ca" && cp "$CA_BUNDLE" "$CONTEXT/docker/ca/ca-bundle.crt"; fi

if [[ ${FRESH:-0} == 1 ]]; then
    # A build without buildah's layer cache (pip's download cache, a cache mount, stays warm).
    buildah rmi "$IMAGE" >/dev/null 2>&1 || true
    buildah rmi --prune >/dev/null 2>&1 || true
fi
containers_before=$(buildah containers -q | sort)
start=$(date +%s)
if build "$CONTEXT" "$IMAGE" "$WORK/build.log"; then ok=0; else ok=1; fi
BUILD_S=$(seconds_since "$start")
check "image builds (buildah bud)" $ok "$BUILD_S s; log $WORK/build.log"
if [[ $ok != 0 ]]; then
    tail -40 "$WORK/build.log" >&2
    REPORT+=("" "Build log tail:" "" '```' "$(tail -40 "$WORK/build.log")" '```')
fi
BUILD_STEPS=$(steps_run "$WORK/build.log" | cut -d: -f1)

IMAGE_SIZE=""
REBUILD_S=""
if [[ $ok == 0 ]]; then
    IMAGE_SIZE=$(podman image inspect --format '{{.Size}}' "$IMAGE")
    if [[ $REBUILD == 1 ]]; then
        # A source change: one line added to a module of swarm/. Only the project's own install and the
        # copies after it should run again.
        echo "# build_check: a source change" >>"$CONTEXT/swarm/clock.py"
        start=$(date +%s)
        if build "$CONTEXT" "$IMAGE-rebuilt" "$WORK/rebuild.log"; then ok=0; else ok=1; fi
        REBUILD_S=$(seconds_since "$start")
        reran=$(steps_run "$WORK/rebuild.log")
        check "rebuild after a change to swarm/clock.py" $ok "$REBUILD_S s; steps run again: $reran"
        buildah rmi "$IMAGE-rebuilt" >/dev/null 2>&1 || true
    fi
fi
# buildah 1.28 may leave the working containers of the build stages behind.
comm -13 <(echo "$containers_before") <(buildah containers -q | sort) | xargs -r buildah rm >/dev/null 2>&1 || true

# ----------------------------------------------------------------------------------------------------
# 4. run
if ((${#FAILURES[@]} == 0)) || buildah inspect --type image "$IMAGE" >/dev/null 2>&1; then
    image_json=$WORK/image.json
    buildah inspect --type image "$IMAGE" >"$image_json"
    field() { python3 -c "import json, sys; c = json.load(open(sys.argv[1]))['Docker']['config']; print(json.dumps(c.get(sys.argv[2])))" "$image_json" "$1"; }
    mapfile -t ENTRYPOINT < <(field Entrypoint | python3 -c "import json, sys; print(*json.load(sys.stdin) or [], sep='\n')")
    mapfile -t CMD < <(field Cmd | python3 -c "import json, sys; print(*json.load(sys.stdin) or [], sep='\n')")
    mapfile -t HEALTH < <(field Healthcheck | python3 -c "
import json, sys
test = (json.load(sys.stdin) or {}).get('Test') or []
print(*(test[1:] if test[:1] == ['CMD'] else ['sh', '-c', *test[1:]]), sep='\n')")
    USER_NAME=$(field User | python3 -c "import json, sys; print(json.load(sys.stdin) or 'root')")
    VOLUME=$(field Volumes | python3 -c "import json, sys; print(*(json.load(sys.stdin) or {'/data': 0}))")
    PORT=$(field ExposedPorts | python3 -c "import json, sys; print(next(iter(json.load(sys.stdin))).split('/')[0])")
    note "Image config: ENTRYPOINT ${ENTRYPOINT[*]}; CMD ${CMD[*]}; USER $USER_NAME; VOLUME $VOLUME; port $PORT; HEALTHCHECK ${HEALTH[*]}"
    ((${#HEALTH[@]})) && ok=0 || ok=1
    check "the image keeps its HEALTHCHECK (docker format)" $ok "${HEALTH[*]}"

    # The image's default arguments, listening on 127.0.0.1 instead of 0.0.0.0 (same port).
    node_cmd=()
    for ((i = 0; i < ${#CMD[@]}; i++)); do
        if [[ ${CMD[i]} == /ip4/0.0.0.0/* ]]; then node_cmd+=("${CMD[i]/0.0.0.0/127.0.0.1}"); else node_cmd+=("${CMD[i]}"); fi
    done
    if ss -ltn "sport = :$PORT" | grep -q LISTEN; then
        say "port $PORT is taken on this machine; the check cannot run the image's node on it"
        check "port $PORT free" 1 "in use"
    fi

    CTR=$(buildah from --name "sapo-build-check-$$" "$IMAGE")
    # buildah 1.28 mounts a container-private directory on the image's VOLUME and lets it hide a --volume bind
    # on the same path; dropping the declaration from this working container (not from the image) lets the
    # host directory through, as `docker run -v DIR:/data` does.
    buildah config --volume "$VOLUME-" "$CTR"
    brun() { buildah run --isolation chroot --network host --volume "$WORK/volume:$VOLUME" "$CTR" -- "$@"; }
    # One math thread per node, as for the host node: on a loaded machine, torch's spinning OpenMP threads
    # made a step of the image's node 6x slower than the host node's.
    threads=(--env "OMP_NUM_THREADS=$OMP_NUM_THREADS")
    uid=$(buildah run --isolation chroot "$CTR" -- id -u)
    gid=$(buildah run --isolation chroot "$CTR" -- id -g)
    [[ $uid != 0 ]] && ok=0 || ok=1
    check "buildah run runs as the image's user" $ok "$USER_NAME, uid $uid"
    # No test tools in the runtime image.
    tools=$(buildah run --isolation chroot "$CTR" -- python -c \
        "import importlib.util as u; print(*[m for m in ('pytest', 'hypothesis', 'ruff', 'dockerfile_parse') if u.find_spec(m)])")
    [[ -z $tools ]] && ok=0 || ok=1
    check "no test tools in the image (pytest, hypothesis, ruff, dockerfile_parse)" $ok "${tools:-none found}"
    torch_build=$(buildah run --isolation chroot "$CTR" -- python -c "import torch; print(torch.__version__, 'cuda', torch.version.cuda)")
    [[ $torch_build == *"cuda None" ]] && ok=0 || ok=1
    check "torch in the image is the CPU build" $ok "$torch_build"

    # A volume owned by the image's user, as a named volume would be (docker copies the image's /data).
    rm -rf "$WORK/volume" "$WORK/host-node"
    mkdir -p "$WORK/volume" "$WORK/host-node"
    chown "$uid:$gid" "$WORK/volume"

    # The node outside the image: the project's own sapo-node on the host, on 127.0.0.1. It trains until
    # this script stops it, so that both runs of the image's node find it.
    say "starting a host node (outside the image)"
    setsid "${NICE[@]}" "$HOST_PYTHON" -m sapo.node.cli --output-dir "$WORK/host-node" \
        --host-maddrs /ip4/127.0.0.1/tcp/0 --max-steps 1000 --wait-for-peers 1 --wait-for-peers-timeout 900 \
        "${NODE_ARGS[@]}" >"$WORK/host-node.out" 2>&1 &
    HOST_NODE_PID=$!
    for _ in $(seq 300); do
        [[ -s $WORK/host-node/address.txt ]] && break
        kill -0 "$HOST_NODE_PID" 2>/dev/null || break
        sleep 1
    done
    HOST_ADDR=$(head -1 "$WORK/host-node/address.txt" 2>/dev/null || true)
    [[ -n $HOST_ADDR ]] && ok=0 || ok=1
    check "host node is up" $ok "${HOST_ADDR:-no address; see $WORK/host-node.out}"

    health() {  # the image's HEALTHCHECK command in the container: "exit CODE: its last line"
        local out rc
        out=$(brun "${HEALTH[@]}" 2>/dev/null) && rc=0 || rc=$?
        echo "exit $rc: $(head -1 <<<"$out")"
    }

    start_image_node() {  # start_image_node RUN MAX_STEPS [ARGS...]: the image's node in the background
        local run=$1 steps=$2
        setsid "${NICE[@]}" buildah run --isolation chroot --network host "${threads[@]}" \
            --volume "$WORK/volume:$VOLUME" "$CTR" -- \
            "${ENTRYPOINT[@]}" "${node_cmd[@]}" --initial-peers "$HOST_ADDR" --max-steps "$steps" \
            --wait-for-peers 1 --wait-for-peers-timeout 300 "${NODE_ARGS[@]}" "${@:3}" >"$WORK/image-node-$run.out" 2>&1 &
        IMAGE_NODE_PID=$!
    }

    run_image_node() {  # run_image_node RUN MAX_STEPS: the image's node; healthcheck polled while it runs
        local run=$1 steps=$2 health_log=$WORK/health-$1.log start status
        : >"$health_log"
        start_image_node "$run" "$steps"
        start=$(date +%s)
        while kill -0 "$IMAGE_NODE_PID" 2>/dev/null; do
            sleep 10
            kill -0 "$IMAGE_NODE_PID" 2>/dev/null || break
            status=$(health)
            echo "$(seconds_since "$start") s, $(cat "$WORK/volume/metrics.jsonl" 2>/dev/null | wc -l) metrics lines: $status" >>"$health_log"
        done
        wait "$IMAGE_NODE_PID" && status=0 || status=$?
        IMAGE_NODE_PID=""
        RUN_S=$(seconds_since "$start")
        return "$status"
    }

    peer_id() { grep -oE '/p2p/[A-Za-z0-9]+' "$WORK/volume/address.txt" | head -1 | cut -d/ -f3; }
    last_step() { python3 -c "
import json, sys
steps = [json.loads(l).get('step') for l in open(sys.argv[1]) if l.strip()]
print(max([s for s in steps if s is not None] or [0]))" "$WORK/volume/metrics.jsonl" 2>/dev/null || echo 0; }

    if [[ -n $HOST_ADDR ]]; then
        # Run 1.
        say "run 1: the image's node, $STEPS steps"
        run_image_node 1 "$STEPS" && ok=0 || ok=$?
        check "run 1: sapo-node in the image trains $STEPS steps and exits 0" $ok "$RUN_S s; log $WORK/image-node-1.out"
        ((ok == 0)) || tail -30 "$WORK/image-node-1.out" >&2
        grep -qE 'exit 0: (ok|degraded)' "$WORK/health-1.log" && ok=0 || ok=1
        check "run 1: healthcheck healthy while it runs" $ok "$(grep -m1 -E 'exit 0: (ok|degraded)' "$WORK/health-1.log" || tail -1 "$WORK/health-1.log")"
        status=$(health)
        [[ $status == "exit 1: unhealthy"* ]] && ok=0 || ok=1
        check "run 1: healthcheck unhealthy after it stopped" $ok "$status"
        missing=()
        for f in identity.key address.txt metrics.jsonl node.log node-run.json "checkpoint-$STEPS"; do
            [[ -e $WORK/volume/$f ]] || missing+=("$f")
        done
        ((${#missing[@]} == 0)) && ok=0 || ok=1
        check "run 1: identity, address, metrics, log, checkpoint-$STEPS in the volume" $ok \
            "${missing[*]:+missing: ${missing[*]}}$(cd "$WORK/volume" && ls | tr '\n' ' ')"
        owners=$(find "$WORK/volume" -mindepth 1 -printf '%u:%g\n' 2>/dev/null | sort | uniq -c | tr -s ' ' | tr '\n' ';')
        [[ -z $(find "$WORK/volume" -mindepth 1 ! -uid "$uid") ]] && ok=0 || ok=1
        check "run 1: every file in the volume belongs to uid $uid" $ok "$owners"
        PEER1=$(peer_id)
        STEP1=$(last_step)
        swarm_figures() {  # the most peers a node listed and the swarm groups it trained on, from its metrics
            python3 -c "
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print(max([int(r.get('sapo/peers', 0)) for r in rows] or [0]), max([int(r.get('sapo/total/external_groups', 0)) for r in rows] or [0]))" "$1" 2>/dev/null || echo "0 0"
        }
        read -r peers taken < <(swarm_figures "$WORK/volume/metrics.jsonl")
        read -r host_peers host_taken < <(swarm_figures "$WORK/host-node/metrics.jsonl")
        ((peers >= 1 && host_peers >= 1)) && ok=0 || ok=1
        check "run 1: the image's node and the host node list each other" $ok \
            "peers listed: image node $peers, host node $host_peers; swarm groups trained on so far: image node $taken, host node $host_taken; image peer id $PEER1"

        # Run 2: the same volume, one step more.
        say "run 2: the same volume, $((STEPS + 1)) steps"
        run_image_node 2 "$((STEPS + 1))" && ok=0 || ok=$?
        check "run 2: exits 0" $ok "$RUN_S s; log $WORK/image-node-2.out"
        ((ok == 0)) || tail -30 "$WORK/image-node-2.out" >&2
        PEER2=$(peer_id)
        [[ -n $PEER1 && $PEER1 == "$PEER2" ]] && ok=0 || ok=1
        check "run 2: same peer id" $ok "$PEER1 -> $PEER2"
        resumed=$(grep -m1 -o 'resuming from [^ ]*' "$WORK/volume/node.log" || true)
        STEP2=$(last_step)
        [[ -n $resumed && $STEP2 == $((STEPS + 1)) ]] && ok=0 || ok=1
        check "run 2: resumes from the checkpoint and trains on" $ok "${resumed:-no resume line}; last step $STEP1 -> $STEP2"

        # Run 3: `docker stop` during a step. Docker sends the image's STOPSIGNAL to the container's PID 1 (the
        # ENTRYPOINT's process: sapo-node) and SIGKILL once the grace has passed; here that process is a host
        # process of this session (chroot isolation), so the script does the same to it by its id, once the node
        # reports (status.json in the volume) that it works on the step after step N in a phase a stop abandons:
        # timed by the node's state, not by seconds, so it never lands after that step's end or in a periodic save.
        # Step N is one the periodic save skips (a resumed run keeps the --save-steps of the checkpoint it resumes
        # from: transformers' TrainerState), so its checkpoint can only be the stop's own.
        save_every=$(printf '%s\n' "${NODE_ARGS[@]}" | awk 'p == "--save-steps" || p == "--save_steps" { v = $0 } { p = $0 } END { print int(v) }')
        stop_after=$((STEP2 + 1))
        while ((save_every > 0 && stop_after % save_every == 0)); do stop_after=$((stop_after + 1)); done
        say "run 3: the same volume; SIGTERM while step $((stop_after + 1)) fetches, scores, generates or trains, SIGKILL $STOP_TIMEOUT s later"
        start_image_node 3 $((stop_after + 20))
        start=$(date +%s)
        node_state() {  # "STEP PHASE" from the node's status.json (one line of JSON, written atomically)
            sed -n 's/.*"phase": "\([^"]*\)", "step": \([0-9]*\).*/\2 \1/p' "$WORK/volume/status.json" 2>/dev/null || true
        }
        abandonable="^$((stop_after + 1)) (fetching swarm groups|scoring swarm groups|generating|scoring|training)\$"
        while kill -0 "$IMAGE_NODE_PID" 2>/dev/null && ! [[ $(node_state) =~ $abandonable ]] \
            && (($(seconds_since "$start") < 1800)); do
            sleep 0.05
        done
        STOP_PHASE=$(node_state)
        # sapo-node's process in the run's session (setsid made IMAGE_NODE_PID its id); buildah is its parent.
        node_pid=$(ps -o pid=,comm= -s "$IMAGE_NODE_PID" | awk '$2 == "sapo-node" || $2 ~ /^python/ { print $1; exit }' || true)
        status="" killed=0 STOP_S="" done_step=0 existed=0
        if [[ -n $node_pid && $STOP_PHASE =~ $abandonable ]]; then
            done_step=$(last_step)  # the last completed step when the signal is sent
            [[ -e $WORK/volume/checkpoint-$done_step ]] && existed=1
            stopped=$(date +%s.%N)
            kill -TERM "$node_pid" 2>/dev/null || true
            while kill -0 "$IMAGE_NODE_PID" 2>/dev/null && awk -v s="$stopped" -v n="$(date +%s.%N)" -v g="$STOP_TIMEOUT" 'BEGIN { exit !(n - s < g) }'; do
                sleep 0.1
            done
            if kill -0 "$IMAGE_NODE_PID" 2>/dev/null; then
                killed=1
                kill -KILL "$node_pid" 2>/dev/null || true
            fi
            STOP_S=$(awk -v s="$stopped" -v n="$(date +%s.%N)" 'BEGIN { printf "%.1f", n - s }')
        fi
        wait "$IMAGE_NODE_PID" && status=0 || status=$?
        IMAGE_NODE_PID=""
        [[ -n $STOP_S && $killed == 0 && $status == 0 ]] && ok=0 || ok=1
        check "run 3: docker stop in step $((done_step + 1)) (SIGTERM to sapo-node while ${STOP_PHASE#* }, grace $STOP_TIMEOUT s): exits 0 in the grace" $ok \
            "${STOP_S:-never signalled (the node ended or did not reach step $((stop_after + 1)); log $WORK/image-node-3.out)}${STOP_S:+ s after SIGTERM}, exit $status$( ((killed)) && echo ', SIGKILLed')"
        ((ok == 0)) || tail -30 "$WORK/image-node-3.out" >&2
        stop_lines=$(grep -E 'SIGTERM|stopped by|checkpoint' "$WORK/image-node-3.out" | tail -4 | cut -c21-170 | tr '\n' ' ' || true)
        [[ $done_step -gt 0 && $existed == 0 && -f $WORK/volume/checkpoint-$done_step/sapo-complete.json ]] && ok=0 || ok=1
        check "run 3: the stop writes a complete checkpoint-$done_step (its last completed step), absent when SIGTERM was sent" $ok \
            "$( ((existed)) && echo 'it existed before the signal (a periodic save): the stop wrote nothing checked here; ')$stop_lines"

        # Run 4: resumes from the stop's checkpoint.
        say "run 4: the same volume, resumes from checkpoint-$done_step"
        run_image_node 4 "$((done_step + 1))" && ok=0 || ok=$?
        resumed=$(grep -o "resuming from [^ ]*checkpoint-$done_step\b" "$WORK/image-node-4.out" | tail -1 || true)
        STEP4=$(last_step)
        [[ $ok == 0 && -n $resumed && $STEP4 == $((done_step + 1)) ]] && ok=0 || ok=1
        check "run 4: resumes from the stop's checkpoint and trains on" $ok "${resumed:-no resume line}; last step $STEP4; $RUN_S s"
    fi
    buildah rm "$CTR" >/dev/null && CTR=""
fi
stop_group "$HOST_NODE_PID"
HOST_NODE_PID=""

# ----------------------------------------------------------------------------------------------------
# the log
TOTAL_S=$(seconds_since "$SCRIPT_START")
mb() { [[ -n $1 ]] && awk -v b="$1" 'BEGIN { printf "%.0f MB", b / 1e6 }' || echo "-"; }
summary=(
    "# docker/build_check.sh"
    ""
    "Built and ran the CPU community-node image with buildah on $(date -u '+%Y-%m-%d %H:%M UTC'), commit $COMMIT"
    "(tracked files changed since it: ${DIRTY:-none}), $(nproc --all) cores, $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo),"
    "machine shared with other work; the build and the nodes ran at the lowest CPU and I/O priority. $BUILDAH_VERSION."
    ""
    "| figure | value |"
    "|---|---|"
    "| base image ($BASE_IMAGE, Debian bookworm minbase + python3) | $(mb "$BASE_SIZE"), $base_note |"
    "| image ($IMAGE) | $(mb "$IMAGE_SIZE") |"
    "| torch wheel | docker/wheels/$TORCH_WHEEL (TORCH_WHEELS=docker/wheels; the index: pip's configuration) |"
    "| build | ${BUILD_S:-} s (RUN/COPY steps run: $BUILD_STEPS; FRESH=${FRESH:-0}: 1 is without buildah's layer cache) |"
    "| rebuild after a source change (swarm/clock.py) | ${REBUILD_S:--} s |"
    "| whole script | $TOTAL_S s |"
    ""
    "Node settings for both nodes: \`${NODE_ARGS[*]}\`; the image's node ran its image's ENTRYPOINT and CMD"
    "(its --host-maddrs moved from 0.0.0.0 to 127.0.0.1) plus \`--initial-peers <host node> --max-steps N"
    "--wait-for-peers 1\`, run 1 with N=$STEPS, run 2 on the same volume with N=$((STEPS + 1)); run 3 stopped as"
    "\`docker stop\` stops a container (SIGTERM to sapo-node in a step's work, SIGKILL after $STOP_TIMEOUT s), run 4"
    "resuming from its checkpoint."
    ""
    "| check | result | detail |"
    "|---|---|---|"
)
{
    printf '%s\n' "${summary[@]}"
    printf '%s\n' "${REPORT[@]}" | grep '^|' || true
    echo
    printf '%s\n' "${REPORT[@]}" | grep -v '^|' || true
    for run in 1 2 4; do
        if [[ -f $WORK/health-$run.log ]]; then
            printf '\nHealthcheck while run %s trained (every 10 s):\n\n```\n' "$run"
            cat "$WORK/health-$run.log"
            printf '```\n'
        fi
    done
    if [[ -n $IMAGE_SIZE ]]; then
        printf '\nThe image'"'"'s layers (podman history, non-empty):\n\n```\n'
        podman history --format '{{.Size}}\t{{.CreatedBy}}' "$IMAGE" 2>/dev/null | grep -v '^0 B' \
            | sed -E 's/\|[0-9]+ [A-Z_]+=[^ ]* [A-Z_]+=[^ ]* //' | cut -c1-150
        printf '```\n'
    fi
    if [[ -f $WORK/volume/metrics.jsonl ]]; then
        printf '\nmetrics.jsonl of the image node (both runs):\n\n```\n'
        cut -c1-400 "$WORK/volume/metrics.jsonl"
        printf '```\n'
    fi
    if [[ -f $WORK/volume/node.log ]]; then
        printf '\nnode.log of the image node (both runs):\n\n```\n'
        cat "$WORK/volume/node.log"
        printf '```\n'
    fi
    ((${#FAILURES[@]} == 0)) && echo "All checks passed." || echo "FAILED: ${FAILURES[*]}"
} >"$WORK/report.md"
[[ -n $LOG_MD ]] && cp "$WORK/report.md" "$LOG_MD"
cat "$WORK/report.md" | head -40 >&2
((${#FAILURES[@]} == 0))
