#!/usr/bin/env bash
# The CUDA kernels' tests under compute-sanitizer (part of
# scripts/gpu-check.sh): memcheck (accesses out of bounds or misaligned,
# in global and shared memory), racecheck (shared-memory hazards between a
# block's threads, cp.async's copies among them) and synccheck (barriers
# that some threads miss or reach apart). What the CPU emulation the same
# tests run under everywhere else cannot see: it runs a block's warps one
# at a time, never two at once (src/backend/cuda/emulation/emulation.h).
# Exit 3 where compute-sanitizer is missing or refuses the device (some
# machines' runtimes do), so the check reports it as not available rather
# than as a failure of the kernels.
# Usage: scripts/gpu/sanitize.sh PROGRAM
set -uo pipefail
program=$1
sanitizer=$(command -v compute-sanitizer ||
  ls /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer \
    2>/dev/null | head -1)
if [[ -z $sanitizer ]]; then
  echo "sanitize.sh: no compute-sanitizer on this machine"
  exit 3
fi
# Every kernel family on shapes of a few blocks: the row kernels (norms,
# RoPE, SiLU, the MoE gate, gathers, residual adds), attention (CUDA cores,
# segments and tensor cores; f32 and bf16 pages; windows), the fixed-point
# kernel's variants, the chains, sampling, and the uploads.
filter='CudaBackend.RowKernelsMatchTheCpuBackend:CudaBackend.AttentionMatchesTheCpuBackendAndIsChunkInvariant'
filter+=':CudaFixedItems.*:CudaBackend.SamplingDrawsTheCpuBackendsTokens'
filter+=':CudaBackend.SumArraysAddsInTheCpuBackendsOrder:CudaBackend.UploadsOfOneCallKeepTheirSlots'
filter+=':Types/CudaLinearTest.LinearNNFixedMatchesTheCpuBackend/*'
log=$(mktemp)
trap 'rm -f "$log"' EXIT
failed=0
for tool in memcheck racecheck synccheck; do
  echo "--- $tool"
  "$sanitizer" --tool "$tool" --target-processes all --error-exitcode 9 --print-limit 20 \
    "$program" --gtest_filter="$filter" --gtest_brief=1 >"$log" 2>&1
  rc=$?
  grep -E "^========= (ERROR SUMMARY|RACECHECK SUMMARY)|Invalid|Race|Barrier|hazard|^\[  (PASSED|FAILED) " \
    "$log" | head -40
  if grep -qE "Device not supported|unsupported device|Target application terminated before first instrumented API call" \
    "$log" && ! grep -q "PASSED" "$log"; then
    echo "sanitize.sh: compute-sanitizer cannot run here:"
    tail -5 "$log"
    exit 3
  fi
  # Under the tool, tests that found no GPU skip themselves: not a run.
  if ((rc == 0)) && grep -q "SKIPPED" "$log"; then
    echo "sanitize.sh: under $tool the tests found no GPU:"
    grep -m3 -E "no GPU|SKIPPED" "$log"
    exit 3
  fi
  if ((rc != 0)); then
    echo "sanitize.sh: $tool: exit $rc"
    tail -30 "$log"
    failed=1
  fi
done
((failed)) && exit 1
echo "sanitize.sh: memcheck, racecheck and synccheck found nothing"
