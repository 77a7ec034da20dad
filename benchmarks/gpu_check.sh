#!/usr/bin/env bash
# The handout's Qwen2.5 pair with random weights on a GPU (or --device cpu):
# c, v(n), tokens/s and greedy identity. Needs only torch, transformers and
# specdec_rs installed; nothing is downloaded. See benchmarks/gpu_check.py.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
exec "$PYTHON" benchmarks/gpu_check.py "$@"
