#!/usr/bin/env bash
# Runs hf_parity.py with a Python that has torch and transformers (python3, or
# the venv in ZO_PARITY_VENV); exits 77 (skipped) where there is none.
# tests/train/make_parity_venv.sh makes such a venv.
set -euo pipefail
py=python3
if [ -n "${ZO_PARITY_VENV:-}" ] && [ -x "$ZO_PARITY_VENV/bin/python3" ]; then
  py=$ZO_PARITY_VENV/bin/python3
fi
if ! "$py" -c 'import torch, transformers, safetensors' 2>/dev/null; then
  echo "skipped: no Python with torch, transformers and safetensors (set ZO_PARITY_VENV)"
  exit 77
fi
exec "$py" "$@"
