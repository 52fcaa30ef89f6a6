#!/usr/bin/env bash
# Create .venv and install costmodel with its test tools.
#
# torch: an importable torch is kept (a GPU user's CUDA build in the base Python is reused
# through --system-site-packages); otherwise torch==2.13.0 is installed, which on these
# machines resolves to the local CPU wheel instead of gigabytes of CUDA packages.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  if "$PY" -c "import torch" 2>/dev/null; then
    "$PY" -m venv --system-site-packages .venv
  else
    "$PY" -m venv .venv
  fi
fi
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  .venv/bin/python -m pip install --quiet "torch==2.13.0"
fi
.venv/bin/python -m pip install --quiet -e ".[dev]"
.venv/bin/python -c "import torch, costmodel; print(f'costmodel ready (torch {torch.__version__})')"
