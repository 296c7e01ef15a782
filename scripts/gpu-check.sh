#!/usr/bin/env bash
# The CUDA backend's whole check, on a machine with an NVIDIA GPU, in one
# run that prints one summary:
#   kernels      the CUDA backend against the CPU backend, kernel by kernel,
#                and its batch invariance (fs_backend_tests' CUDA tests);
#   sanitize     the kernels' tests under compute-sanitizer: memcheck,
#                racecheck and synccheck (scripts/gpu/sanitize.sh), what the
#                CPU emulation cannot see (warps truly at once); "n/a" where
#                the machine's runtime refuses the tool;
#   peer-memory  CUDA IPC memory read through a killed owner's teardown
#                (CudaPeerMemory): whether --peer-collectives' survivors
#                stay well when a device dies mid-collective;
#   torch-ref    logits against an independent PyTorch float64 forward pass
#                on the same weights (tests/python/torch_reference.py, its
#                tolerances per dtype), for each product mode (--gpu-gemm
#                lt, chain, fused);
#   families     every model family's preset on GPU devices (one, and three
#                sharing the GPU) against the CPU backend, chains and fused
#                products with attention on tensor cores
#                (scripts/gpu/families.py);
#   hf-families  every model family (Llama, Mixtral, Qwen2, Qwen3,
#                Qwen3-MoE, Phi-3, Gemma 3) on the GPU against transformers'
#                own modeling code (scripts/gpu/hf_families.py);
#   e2e          the published story of stories260K, the same tokens (and
#                logits, bit for bit) on 1, 2, 3, 4 and 7 device processes
#                under every placement, chunked prefill, the prefix cache,
#                a bf16 KV cache, CUDA graphs (fused), and the bf16 model's
#                checks again with attention on tensor cores, in segments,
#                and with all-reduces reading the
#                other device processes' GPU memory through CUDA IPC
#                (--peer-collectives) (scripts/gpu/e2e.py);
#   bench        a Llama-3.1-8B-shaped and a Mixtral-8x7B-shaped bf16 model
#                with synthetic weights made here: decode at batch 1, 16
#                and 64 and a 2,048-token prefill beside the GPU's measured
#                limits and its host link's copy rates each way
#                (failsafe_bench_gpu, modes lt and fused, fused with
#                attention on tensor cores, and that with a bf16 KV cache,
#                with a breakdown of each step by kernel) and PyTorch with
#                transformers on the same weights (scripts/gpu/torch_bench.py);
#                and decode from a context of 8,192 on 4 such layers, with
#                attention in segments split over blocks and without;
#   faults       8 device processes sharing the GPU under random kill -9,
#                SIGSTOP/SIGCONT (hangs fenced or in time) and rejoins, often
#                close enough to cascade, with concurrent greedy and seeded
#                streams, every text checked against the fault-free run
#                (failsafe soak): stories260K, and a bf16 model under each
#                recovery mode and placement (and once with
#                --peer-collectives); and every recovery mode's
#                outputs against the fault-free run's (failsafe
#                recovery-bench on the bf16 model);
#   recovery     (--recovery only) the paper's recovery experiment: 8 device
#                processes, the Llama-3.1-8B shape, one killed 16 steps into
#                the decode, each mode's phases and the steady state beside 7
#                processes started fresh (scripts/gpu/recovery.sh); with
#                --peer, its all-reduces through CUDA IPC.
#
# The programs come from scripts/gpu-pack.sh (built where the build
# dependencies are; the GPU machine needs only the CUDA driver, cuBLASLt and
# a python3 with PyTorch and transformers): .gpu/, or .gpu.tar.xz unpacked
# into it. Usage:
#   scripts/gpu-check.sh [--bin .gpu/bin] [--out DIR] [--quick] [--compile 1,16,64]
#                        [--mixtral-layers 4] [--llama-layers 32] [--skip STAGE,...]
#                        [--only STAGE,...]
#                        [--bench-modes lt,fused,fused+pdl,fused+tensor,fused+tensor+kvbf16]
#                        [--no-torch-bench] [--recovery [REQUESTS,PROMPT]] [--peer]
#                        [--budget SECONDS]
# Stages (a group's name, e.g. faults, e2e, torch-ref or bench, names all of
# its stages): env, kernels, sanitize, peer-memory, device-group,
# torch-ref-{lt,chain,fused}, families, hf-families,
# e2e-{lt,chain,fused,tensor,segments,peer,library}, faults-model,
# faults-{stories,full-hybrid,host-cyclic,recompute-nonuniform,
# full-standard,peer-full-hybrid,library-full-hybrid,modes},
# bench-{llama-8b,mixtral,
# long-context}, recovery-8b.
# --quick: the correctness stages only. --recovery: the recovery experiment
# too, REQUESTS sequences of PROMPT tokens (default 32,1000). --budget: the
# whole run's wall-clock seconds (e.g. a remote call's limit): each stage's
# timeout is cut to what is left (a stage stopped there reads "CUT NAME"),
# and once under 45 s is left the remaining stages are skipped ("skip NAME
# (budget)"), so that the summary still comes out. --skip leaves out the
# named stages; --only runs just them, in the order given (env first unless
# skipped; faults-model before the first faults stage; recovery-8b implies
# --recovery). An unknown name is an error. --peer: the recovery experiment
# with --peer-collectives. The env stage failing (no GPU reached, a library
# missing) stops the run, unless it passes again with the device memory
# pool off (env-allocator-sync: FAILSAFE_CUDA_ALLOCATOR=sync for the rest
# of the run). Exits 1 if any stage failed or was cut.
#
# What comes back from $OUT: summary.txt (the figures, each failure's
# lines, then every stage's result), progress.txt (each stage as it starts
# and ends), stages.log (every stage's whole output, as it runs) and
# figures.tar.gz (the benchmarks' and the recovery experiment's JSON).
set -uo pipefail
cd "$(dirname "$0")/.."

