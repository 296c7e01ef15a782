#!/usr/bin/env bash
# Runs every simulator experiment for both models (REPRODUCTION.md): CSV, PNG
# and a JSON line per experiment under OUT (default sim-out/), then
# offline-gcp under every availability trace in data/, and the wall time of
# each run in OUT/wall_times.csv. Add `validate` as the first argument to
# also check the simulator against this machine's engine (about ten minutes).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-sim-out}
bin=build/src/cli/failsafe
[[ -x $bin ]] || { scripts/install-deps.sh && scripts/build.sh; }
mkdir -p "$out"
echo "run,wall_s" > "$out/wall_times.csv"
# seconds T0: seconds since T0 (from `date +%s%N`), to the millisecond.
seconds() {
  local ms=$((($(date +%s%N) - $1) / 1000000))
  printf '%d.%03d' $((ms / 1000)) $((ms % 1000))
}
start_all=$(date +%s%N)
# run NAME ARGS...: one simulate command, its JSON line in OUT/NAME.json.
run() {
  local name=$1
  shift
  echo "== $name" >&2
  local t0
  t0=$(date +%s%N)
  "$bin" simulate "$@" --out "$out/$name" --json | tail -n 1 > "$out/$name.json"
  echo "$name,$(seconds "$t0")" >> "$out/wall_times.csv"
}
for model in llama-3.1-70b mixtral-8x22b; do
  for exp in offline-gcp online tp-sweep design ablation recovery slow-device; do
    run "$exp-$model" "$exp" --model "$model"
  done
  # The paper's fixed 10 s switching delay on every reconfiguration.
  run "offline-gcp-delay10-$model" offline-gcp --model "$model" --switch-delay 10s
  # The other availability traces, scaled to 8 x 8 GPUs.
  for trace in bamboo/g4dn-trace.csv oobleck/scaled/scale_gcp-trace.csv \
      oobleck/synthetic_failure_freq/{5m,10m,30m,1h,3h,6h}.csv; do
    name=$(basename "${trace%.*}")
    run "offline-$name-$model" offline-gcp --model "$model" --availability "data/availability/$trace"
  done
done
if [[ ${1:-} == validate ]]; then
  t0=$(date +%s%N)
  "$bin" simulate validate --out "$out/validate" --json | tee "$out/validate.txt" | tail -n 1 \
    > "$out/validate.json"
  echo "validate,$(seconds "$t0")" >> "$out/wall_times.csv"
fi
echo "all,$(seconds "$start_all")" >> "$out/wall_times.csv"
echo "results in $out/, wall times in $out/wall_times.csv" >&2
