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

// Twelve chains of the generic level's vector fused multiply-add (sixteen
// scalar ones each, one rounding per lane): the ceiling of its kernels.
__attribute__((noinline)) float GenericFmaChains(int64_t iters) {
  V16 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = Splat(static_cast<float>(i));
  V16 a = Splat(1.0f);
  const V16 b = Splat(0.5f);
  for (int64_t t = 0; t < iters; ++t) {
    for (int i = 0; i < 12; ++i) acc[i] = Fma(a, b, acc[i]);
    asm volatile("" : "+m"(a));
  }
  float s = 0;
  for (int i = 0; i < 12; ++i) s += acc[i][0] + acc[i][15];
  return s;
}

}  // namespace failsafe::cpu
