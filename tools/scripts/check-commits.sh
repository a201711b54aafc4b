#!/usr/bin/env bash
# Checks the commit habit from the commit that added this check on: every
# subject at most 72 characters, and a blank line between subject and body.
# Older history is left as it was. Exits 77 (skipped) outside a full git clone.
# Install as a hook with: ln -s ../../tools/scripts/check-commits.sh .git/hooks/commit-msg
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
check_message() { # file label
  local subject second
  subject=$(sed -n 1p "$1"); second=$(sed -n 2p "$1")
  if ((${#subject} > 72)); then
    echo "check-commits: $2: subject is ${#subject} characters (at most 72): $subject"; return 1
  fi
  if [ -n "$second" ]; then
    echo "check-commits: $2: the second line must be blank (subject, blank line, body)"; return 1
  fi
}
if [ $# -eq 1 ] && [ -f "$1" ]; then # as a commit-msg hook
  check_message "$1" "this commit"; exit
fi
cd "$root"
if [ "$(git rev-parse --is-shallow-repository 2>/dev/null)" != false ]; then
  echo "check-commits: SKIPPED: not a full git clone (shallow, or an exported tree)"; exit 77
fi
# The first commit that added this script; uncommitted, only HEAD's own.
base=$(git log --diff-filter=A --format=%H -- tools/scripts/check-commits.sh | tail -n 1)
base=${base:-HEAD}
tmp=$(mktemp); trap 'rm -f "$tmp"' EXIT
bad=0; n=0
for c in $base $(git rev-list "$base..HEAD"); do
  git log -1 --format=%B "$c" >"$tmp"
  n=$((n + 1))
  check_message "$tmp" "$(git log -1 --format=%h "$c")" || bad=$((bad + 1))
done
if ((bad)); then echo "check-commits: $bad of $n commits from $(git log -1 --format=%h "$base") on break the habit"; exit 1; fi
echo "check-commits: $n commits from $(git log -1 --format=%h "$base") on, every subject at most 72 characters"
