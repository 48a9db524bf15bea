#!/usr/bin/env bash
# Installs moh's dependencies from Debian packages (idempotent; sudo only when not root).
#   tools/setup.sh         build + test dependencies and the data packages
#   tools/setup.sh build   build + test dependencies only (what CI needs)
set -euo pipefail
pkgs=(build-essential cmake pkg-config python3 python3-torch libdnnl-dev libcjson-dev zlib1g-dev libpcre2-dev libpng-dev liblapack-dev clang libclang-rt-14-dev libcairo2-dev libopenmpi-dev openmpi-bin iproute2)
[ "${1:-all}" = build ] || pkgs+=(bible-kjv bible-kjv-text fortunes dataset-fashion-mnist)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
[ ${#missing[@]} -eq 0 ] && exit 0
SUDO=; [ "$(id -u)" -eq 0 ] || SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "installed: ${missing[*]}"
