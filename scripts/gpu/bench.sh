#!/usr/bin/env bash
# One model's GPU benchmark (scripts/gpu-check.sh): makes the model, then
# the engine's figures and PyTorch's on the same files; removes the model.
# Usage: scripts/gpu/bench.sh BIN_DIR MODELS_DIR OUT_DIR NAME SHAPE LAYERS MODES TORCH(0|1)
#                             [COMPILE_BATCHES] [FAILSAFE_BENCH_ARGS...]
set -euo pipefail
bin=$1 models=$2 out=$3 name=$4 shape=$5 layers=$6 modes=$7 torch=$8 compile=${9:-}
shift $(($# < 9 ? $# : 9))
dir=$models/$name
trap 'rm -rf "$dir"' EXIT
python3 "$(dirname "$0")/make_model.py" --shape "$shape" --layers "$layers" --out "$dir"
"$bin/failsafe_bench_gpu" --model "$dir" --json "$out/failsafe_$name.json" --gpu-gemm "$modes" \
  --breakdown "$@"
if ((torch)); then
  python3 "$(dirname "$0")/torch_bench.py" --model "$dir" --json "$out/torch_$name.json" \
    ${compile:+--compile "$compile"}
fi
