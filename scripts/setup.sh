#!/usr/bin/env bash
# Create .venv and install gridtune with everything its tests and the engine need.
# torch==2.13.0 goes in first: a bare `torch` requirement with no torch installed would pull a
# multi-GB CUDA build; the project itself only asks for a range (users bring their own torch).
# Idempotent: re-running it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  .venv/bin/python -m pip install -q "torch==${GRIDTUNE_TORCH_VERSION:-2.13.0}"
fi
# the frameworks extra would otherwise be free to replace torch: keep the one installed
TORCH_PIN=$(mktemp)
.venv/bin/python -c 'import torch; print("torch==" + torch.__version__)' > "$TORCH_PIN"
.venv/bin/python -m pip install -q -e ".[dev,engine,postgres,frameworks]" -c "$TORCH_PIN"
rm -f "$TORCH_PIN"
echo "gridtune installed in .venv ($(.venv/bin/python -c 'import torch; print("torch", torch.__version__)'))"
