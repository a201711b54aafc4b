#!/usr/bin/env bash
# Builds zoffload and runs its tests: a normal build with CUDA (when nvcc is
# present) running every test, an ASan+UBSan build running the unit tests, a
# TSan build running the threaded tests, and an aarch64 cross build whose unit
# tests run under qemu-user. Prints one closing line with totals.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
bash tools/scripts/install-deps.sh
export PATH=/usr/local/cuda/bin:$PATH
jobs=$(nproc)
# CI builds fewer GPU architectures than the default (80;86;89;90) to save time.
archs=${ZO_CUDA_ARCHS:-80;90}
# The ctest stages run this many tests at once (ZO_TEST_JOBS=1: one by one).
# The tests say what they need (PROCESSORS: ranks and pinned threads;
# RUN_SERIAL: a pass that depends on time; tests/CMakeLists.txt), so -j does
# not oversubscribe the ranks nor crowd a timed test.
test_jobs=${ZO_TEST_JOBS:-$jobs}
logdir=$root/build-logs
mkdir -p "$logdir"
passed=0; failed=0; skipped=0

run_ctest() { # name builddir ctest-args...
  local name=$1 dir=$2; shift 2
  echo "== $name: ctest $*"
  local rc=0
  (cd "$dir" && ctest --output-on-failure --timeout 900 "$@") 2>&1 | tee "$logdir/$name.log" || rc=$?
  local line
  line=$(grep -E "tests passed, [0-9]+ tests? failed out of" "$logdir/$name.log" | tail -1 || true)
  if [ -z "$line" ]; then
    if grep -q "No tests were found" "$logdir/$name.log"; then return 0; fi
    echo "zoffload: $name: ctest printed no summary" >&2; failed=$((failed + 1)); return 0
  fi
  local total nfail nskip
  total=$(sed -E 's/.*out of ([0-9]+).*/\1/' <<<"$line")
  nfail=$(sed -E 's/.*passed, ([0-9]+) tests? failed.*/\1/' <<<"$line")
  nskip=$( (grep -E "^\s+[0-9]+ - .*\(Skipped\)" "$logdir/$name.log" || true) | wc -l)
  passed=$((passed + total - nfail - nskip)); failed=$((failed + nfail)); skipped=$((skipped + nskip))
  return 0
}

build() { # dir cmake-args...
  local dir=$1; shift
  cmake -S "$root" -B "$dir" -G Ninja -DZO_WERROR=ON "$@" >"$logdir/$(basename "$dir")-configure.log"
  cmake --build "$dir" -j "$jobs"
}

# The Python environment (torch, transformers, pytest), made once per machine: the
# front end's tests use it, and so does hf_parity (zo-train beside transformers).
venv_python=$(bash tools/scripts/python-env.sh | tail -1)
export ZO_PARITY_VENV=${ZO_PARITY_VENV:-$(dirname "$(dirname "$venv_python")")}

echo "== build (CUDA when nvcc is present, archs $archs)"
build "$root/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CUDA_ARCHITECTURES=$archs"
grep -E "zoffload: CUDA backend" "$logdir/build-configure.log" || true
run_ctest all "$root/build" -j "$test_jobs" -LE timing

echo "== the PyTorch front end: pytest tests/python"
run_pytest() {
  local rc=0 line
  ZOFFLOAD_BUILD_DIR=$root/build "$venv_python" -m pytest -q -rs tests/python 2>&1 |
    tee "$logdir/pytest.log" || rc=$?
  line=$(grep -E "^[0-9]+ (passed|failed|skipped)|^=+ .*(passed|failed).* in " "$logdir/pytest.log" | tail -1 || true)
  local np nf ns
  np=$(grep -oE "[0-9]+ passed" <<<"$line" | grep -oE "[0-9]+" || echo 0)
  nf=0
  for n in $(grep -oE "[0-9]+ (failed|errors?)" <<<"$line" | grep -oE "^[0-9]+" || true); do
    nf=$((nf + n))
  done
  ns=$(grep -oE "[0-9]+ skipped" <<<"$line" | grep -oE "[0-9]+" || echo 0)
  if [ -z "$line" ] || { [ "$rc" -ne 0 ] && [ "${nf:-0}" -eq 0 ]; }; then nf=$((${nf:-0} + 1)); fi
  passed=$((passed + ${np:-0})); failed=$((failed + ${nf:-0})); skipped=$((skipped + ${ns:-0}))
}
run_pytest

echo "== build with ASan+UBSan"
build "$root/build-asan" -DCMAKE_BUILD_TYPE=Debug -DZO_ENABLE_CUDA=OFF -DZO_SANITIZE=address,undefined
# intercept_tls_get_addr=0: GCC 12's LeakSanitizer misreads glibc 2.36's dynamic TLS
# table when it tracks it through __tls_get_addr, and its tracer then crashes at exit
# ("Tracer caught signal 11", "DTLS ... at 0x22d-0x40000132f"; zo-train runs that load a
# library using dynamic TLS). Static TLS, stacks and the heap are still scanned.
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:intercept_tls_get_addr=0 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  run_ctest asan "$root/build-asan" -j "$test_jobs" -L unit -LE slow

echo "== build with TSan"
build "$root/build-tsan" -DCMAKE_BUILD_TYPE=Debug -DZO_ENABLE_CUDA=OFF -DZO_SANITIZE=thread
TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
  run_ctest tsan "$root/build-tsan" -j "$test_jobs" -L tsan

# aarch64: cross-built with Debian's gcc-aarch64-linux-gnu against multiarch's arm64
# libraries (cmake/aarch64-linux-gnu.cmake), the tests run under qemu-user on a plain
# ARMv8.0 CPU model (Cortex-A53): the NEON optimizer, the cpu device and its ops, the swap
# store (sync and null engines: qemu-user 7.2 answers io_uring_setup with ENOSYS), the
# communicator's tables, the engine on the cpu device, and zo-report/zo-bench naming NEON.
# Not the trainers' tests nor multi-rank runs (time). ZO_ARM64=0 leaves it out.
if [ "${ZO_ARM64:-1}" != 0 ]; then
  echo "== aarch64: cross build, tests under qemu-aarch64 -cpu cortex-a53"
  if bash tools/scripts/install-deps-arm64.sh; then
    build "$root/build-arm64" --toolchain "$root/cmake/aarch64-linux-gnu.cmake" \
      -DCMAKE_BUILD_TYPE=RelWithDebInfo -DZO_ENABLE_CUDA=OFF -DZO_ONEDNN=OFF \
      "-DZO_TEST_DIRS=${ZO_ARM64_TEST_DIRS:-optim;device;kernels;swap;comm;engine}"
    run_ctest arm64 "$root/build-arm64" -j "$test_jobs" -L unit -LE "slow|lint"
  else
    failed=$((failed + 1))
  fi
else
  echo "== aarch64: left out (ZO_ARM64=0)"
  skipped=$((skipped + 1))
fi

if [ -x tools/scripts/run-fuzz.sh ]; then
  bash tools/scripts/run-fuzz.sh || failed=$((failed + 1))
fi

echo "total: $passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
