#!/usr/bin/env bash
# The include wall: fails when a source file includes another part's private
# header. A part's private headers are the .h files directly in its folders;
# what it offers the other parts lives in <part>/interface and may be
# included by whoever links the part. The compiler already refuses a private
# header that is not on the include path; this also catches relative paths
# ("../../offload/hostpool/hostpool_internal.h") and include dirs added by
# hand. A test folder may include a part's private headers only when its
# CMakeLists.txt names the part with zo_part_internal_for_tests.
#
# It also refuses a cycle among the parts (target_link_libraries between
# parts must point one way; CMake itself accepts cycles of static libraries).
#
# Usage: check-walls.sh [<build>/zo_parts.txt]   (written by cmake configure)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
manifest=${1:-$root/build/zo_parts.txt}
[ -f "$manifest" ] || { echo "check-walls: no $manifest: configure with cmake first" >&2; exit 2; }

declare -A part_of_dir=() owner_of_header=() headers_named=() allowed=() uses=()
while read -r kind a b; do
  case $kind in
  part)
    IFS=, read -ra dirs <<<"$b"
    for d in "${dirs[@]}"; do
      part_of_dir[$d]=$a
      for h in "$d"/*.h "$d"/*.cuh; do
        [ -e "$h" ] || continue
        owner_of_header[$h]=$a
        headers_named[${h##*/}]+="$h "
      done
    done
    ;;
  test) allowed[$a]+=" $b " ;;
  uses) uses[$a]=${b//,/ } ;;
  esac
done <"$manifest"
[ "${#part_of_dir[@]}" -gt 0 ] || { echo "check-walls: no parts in $manifest" >&2; exit 2; }
for d in "${!part_of_dir[@]}"; do
  case $d in "$root"/*) ;; *) echo "check-walls: $manifest describes another tree ($d)" >&2; exit 2 ;; esac
done

# Peel off the parts that use no remaining part or that no remaining part
# uses; what is left holds a cycle.
check_no_cycle() {
  local -A left=()
  local p q progress=1 uses_left used_by_left
  for p in "${!uses[@]}"; do left[$p]=1; done
  while [ "$progress" -eq 1 ]; do
    progress=0
    for p in "${!left[@]}"; do
      uses_left=0 used_by_left=0
      for q in ${uses[$p]}; do [ -n "${left[$q]:-}" ] && uses_left=1; done
      for q in "${!left[@]}"; do
        case " ${uses[$q]} " in *" $p "*) used_by_left=1 ;; esac
      done
      [ "$uses_left" -eq 1 ] && [ "$used_by_left" -eq 1 ] && continue
      unset "left[$p]"
      progress=1
    done
  done
  [ "${#left[@]}" -eq 0 ] && return 0
  for p in "${!left[@]}"; do
    echo "check-walls: part $p is in a cycle of parts: it uses ${uses[$p]}" >&2
  done
  return 1
}

# The part a file belongs to: the nearest enclosing folder that is a part's.
part_of_file() {
  local d=${1%/*}
  while [ "${#d}" -ge "${#root}" ]; do
    if [ -n "${part_of_dir[$d]:-}" ]; then echo "${part_of_dir[$d]}"; return; fi
    d=${d%/*}
  done
  echo ""
}

# The private headers an include can reach: relative to the including file
# first (as the compiler looks), else any part's private header of that name.
reachable_headers() { # file name
  local dir=${1%/*} name=$2 h
  if [ -e "$dir/$name" ]; then
    realpath -m "$dir/$name"
    return
  fi
  for h in ${headers_named[${name##*/}]:-}; do
    case $h in */"$name") echo "$h" ;; esac
  done
}

failures=0
cycles=0
check_no_cycle || cycles=1
mapfile -t files < <(find "$root"/include "$root"/kernels "$root"/offload "$root"/swap "$root"/optim \
  "$root"/tools "$root"/tests -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) | sort)
re='^[[:space:]]*#[[:space:]]*include[[:space:]]*"([^"]+)"'
while IFS= read -r hit; do
  f=${hit%%:*} rest=${hit#*:}
  n=${rest%%:*} text=${rest#*:}
  [[ $text =~ $re ]] || continue
  name=${BASH_REMATCH[1]}
  mine=$(part_of_file "$f")
  while IFS= read -r h; do
    owner=${owner_of_header[$h]:-}
    [ -n "$owner" ] && [ "$owner" != "$mine" ] || continue
    case ${allowed[${f%/*}]:-} in *" $owner "*) continue ;; esac
    echo "${f#"$root"/}:$n: includes \"$name\", private to part $owner (${h#"$root"/});" \
      "use what $owner offers in its interface/ folder or the public API" \
      "(a test may name the part with zo_part_internal_for_tests)" >&2
    failures=$((failures + 1))
  done < <(reachable_headers "$f" "$name")
done < <(grep -Hn -E "$re" "${files[@]}")
if [ "$failures" -gt 0 ]; then
  echo "check-walls: $failures include(s) cross a part's wall (docs/ARCHITECTURE.md)" >&2
fi
if [ "$cycles" -gt 0 ]; then
  echo "check-walls: the parts must use each other one way (docs/ARCHITECTURE.md)" >&2
fi
[ "$failures" -eq 0 ] && [ "$cycles" -eq 0 ] || exit 1
echo "check-walls: ${#files[@]} files, ${#uses[@]} parts: no include crosses a wall, no cycle"
