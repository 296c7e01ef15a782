#!/usr/bin/env bash
# Runs every simulator experiment for both models (REPRODUCTION.md): CSV, PNG
# and a JSON line per experiment under OUT (default sim-out/). Add
# `validate` as the first argument to also check the simulator against this
# machine's engine (about ten minutes).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-sim-out}
bin=build/src/cli/failsafe
[[ -x $bin ]] || { scripts/install-deps.sh && scripts/build.sh; }
mkdir -p "$out"
for model in llama-3.1-70b mixtral-8x22b; do
  for exp in offline-gcp online tp-sweep ablation recovery; do
    echo "== $exp $model" >&2
    "$bin" simulate "$exp" --model "$model" --out "$out/$exp-$model" --json | tail -n 1 \
      > "$out/$exp-$model.json"
  done
done
if [[ ${1:-} == validate ]]; then
  "$bin" simulate validate --out "$out/validate" --json | tee "$out/validate.txt" | tail -n 1 \
    > "$out/validate.json"
fi
echo "results in $out/" >&2
