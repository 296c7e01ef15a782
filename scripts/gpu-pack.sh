#!/usr/bin/env bash
# Packs what scripts/gpu-check.sh runs into .gpu/, for a machine with a GPU
# and no package registry: the programs (built here, with the CUDA backend)
# and the shared libraries they take from this machine's packages. Not
# packed: the C and C++ runtimes, the CUDA driver and cuBLASLt, which that
# machine has (gpu-check.sh finds cuBLASLt in its toolkit or its PyTorch).
# Usage: scripts/gpu-pack.sh [--no-build]
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ "${1:-}" != "--no-build" ]]; then
  scripts/install-deps.sh
  scripts/build.sh
fi
programs=(build/src/cli/failsafe build/src/backend/fs_backend_tests build/bench/failsafe_bench_gpu)
for p in "${programs[@]}"; do
  [[ -x $p ]] || { echo "$p is missing: is nvcc on the PATH (the CUDA backend built)?" >&2; exit 1; }
done
rm -rf .gpu
mkdir -p .gpu/bin .gpu/lib
for p in "${programs[@]}"; do strip --strip-debug -o ".gpu/bin/$(basename "$p")" "$p"; done
ldd "${programs[@]}" | awk '/=> \// {print $3}' | sort -u |
  grep -vE '/(libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|ld-linux[^/]*|libcublas[^/]*|libcuda)\.so' |
  while read -r l; do cp -L "$l" .gpu/lib/; done
du -sh .gpu
