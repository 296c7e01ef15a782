#!/usr/bin/env bash
# The paper's recovery experiment on a GPU (scripts/gpu-check.sh --recovery):
# device processes sharing the GPU with a Llama-3.1-8B-shaped bf16 model made
# here, one killed 16 steps into the decode, under each recovery mode
# (failsafe recovery-bench: the phases, the longest gap between tokens,
# decode throughput before and after, and devices - 1 started fresh).
# Removes the model.
# Usage: scripts/gpu/recovery.sh BIN_DIR MODELS_DIR OUT_DIR LAYERS DEVICES REQUESTS PROMPT
#                                [RECOVERY_BENCH_ARGS...]
set -euo pipefail
bin=$1 models=$2 out=$3 layers=$4 devices=$5 requests=$6 prompt=$7
shift 7
dir=$models/recovery-llama-8b
trap 'rm -rf "$dir"' EXIT
python3 "$(dirname "$0")/make_model.py" --shape llama-3.1-8b --layers "$layers" --out "$dir"
# The host KV backup holds every sequence's keys and values (bf16: 8 KV
# heads x 128 x 2 x 2 bytes a position and layer), a quarter and a GiB over:
# every device process page-locks it.
backup_gib=$(((requests * (prompt + 64 + 16) * layers * 4096 * 5 / 4 >> 30) + 1))
gpus=0
for ((d = 1; d < devices; ++d)); do gpus+=",0"; done
"$bin/failsafe" recovery-bench --model "$dir" --devices "$devices" --gpus "$gpus" \
  --requests "$requests" --prompt-tokens "$prompt" --output-tokens 64 --fail-decode-step 16 \
  --window 16 --fresh --max-step-tokens 2048 --kv-dtype bf16 --backup-memory "${backup_gib}GiB" \
  --device-memory "$((100 / devices))GiB" --gpu-gemm fused --json "$@" | tee "$out/recovery.txt"
tail -1 "$out/recovery.txt" >"$out/recovery.json"
