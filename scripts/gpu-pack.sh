#!/usr/bin/env bash
# Packs what scripts/gpu-check.sh runs into .gpu/, for a machine with a GPU
# and no package registry: the programs (built here, with the CUDA backend)
# and the shared libraries they take from this machine's packages. Not
# packed: the C and C++ runtimes, the CUDA driver and cuBLASLt, which that
# machine has (gpu-check.sh finds cuBLASLt in its toolkit or its PyTorch).
# Also .gpu.tar.xz, the same compressed, to carry where size counts.
# Usage: scripts/gpu-pack.sh [--no-build]   (--no-build: no dependencies
# installed, no configure; the three programs still brought up to date)
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
# A pack of programs older than the sources is a GPU call spent on old
# code: the three are brought up to date (nothing to do where they are).
ninja -C build failsafe fs_backend_tests failsafe_bench_gpu >/dev/null ||
  { echo "the programs do not build: see ninja -C build" >&2; exit 1; }
rm -rf .gpu
mkdir -p .gpu/bin .gpu/lib
for p in "${programs[@]}"; do strip --strip-debug -o ".gpu/bin/$(basename "$p")" "$p"; done
# Which sources it is: gpu-check.sh's env stage prints it.
echo "$(git describe --always --dirty) built $(date -u -r build/src/cli/failsafe +%FT%TZ)" \
  >.gpu/BUILD
ldd "${programs[@]}" | awk '/=> \// {print $3}' | sort -u |
  grep -vE '/(libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|ld-linux[^/]*|libcublas[^/]*|libcuda)\.so' |
  while read -r l; do cp -L "$l" .gpu/lib/; done
# The same compressed (a quarter of the bytes), for a machine that takes the
# checkout and what travels with it together under a size limit:
# gpu-check.sh unpacks it into .gpu/ where that is missing.
tar -cf - .gpu | xz -6 -T0 >.gpu.tar.xz
# .gpu/ holds this very pack: gpu-check.sh leaves it as it is.
sha256sum .gpu.tar.xz | cut -d' ' -f1 >.gpu/.from
du -sh .gpu .gpu.tar.xz
# What travels: the checkout's tracked files, the untracked ones git does not
# ignore, and the pack.
tree=$( (git ls-files -z --cached; git ls-files -z --others --exclude-standard) |
  { xargs -0 -r stat -c %s -- 2>/dev/null || true; } | awk '{s += $1} END {print s + 0}')
pack=$(stat -c %s .gpu.tar.xz)
echo "checkout $((tree / 1048576)) MiB + .gpu.tar.xz $((pack / 1048576)) MiB = $(((tree + pack) / 1048576)) MiB"
