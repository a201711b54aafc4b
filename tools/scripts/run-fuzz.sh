#!/usr/bin/env bash
# Builds the libFuzzer targets with clang + ASan and runs each for a bounded
# time (ZO_FUZZ_SECONDS, default 30). A crash fails the run.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p build-logs
secs=${ZO_FUZZ_SECONDS:-30}
if ! command -v clang >/dev/null; then
  echo "zoffload: clang not found: fuzzing skipped (install the Debian packages clang and libclang-rt-14-dev)"
  exit 0
fi
echo "== fuzz: clang + libFuzzer + ASan, ${secs}s per target"
# The tools are built for the checkpoint loader's target (zo-train's library).
cmake -S . -B build-fuzz -G Ninja -DCMAKE_C_COMPILER=clang -DZO_ENABLE_CUDA=OFF -DZO_BUILD_TOOLS=ON \
  -DZO_FUZZ=ON -DZO_SANITIZE=address -DCMAKE_C_FLAGS=-fsanitize=fuzzer-no-link >build-logs/fuzz-configure.log
ninja -C build-fuzz fuzz_config fuzz_safetensors fuzz_checkpoint
mkdir -p build-fuzz/fuzz-corpus build-fuzz/fuzz-st-corpus build-fuzz/fuzz-ckpt-corpus
build-fuzz/tests/config/fuzz_config -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
  -dict=tests/config/config.dict build-fuzz/fuzz-corpus tests/config/corpus 2>build-logs/fuzz-config.log \
  || { tail -40 build-logs/fuzz-config.log; exit 1; }
tail -1 build-logs/fuzz-config.log
build-fuzz/tests/safetensors/fuzz_safetensors -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
  -dict=tests/safetensors/safetensors.dict build-fuzz/fuzz-st-corpus tests/safetensors/corpus \
  2>build-logs/fuzz-st.log || { tail -40 build-logs/fuzz-st.log; exit 1; }
tail -1 build-logs/fuzz-st.log
build-fuzz/tests/train/fuzz_checkpoint -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
  build-fuzz/fuzz-ckpt-corpus tests/train/ckpt-corpus 2>build-logs/fuzz-ckpt.log \
  || { tail -40 build-logs/fuzz-ckpt.log; exit 1; }
tail -1 build-logs/fuzz-ckpt.log
