#!/usr/bin/env bash
# Installs the Debian packages zoffload needs that are missing (Debian 12, as root).
# The CUDA Toolkit (nvcc, cuBLAS, NCCL) is not a Debian 12 package: when nvcc is
# absent the build goes on without the cuda backend and says so.
set -euo pipefail
pkgs=(build-essential cmake ninja-build pkgconf git
      libnuma-dev liburing-dev libhwloc-dev hwloc libjansson-dev libxxhash-dev
      libopenblas-dev libdnnl-dev libcmocka-dev libopenmpi-dev openmpi-bin fio clang libclang-rt-14-dev clang-format python3
      python3-venv)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "zoffload: installing missing Debian packages: ${missing[*]}"
  if [ "$(id -u)" -ne 0 ]; then
    echo "zoffload: need root to install packages (run as root or with sudo)" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if ! command -v nvcc >/dev/null && [ ! -x /usr/local/cuda/bin/nvcc ]; then
  echo "zoffload: nvcc not found: building without the cuda backend (install the CUDA Toolkit for GPUs)"
fi