bin=.gpu/bin
out=/tmp/failsafe-gpu-check
quick=0
compile=""
mixtral_layers=4
llama_layers=32
skip=""
only=""
bench_modes="lt,fused,fused+pdl,fused+tensor,fused+tensor+kvbf16"
torch_bench=1
recovery=""
recovery_args=()
budget=0
while (($#)); do
  case "$1" in
    --bin) bin=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --quick) quick=1; shift ;;
    --compile) compile=$2; shift 2 ;;
    --mixtral-layers) mixtral_layers=$2; shift 2 ;;
    --llama-layers) llama_layers=$2; shift 2 ;;
    --skip) skip=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    --bench-modes) bench_modes=$2; shift 2 ;;
    --no-torch-bench) torch_bench=0; shift ;;
    --budget) budget=$2; shift 2 ;;
    --peer) recovery_args+=(--peer-collectives); shift ;;
    --recovery)
      recovery=32,1000
      if [[ ${2:-} =~ ^[0-9]+,[0-9]+$ ]]; then recovery=$2; shift; fi
      shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
if [[ ! $budget =~ ^[0-9]+$ ]]; then
  echo "--budget takes whole seconds, not $budget" >&2
  exit 2
fi
all_stages=(env kernels sanitize peer-memory device-group torch-ref-lt torch-ref-chain torch-ref-fused
  families hf-families e2e-lt e2e-chain e2e-fused e2e-tensor e2e-segments e2e-peer e2e-library
  faults-model faults-stories faults-full-hybrid faults-host-cyclic faults-recompute-nonuniform
  faults-full-standard faults-peer-full-hybrid faults-library-full-hybrid faults-modes
  bench-llama-8b bench-mixtral bench-long-context recovery-8b)
