#!/usr/bin/env bash
# Installs what the aarch64 stage of run-tests.sh needs, all Debian 12
# packages (as root): the cross compiler gcc-aarch64-linux-gnu, qemu-user to
# run its programs, and zoffload's libraries for arm64 through multiarch
# (dpkg --add-architecture arm64). Adding an architecture makes apt-get
# update fetch its package lists; if that fails here, the architecture is
# removed again so apt keeps working, and the script says so and fails.
# Multiarch keeps Multi-Arch: same packages at one version on both
# architectures, so apt may upgrade a few amd64 packages to their newest
# bookworm point release (libssl3, systemd's libraries, linux-libc-dev).
set -euo pipefail
host_pkgs=(gcc-aarch64-linux-gnu qemu-user)
arm_pkgs=(libcmocka-dev libnuma-dev liburing-dev libhwloc-dev libjansson-dev libxxhash-dev
          libopenblas-dev)
missing=()
for p in "${host_pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
for p in "${arm_pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p:arm64" 2>/dev/null | grep -q "install ok installed" ||
    missing+=("$p:arm64")
done
((${#missing[@]})) || exit 0
echo "zoffload: installing Debian packages for the aarch64 stage: ${missing[*]}"
if [ "$(id -u)" -ne 0 ]; then
  echo "zoffload: need root to install packages (run as root or with sudo)" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
if ! dpkg --print-foreign-architectures | grep -qx arm64; then
  dpkg --add-architecture arm64
  if ! apt-get update -qq; then
    dpkg --remove-architecture arm64
    apt-get update -qq || true
    echo "zoffload: apt-get update fails with the arm64 architecture added (its package lists" \
      "are not on this machine's mirrors?); removed it again. The aarch64 stage needs" \
      "multiarch arm64 (or set ZO_ARM64=0 to leave the stage out)" >&2
    exit 1
  fi
else
  apt-get update -qq
fi
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
