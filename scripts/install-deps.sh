#!/usr/bin/env bash
# Installs FailSafe's build and test dependencies from Debian's archive.
# Usage: scripts/install-deps.sh [--test]   (--test adds the test-only packages)
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  libopenblas-dev libpcre2-dev nlohmann-json3-dev libcli11-dev libfmt-dev
  libboost1.81-dev libcpp-httplib-dev libgloo-dev libgtest-dev libgmock-dev libbenchmark-dev
  libnlopt-cxx-dev gnuplot-nox libsentencepiece-dev libutf8proc-dev libssl-dev
)
if [[ "${1:-}" == "--test" ]]; then
  packages+=(python3 python3-numpy python3-torch python3-sentencepiece python3-jinja2 haproxy iproute2)
  command -v npm >/dev/null 2>&1 || packages+=(nodejs npm)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  exit 0
fi
echo "installing: ${missing[*]}" >&2
sudo_cmd=()
if [[ "$(id -u)" != 0 ]]; then sudo_cmd=(sudo); fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -q >&2
"${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
