// The GEMM's kernels built for the avx2 level (compile flags in
// src/backend/CMakeLists.txt); called only on CPUs that have it.
#include "backend/cpu/gemm_impl.h"

#if !defined(__AVX2__)
#error "gemm_avx2.cc must be compiled with the avx2 level's flags"
#endif

namespace failsafe::cpu {

const GemmKernels& GemmKernelsAvx2() {
  static constexpr GemmKernels kernels{
      kMR,        RunDirect,  RunStream,  RunPanel,     RunItemPanels, nullptr, RunColumnWidened,
      SiluMulRow, ExpShifted, SoftmaxRow, RoundRowBf16, PackPairsRow,  // no vdpbf16ps here
      0,          true};
  return kernels;
}

}  // namespace failsafe::cpu
