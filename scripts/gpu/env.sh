#!/usr/bin/env bash
# The GPU check's first stage (scripts/gpu-check.sh env): what the machine
# is, which pack runs, and that the engine reaches the GPU at all. Fails
# (and with it the whole check stops) where a library is missing or the
# engine cannot run a model on GPU 0.
# Usage: scripts/gpu/env.sh BIN PACKED_BIN LIBRARY_PATH CUBLAS_DIR STORIES_DIR
set -uo pipefail
bin=$1 packed=$2 libpath=$3 cublas=$4 stories=$5
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem,compute_mode \
  --format=csv || { echo "env: nvidia-smi found no GPU"; exit 1; }
# Several device processes share GPU 0 in the e2e and failure stages: a
# GPU that admits one process at a time fails them all, so say so first.
mode=$(nvidia-smi --query-gpu=compute_mode --format=csv,noheader -i 0 2>/dev/null)
if [[ $mode == *Exclusive_Process* || $mode == *Prohibited* ]]; then
  echo "env: GPU 0's compute mode is $mode: device processes cannot share it"
  exit 1
fi
echo "cuBLASLt: ${cublas:-not found}"
stamp=$(dirname "$packed")/BUILD
if [[ -f $stamp ]]; then
  echo "pack: $(cat "$stamp")"
else
  echo "pack: no stamp (built before gpu-pack.sh wrote one)"
fi
missing=$(for p in "$packed"/*; do LD_LIBRARY_PATH=$libpath ldd "$p"; done | grep -i 'not found' |
  sort -u)
if [[ -n $missing ]]; then
  echo "env: libraries not found:"
  echo "$missing"
  exit 1
fi
out=$(timeout 120 "$bin/failsafe" generate --model "$stories" --gpus 0 --max-tokens 8 2>&1) || {
  echo "env: the engine did not run stories260K on GPU 0:"
  echo "$out" | tail -20
  exit 1
}
echo "stories260K on GPU 0: $(echo "$out" | tail -1)"
