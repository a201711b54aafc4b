#!/usr/bin/env bash
# Makes the venv the parity test runs in: torch (the CPU build from PyTorch's
# index where it can be reached, else PyPI's), transformers and safetensors.
#   bash tests/train/make_parity_venv.sh [DIR]   (default ~/.cache/zoffload/parity-venv)
#   ZO_PARITY_VENV=DIR ctest -R test_hf_parity
set -euo pipefail
dir=${1:-$HOME/.cache/zoffload/parity-venv}
python3 -m venv "$dir"
pip=$dir/bin/pip
"$pip" install --quiet --index-url https://download.pytorch.org/whl/cpu torch ||
  "$pip" install --quiet torch
"$pip" install --quiet transformers safetensors
echo "make_parity_venv: ready; run: ZO_PARITY_VENV=$dir ctest -R test_hf_parity"
