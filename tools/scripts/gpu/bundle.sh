#!/usr/bin/env bash
# Run here, from the project's root, before a device call: builds zoffload for Hopper (sm_90) with nvcc (it compiles
# here; nothing runs), and packs into .gpu/ (kept out of git) what a bare GPU machine without network needs: every
# tool and test executable, libzoffload and the Python package (the PyTorch front end), zo-train's corpus, the
# non-CUDA shared libraries they load, and the on-device scripts. Then, through the device tool's run with
# carry [".gpu"]: bash .gpu/on-device.sh [runs...] (on-device.sh lists the runs).
set -euo pipefail
root=$(git rev-parse --show-toplevel); cd "$root"
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
for p in /.gpu/ /build-gpu/; do grep -qxF "$p" .git/info/exclude 2>/dev/null || echo "$p" >>.git/info/exclude; done
export PATH=/usr/local/cuda/bin:$PATH
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DZO_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 >/dev/null
cmake --build build-gpu -j"$(nproc)" >/dev/null
rm -rf .gpu && mkdir -p .gpu/stage/bin .gpu/stage/lib .gpu/stage/python
find build-gpu/tools build-gpu/tests -type f -perm -u+x ! -name '*.so*' ! -path '*/CMakeFiles/*' ! -name '*.sh' \
  -exec cp {} .gpu/stage/bin/ \;
[ -d build-gpu/tools/zo-train/data ] && cp -r build-gpu/tools/zo-train/data .gpu/stage/bin/data
cp -L build-gpu/libzoffload.so build-gpu/libzoffload_dsconfig.so .gpu/stage/lib/
cp -r tools/python/zoffload .gpu/stage/python/ && find .gpu/stage/python -name __pycache__ -prune -exec rm -rf {} +
# Shared libraries the executables load, less glibc's and the CUDA ones (the GPU machine has its own, matching its driver).
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|librt\.so|libpthread\.so|libstdc\+\+|libgcc_s|libcuda\.so|libcudart|libcublas|libcublasLt|libnccl|libnvToolsExt)'
for f in .gpu/stage/bin/* .gpu/stage/lib/libzoffload*.so; do [ -f "$f" ] && ldd "$f" 2>/dev/null | awk '$3 ~ /^\// {print $1, $3}'; done | sort -u |
  while read -r name path; do
    if ! echo "$name" | grep -Eq "$skip"; then cp -L "$path" ".gpu/stage/lib/$name"; fi
  done
# the gpu-labelled tests, as "name binary args..." lines
ctest --test-dir build-gpu -L gpu --show-only=json-v1 | python3 -c '
import json, os, sys
for t in json.load(sys.stdin)["tests"]:
    c = t["command"]; print(t["name"], os.path.basename(c[0]), *c[1:])' >.gpu/stage/gpu-tests.txt
cp "$here/on-device.sh" "$here/torch_baseline.py" "$here/sdpa_bench.py" .gpu/
tar -C .gpu -cJf .gpu/bundle.tar.xz stage && rm -rf .gpu/stage
du -sh .gpu
echo "ready: run bash .gpu/on-device.sh through the device tool with carry [\".gpu\"]"
