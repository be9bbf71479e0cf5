#!/usr/bin/env bash
# One-time set-up on a fresh machine: a virtual environment with the project and its test tools.
# torch is pinned and installed first, then every later install is constrained to it, so pip never
# swaps the CPU build for a multi-GB CUDA one. On a GPU machine: DPR_EXTRA=gpu DPR_TORCH=torch bash scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
TORCH_SPEC="${DPR_TORCH:-torch==2.13.0}"
EXTRA="${DPR_EXTRA:-cpu}"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip setuptools wheel
.venv/bin/python -m pip install -q "$TORCH_SPEC"
.venv/bin/python -m pip freeze | grep -i '^torch==' > .venv/constraints.txt
.venv/bin/python -m pip install -q -c .venv/constraints.txt -e ".[${EXTRA},dev]"
.venv/bin/python -c "import torch, dpr; print('dpr ready; torch', torch.__version__)"
