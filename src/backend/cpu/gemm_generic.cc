// The GEMM's kernels built for the generic level (compile flags in
// src/backend/CMakeLists.txt); called only on CPUs that have it.
#include "backend/cpu/gemm_impl.h"

namespace failsafe::cpu {

const GemmKernels& GemmKernelsGeneric() {
  static constexpr GemmKernels kernels{
      kMR,        RunDirect,  RunStream,  RunPanel,     RunItemPanels, nullptr, RunColumnWidened,
      SiluMulRow, ExpShifted, SoftmaxRow, RoundRowBf16, PackPairsRow};  // no vdpbf16ps here
  return kernels;
}

// Twelve chains of the generic level's vector fused multiply-add (by double
// sums, simd.h): the ceiling of its f32 kernels; kBf16: of FmaBf16, the bf16
// chain's step (under DAZ and FTZ, as the kernels take it).
// MXCSR is set around the call, not in it (as the kernels' entry points do:
// setting it in the loop's own function halved the loop's rate).
template <bool kBf16>
__attribute__((noinline)) float GenericChains(int64_t iters) {
  V16 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = Splat(static_cast<float>(i));
  V16 a = Splat(1.0f);
  const V16 b = Splat(0.5f);
  for (int64_t t = 0; t < iters; ++t) {
    for (int i = 0; i < 12; ++i) acc[i] = kBf16 ? FmaBf16(a, b, acc[i]) : Fma(a, b, acc[i]);
    asm volatile("" : "+m"(a));
  }
  // Every lane read: a V16 is four registers here, and the compiler drops
  // the chains of the ones whose lanes are never read (reading lanes 0 and
  // 15 only left half the chains, and the peak read twice what it was).
  float s = 0;
  for (int i = 0; i < 12; ++i) {
    for (int l = 0; l < 16; ++l) s += acc[i][l];
  }
  return s;
}
float GenericFmaChains(int64_t iters) { return GenericChains<false>(iters); }
float GenericBf16Chains(int64_t iters) {
  FlushDenormals flush;
  return GenericChains<true>(iters);
}

}  // namespace failsafe::cpu
