// The GEMM's kernels built for the avx512 level (compile flags in
// src/backend/CMakeLists.txt); called only on CPUs that have it.
#include "backend/cpu/gemm_impl.h"

#if !defined(__AVX512F__)
#error "gemm_avx512.cc must be compiled with the avx512 level's flags"
#endif

namespace failsafe::cpu {

const GemmKernels& GemmKernelsAvx512() {
  static constexpr GemmKernels kernels{kMR, RunDirect, RunStream, RunPanel};
  return kernels;
}

}  // namespace failsafe::cpu