# expand LIST: the stage names a comma list of names and groups gives, in
# its order, into `expanded`; an unknown name ends the run.
expand() {
  expanded=()
  local item s matched
  for item in ${1//,/ }; do
    matched=0
    for s in "${all_stages[@]}"; do
      if [[ $s == "$item" || $s == "$item"-* ]]; then
        [[ " ${expanded[*]-} " == *" $s "* ]] || expanded+=("$s")
        matched=1
      fi
    done
    if ((!matched)); then
      echo "no stage or group $item; the stages: ${all_stages[*]}" >&2
      exit 2
    fi
  done
}
expand "$skip"
skipped=("${expanded[@]}")
is_skipped() { [[ " ${skipped[*]-} " == *" $1 "* ]]; }
plan=()
if [[ -n $only ]]; then
  expand "$only"
  is_skipped env || [[ " ${expanded[*]} " == *" env "* ]] || plan+=(env)
  for s in "${expanded[@]}"; do
    if [[ $s == faults-* && $s != faults-model && " ${plan[*]-} " != *" faults-model "* ]] &&
      ! is_skipped faults-model; then
      plan+=(faults-model)
    fi
    [[ " ${plan[*]-} " == *" $s "* ]] || plan+=("$s")
  done
  [[ " ${plan[*]} " == *" recovery-8b "* && -z $recovery ]] && recovery=32,1000
else
  for s in "${all_stages[@]}"; do
    [[ $s == bench-* ]] && ((quick)) && continue
    [[ $s == recovery-8b && -z $recovery ]] && continue
    plan+=("$s")
  done
fi
if ((${#recovery_args[@]})) && [[ -z $recovery ]]; then
  echo "--peer is for the recovery experiment: add --recovery (or --only recovery-8b)" >&2
  exit 2
fi
# The programs as gpu-pack.sh compressed them, where that travelled: into
# .gpu/ unless it already holds this very pack (.gpu/.from: the pack's
# sha256), so that a machine kept between calls never runs an older pack;
# unpacked beside it first and moved into place whole.
if [[ $bin == .gpu/bin && -f .gpu.tar.xz ]]; then
  sha=$(sha256sum .gpu.tar.xz | cut -d' ' -f1)
  if [[ $(cat .gpu/.from 2>/dev/null) != "$sha" ]]; then
    rm -rf .gpu.new && mkdir .gpu.new
    # tar with xz, or Python's lzma where xz is missing.
    tar -xJf .gpu.tar.xz -C .gpu.new 2>/dev/null ||
      python3 -c 'import sys, tarfile; tarfile.open(".gpu.tar.xz").extractall(".gpu.new")' ||
      { echo "could not unpack .gpu.tar.xz" >&2; exit 2; }
    echo "$sha" >.gpu.new/.gpu/.from && rm -rf .gpu && mv .gpu.new/.gpu .gpu && rm -rf .gpu.new
  fi
fi
[[ -d $bin ]] || { echo "$bin is missing: run scripts/gpu-pack.sh where the build is" >&2; exit 2; }
bin=$(realpath "$bin")
mkdir -p "$out"
rm -f "$out/stages.log" "$out/progress.txt"
logs=$(mktemp -d)
lib=$(dirname "$bin")/lib

# A shared library's directory, from the toolkit or from PyTorch's CUDA
# packages: cuBLASLt, and NCCL (which the programs load at run time).
find_lib() {
  local d f
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu; do
    [[ -e $d/$1 ]] && echo "$d" && return
  done
  f=$(find / -xdev -name "$1*" -path '*nvidia*' 2>/dev/null | head -1)
  [[ -n $f ]] && dirname "$f"
}
cublas=$(find_lib libcublasLt.so.13)
nccl=$(find_lib libnccl.so.2)
# The packed libraries (this build machine's libssl, libcrypto, libz,
# libgomp...) are for the programs alone: each is called through a wrapper
# that puts them first, so that python3 and PyTorch keep the image's own.
# The device processes a program starts inherit its environment.
packed=$bin
bin=$logs/bin
mkdir -p "$bin"
libpath="$lib${cublas:+:$cublas}${nccl:+:$nccl}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
for p in "$packed"/*; do
  printf '#!/usr/bin/env bash\nLD_LIBRARY_PATH=%q exec %q "$@"\n' "$libpath" "$p" \
    >"$bin/$(basename "$p")"
  chmod +x "$bin/$(basename "$p")"
done
export PYTHONUNBUFFERED=1
echo "libraries: cuBLASLt ${cublas:-not found}, NCCL ${nccl:-not found}" >>"$out/progress.txt"

results=()
failed=0
stopped=""  # why the remaining stages are not run (env failed)
figures=$logs/figures  # the benchmarks' and the recovery's JSON, packed into $OUT
mkdir -p "$figures"
rm -f "$out/figures.tar.gz" "$out/summary.txt"
# stage NAME TIMEOUT_S COMMAND...: runs it, its output to the stage's log and
# to $OUT/stages.log as it goes (a call cut short still returns it).
stage() {
  local name=$1 limit=$2
  shift 2
  if [[ -n $stopped ]]; then
    results+=("skip $name ($stopped)")
    echo "${results[-1]}" >>"$out/progress.txt"
    return
  fi
  local cut=0
  if ((budget > 0)); then
    # Fifteen seconds kept for a stage's kill and the summary.
    local left=$((budget - SECONDS - 15))
    if ((left < 45)); then
      results+=("skip $name (budget)")
      echo "${results[-1]}" >>"$out/progress.txt"
      return
    fi
    if ((limit > left)); then
      limit=$left
      cut=1
    fi
  fi
  echo "start $name (limit ${limit}s, at ${SECONDS}s)" >>"$out/progress.txt"
  echo "=== $name: $*" | tee -a "$out/stages.log" >"$logs/$name.log"
  local t0=$SECONDS rc=0
  timeout -k 10 "$limit" "$@" 2>&1 | tee -a "$out/stages.log" >>"$logs/$name.log"
  rc=${PIPESTATUS[0]}
  local took=$((SECONDS - t0))
  if ((rc == 0)); then
    results+=("PASS $name (${took}s)")
  elif ((rc == 3)) && [[ $name == sanitize ]]; then
    results+=("n/a $name (the tool cannot run here: its log says why, ${took}s)")
  elif ((cut && (rc == 124 || rc == 137))); then
    results+=("CUT $name (stopped at the budget, ${took}s)")
    failed=1
  else
    results+=("FAIL $name (exit $rc, ${took}s)")
    failed=1
  fi
  tail -n 8 "$logs/$name.log"
  echo "${results[-1]}" >>"$out/progress.txt"
}

stories=data/models/stories260K
work=$(mktemp -d)  # the faults stages' model
tiny=$work/tiny-llama-bf16
trap 'rm -rf "$work"' EXIT
models=/tmp/failsafe-gpu-models
if [[ $(df --output=avail -B1G /dev/shm 2>/dev/null | tail -1) -gt 40 ]]; then
  models=/dev/shm/failsafe-gpu-models
fi
# Failures: 8 device processes on GPU 0, events every ~0.6 s (often one
# during another's recovery), the run's texts checked against a fault-free
# run of the same streams.
soak=("$bin/failsafe" soak --gpus 0 --devices 8 --min-devices 3 --event-gap-ms 600
  --concurrency 48 --max-len 64 --events kill,stop,rejoin)
e2e=(python3 scripts/gpu/e2e.py --failsafe "$bin/failsafe" --stories $stories)
torch_ref=(python3 tests/python/torch_reference.py --failsafe "$bin/failsafe")

run_stage() {
  case $1 in
    env)
      stage env 150 scripts/gpu/env.sh "$bin" "$packed" "$libpath" "$cublas" $stories
      # Every stage leans on the device memory pool (not yet run on a GPU
      # when it was written): where the engine ran no model, and runs one
      # without the pool, the run goes on without it (and fails, with env's
      # FAIL in the summary).
      if [[ ${results[-1]} == FAIL* && -z ${FAILSAFE_CUDA_ALLOCATOR:-} ]] &&
        grep -q "^env: the engine did not run" "$logs/env.log"; then
        export FAILSAFE_CUDA_ALLOCATOR=sync
        stage env-allocator-sync 150 scripts/gpu/env.sh "$bin" "$packed" "$libpath" "$cublas" \
          $stories
        [[ ${results[-1]} == PASS* ]] || unset FAILSAFE_CUDA_ALLOCATOR
      fi
      [[ ${results[-1]} == PASS* ]] || stopped="env failed" ;;
    kernels)
      stage kernels 300 scripts/gpu/gtest.sh "$bin/fs_backend_tests" \
        '*Cuda*:-CudaPeerMemory.*:CudaDeviceGroup.*' ;;
    sanitize) stage sanitize 240 scripts/gpu/sanitize.sh "$bin/fs_backend_tests" ;;
    # CUDA IPC memory read while its owner is killed (what --peer-collectives
    # meets when a device dies mid-collective): a stage of its own, since a
    # reader that faults stops the program.
    peer-memory)
      stage peer-memory 120 scripts/gpu/gtest.sh "$bin/fs_backend_tests" 'CudaPeerMemory.*' \
        CudaPeerMemory.Owner ;;
    # NCCL between processes that each have a backend, all on GPU 0 as
    # hosts apart (its network transport): sums and gathers bit for bit, a
    # member killed, the survivors' operation ended by abort, a new group.
    device-group)
      stage device-group 240 scripts/gpu/gtest.sh "$bin/fs_backend_tests" 'CudaDeviceGroup.*' \
        CudaDeviceGroup.Member ;;
    # f32 weights take the chains in every product mode: lt checks them, the
    # other modes the 16-bit models only.
    torch-ref-lt)
      stage torch-ref-lt 300 "${torch_ref[@]}" --engine-args "--gpus 0" \
        --llama2c $stories/llama2c/stories260K.bin --converted $stories ;;
    torch-ref-chain)
      stage torch-ref-chain 240 "${torch_ref[@]}" --engine-args "--gpus 0 --gpu-gemm chain" \
        --dtypes bf16,f16 ;;
    torch-ref-fused)
      stage torch-ref-fused 240 "${torch_ref[@]}" --engine-args "--gpus 0 --gpu-gemm fused" \
        --dtypes bf16,f16 ;;
    families)
      stage families 240 python3 scripts/gpu/families.py --failsafe "$bin/failsafe" ;;
    hf-families)
      stage hf-families 300 python3 scripts/gpu/hf_families.py --failsafe "$bin/failsafe" \
        --engine-args "--gpus 0" ;;
    e2e-lt) stage e2e-lt 420 "${e2e[@]}" --gemm lt ;;
    e2e-chain) stage e2e-chain 420 "${e2e[@]}" --gemm chain ;;
    e2e-fused) stage e2e-fused 420 "${e2e[@]}" --gemm fused --bf16-only --graphs ;;
    e2e-tensor) stage e2e-tensor 300 "${e2e[@]}" --gemm fused --bf16-only --attention tensor ;;
    e2e-segments)
      stage e2e-segments 300 "${e2e[@]}" --gemm fused --bf16-only --attention segments ;;
    # All-reduces between the device processes through CUDA IPC.
    e2e-peer) stage e2e-peer 300 "${e2e[@]}" --gemm fused --bf16-only --peer ;;
    # All-reduces through NCCL (the device processes as hosts apart).
    e2e-library) stage e2e-library 300 "${e2e[@]}" --gemm fused --bf16-only --library apart ;;
    faults-model)
      stage faults-model 60 "$bin/failsafe" make-model --preset tiny-llama --dtype bf16 \
        --out "$tiny" ;;
    faults-stories) stage faults-stories 120 "${soak[@]}" --model $stories --duration 20s --seed 11 ;;
    faults-full-hybrid)
      stage faults-full-hybrid 120 "${soak[@]}" --model "$tiny" --duration 20s --seed 12 \
        --recovery full --placement hybrid ;;
    faults-host-cyclic)
      stage faults-host-cyclic 90 "${soak[@]}" --model "$tiny" --duration 12s --seed 13 \
        --recovery host --placement cyclic ;;
    faults-recompute-nonuniform)
      stage faults-recompute-nonuniform 90 "${soak[@]}" --model "$tiny" --duration 12s \
        --seed 14 --recovery recompute --placement nonuniform ;;
    faults-full-standard)
      stage faults-full-standard 90 "${soak[@]}" --model "$tiny" --duration 12s --seed 15 \
        --recovery full --placement standard ;;
    faults-peer-full-hybrid)
      stage faults-peer-full-hybrid 90 "${soak[@]}" --model "$tiny" --duration 12s --seed 16 \
        --recovery full --placement hybrid --peer-collectives ;;
    faults-library-full-hybrid)
      stage faults-library-full-hybrid 120 env FAILSAFE_NCCL_APART=1 "${soak[@]}" --model "$tiny" \
        --duration 12s --seed 17 --recovery full --placement hybrid --peer-collectives ;;
    faults-modes)
      stage faults-modes 180 "$bin/failsafe" recovery-bench --model "$tiny" --gpus 0 --devices 8 \
        --requests 16 --prompt-tokens 200 --output-tokens 48 --fail-decode-step 6 --window 8 \
        --fresh ;;
    bench-llama-8b)
      mkdir -p "$models"
      stage bench-llama-8b 420 scripts/gpu/bench.sh "$bin" "$models" "$figures" llama-8b \
        llama-3.1-8b "$llama_layers" "$bench_modes" "$torch_bench" "$compile" ;;
    # torch.compile on the 8B shape only: its compile alone takes minutes.
    bench-mixtral)
      mkdir -p "$models"
      stage bench-mixtral 200 scripts/gpu/bench.sh "$bin" "$models" "$figures" mixtral \
        mixtral-8x7b "$mixtral_layers" "$bench_modes" "$torch_bench" ;;
    # Decode over a long context: attention walked by one block per query
    # head group (cores) or split over segments.
    bench-long-context)
      mkdir -p "$models"
      stage bench-long-context 200 scripts/gpu/bench.sh "$bin" "$models" "$figures" \
        llama-8b-long llama-3.1-8b 4 "fused,fused+segments" 0 "" --context 8192 \
        --batches 1,16 --prefill 0 --steps 8 ;;
    recovery-8b)
      mkdir -p "$models"
      stage recovery-8b 540 scripts/gpu/recovery.sh "$bin" "$models" "$figures" 32 8 \
        "${recovery%,*}" "${recovery#*,}" "${recovery_args[@]}" ;;
  esac
  if [[ $1 == bench-* || $1 == recovery-* ]]; then
    tar -czf "$out/figures.tar.gz" -C "$logs" figures
  fi
}

for s in "${plan[@]}"; do
  if is_skipped "$s"; then
    results+=("skip $s")
  else
    run_stage "$s"
  fi
done

{
  echo "=== figures"
  for f in "$logs"/bench-*.log; do
    [[ -e $f ]] || continue
    echo "--- $(basename "$f" .log)"
    grep -E "^(GPU|limits|host link|model:|batch|prefill|eager|torch.compile|transformers|  breakdown)" "$f"
  done
  for f in "$logs"/faults-*.log "$logs"/recovery-*.log; do
    [[ -e $f && $f != */faults-model.log ]] || continue
    echo "--- $(basename "$f" .log)"
    grep -E "^(mode|none|recompute|host|full|fresh|decode throughput|[0-9.]+ s:|event|kill|rejoin|stop|longest|requests|diverged)" "$f"
  done
  # Warnings the failure and recovery stages' device processes gave that
  # say a recovery path was not the one meant: a recovery's wider products
  # that could not take the choices made before, peer memory by CUDA IPC.
  for f in "$logs"/faults-*.log "$logs"/recovery-*.log; do
    [[ -e $f ]] || continue
    grep -hoE "do not keep a row's bits here|peer memory by CUDA IPC" "$f" | sort | uniq -c |
      sed "s/^/$(basename "$f" .log): /"
  done
  if [[ -e $logs/peer-memory.log ]]; then
    grep -E "killed owner|CUDA error" "$logs/peer-memory.log" | sed "s/^/peer-memory: /"
  fi
  # The largest error each reference stage saw.
  for f in "$logs"/torch-ref-*.log "$logs"/hf-families.log; do
    [[ -e $f ]] || continue
    worst=$(grep -E "^ok " "$f" | sed -nE 's/.*max relative error ([-+.0-9e]+).*/\1 &/p' |
      sort -g | tail -1 | cut -d' ' -f2-)
    echo "$(basename "$f" .log): $(grep -c '^ok ' "$f") ok, $(grep -c '^FAIL' "$f") FAIL${worst:+; largest error: $worst}"
  done
  for f in "$logs"/e2e-*.log; do
    [[ -e $f ]] || continue
    echo "$(basename "$f" .log): $(grep -c '^ok ' "$f") ok, $(grep -c '^FAIL' "$f") FAIL"
  done
  echo "=== failures"
  for f in "$logs"/*.log; do
    grep -E "^FAIL|^\[  FAILED  \] [A-Za-z]|^gtest.sh: (exit|no test|skipped)|^env: |CUDA error|Check failed|diverged: [1-9]" \
      "$f" | head -20 | sed "s/^/$(basename "$f" .log): /"
  done
  echo "=== stages"
  for r in "${results[@]}"; do echo "$r"; done
} | tee "$out/summary.txt"
exit $failed
