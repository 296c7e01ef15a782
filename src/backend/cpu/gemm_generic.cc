// The GEMM's kernels built for the generic level (compile flags in
// src/backend/CMakeLists.txt); called only on CPUs that have it.
#include "backend/cpu/gemm_impl.h"

namespace failsafe::cpu {

const GemmKernels& GemmKernelsGeneric() {
  static constexpr GemmKernels kernels{
      kMR,        RunDirect,  RunStream,  RunPanel,     RunItemPanels, nullptr,
      SiluMulRow, ExpShifted, SoftmaxRow, RoundRowBf16, PackPairsRow};  // no vdpbf16ps here
  return kernels;
}

}  // namespace failsafe::cpu
