#!/usr/bin/env bash
# Checks that every C, CUDA and header file tracked by git is formatted as
# .clang-format says (clang-format 14, Debian 12's), naming each file that is
# not; --fix formats them in place. Run by ctest (label lint) and so by CI.
# Exits 77 (skipped) where clang-format is missing, saying so.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
fix=0
case "${1:-}" in
  --fix) fix=1 ;;
  "") ;;
  -h|--help) echo "usage: $0 [--fix]   check (or fix) the formatting of every tracked .c/.h/.cu file"; exit 0 ;;
  *) echo "check-format: unknown argument '$1' (expected --fix or nothing)" >&2; exit 2 ;;
esac
cf=$(command -v clang-format-14 || command -v clang-format || true)
if [ -z "$cf" ]; then
  echo "check-format: SKIPPED: clang-format not found (Debian package clang-format)"
  exit 77
fi
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files '*.c' '*.h' '*.cu')
else # a source tarball: every such file under the top-level folders
  mapfile -t files < <(find include kernels offload swap optim tools tests \
                         -name '*.c' -o -name '*.h' -o -name '*.cu' | sort)
fi
if ((fix)); then
  "$cf" -i --style=file "${files[@]}"
  echo "check-format: formatted ${#files[@]} files"
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  if ! "$cf" --style=file --assume-filename="$f" <"$f" | cmp -s - "$f"; then
    bad+=("$f")
  fi
done
if ((${#bad[@]})); then
  echo "check-format: ${#bad[@]} of ${#files[@]} files are not formatted as .clang-format says:"
  printf '  %s\n' "${bad[@]}"
  echo "check-format: run 'bash tools/scripts/check-format.sh --fix' (or clang-format -i FILE) and commit"
  exit 1
fi
echo "check-format: ${#files[@]} files formatted as .clang-format says"
