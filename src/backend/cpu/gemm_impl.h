// The body of the GEMM's kernels (gemm_kernels.h), built once per
// instruction-set level: gemm_avx512.cc, gemm_avx2.cc and gemm_generic.cc
// include it with their own compiler flags. Everything is in an unnamed
// namespace, so the copies never meet at link time. Not a public header.
//
// Weights are f32, bf16 or f16 (GemmArgs::wtype); 16-bit weights are widened
// exactly to f32 in registers (bf16: a shift; f16: a conversion). f32 and f16
// weights take the f32 chain, bf16 weights the bf16 chain (gemm.h): the
// activations rounded to bf16 (KernelArgs::xs), k-values in pairs, odd before
// even, under FlushDenormals (set by the entry points at the end). The
// kernels on blocked weights are in gemm_blocked_impl.h, included below.
#include <algorithm>
#include <bit>
#include <cstring>
#include <type_traits>
#include <utility>

#include "backend/backend.h"
#include "backend/cpu/gemm_kernels.h"
#include "backend/cpu/simd.h"
#include "common/check.h"
#include "common/fixed_point.h"

#define FS_INLINE __attribute__((always_inline)) inline
// The same for a lambda (after its parameters).
#define FS_INLINE_LAMBDA __attribute__((always_inline))

// The kernels by concept, in the order each needs the ones before (so not
// sorted).
// clang-format off
#include "backend/cpu/gemm_lanes_impl.h"
#include "backend/cpu/gemm_direct_impl.h"
#include "backend/cpu/gemm_fixed_impl.h"
#include "backend/cpu/gemm_stream_impl.h"
#include "backend/cpu/gemm_tiles_impl.h"
#include "backend/cpu/gemm_pack_impl.h"
#include "backend/cpu/gemm_blocked_impl.h"
#include "backend/cpu/gemm_panels_impl.h"
// clang-format on

namespace failsafe::cpu {
namespace {

// The entry points, by weight type. bf16 weights take the bf16 chain under
// FlushDenormals, which is set around a call that the compiler cannot inline
// (so no operation of the chain moves out of it); bf16 rows given by pointer
// (a bf16 KV cache) the f32 chain (BF16Wide).
template <typename W>
__attribute__((noinline)) void DirectNoInline(const KernelArgs& a, int j0, int j1) {
  DirectRange<W>(a, j0, j1);
}
template <typename W>
__attribute__((noinline)) void StreamNoInline(const KernelArgs& a, int c0, int cols,
                                              float* scratch) {
  StreamNN<W>(a, c0, cols, scratch);
}
template <typename W>
__attribute__((noinline)) void ItemPanelsNoInline(const KernelArgs& a, float* packed) {
  ItemPanels<W>(a, packed);
}
template <typename W>
__attribute__((noinline)) void PanelNoInline(const KernelArgs& a, int panel, float* packed) {
  PackedPanel<W>(a, panel, packed);
}
template <typename W>
__attribute__((noinline)) void ColumnWidenedNoInline(const KernelArgs& a, int panel,
                                                     float* packed) {
  ColumnWidenedPanel<W>(a, panel, packed);
}
#if defined(__AVX512F__)
__attribute__((noinline)) inline void ColumnPanelsNoInline(const KernelArgs& a, int p0, int p1) {
  ColumnBlockedPanels(a, p0, p1);
}
#endif

void RunDirect(const KernelArgs& a, int j0, int j1) {
  switch (a.wtype) {
    case DType::kBF16: {
      if (a.w_rows) return DirectRange<BF16Wide>(a, j0, j1);
      FlushDenormals flush;
      return DirectNoInline<BF16>(a, j0, j1);
    }
    case DType::kF16:
      return DirectRange<F16>(a, j0, j1);
    case DType::kF32:
      return DirectRange<float>(a, j0, j1);
  }
}

void RunStream(const KernelArgs& a, int c0, int cols, float* scratch) {
  switch (a.wtype) {
    case DType::kBF16: {
      if (a.w_rows) return StreamNN<BF16Wide>(a, c0, cols, scratch);
      FlushDenormals flush;
      return StreamNoInline<BF16>(a, c0, cols, scratch);
    }
    case DType::kF16:
      return StreamNN<F16>(a, c0, cols, scratch);
    case DType::kF32:
      return StreamNN<float>(a, c0, cols, scratch);
  }
}

void RunPanel(const KernelArgs& a, int panel, float* packed) {
  switch (a.wtype) {
    case DType::kBF16: {
      if (a.w_rows) return PackedPanel<BF16Wide>(a, panel, packed);
      FlushDenormals flush;
      return PanelNoInline<BF16>(a, panel, packed);
    }
    case DType::kF16:
      return PackedPanel<F16>(a, panel, packed);
    case DType::kF32:
      return PackedPanel<float>(a, panel, packed);
  }
}

void RunColumnWidened(const KernelArgs& a, int panel, float* packed) {
  switch (a.wtype) {
    case DType::kBF16: {
      FlushDenormals flush;
      return ColumnWidenedNoInline<BF16>(a, panel, packed);
    }
    case DType::kF16:
      return ColumnWidenedPanel<F16>(a, panel, packed);
    case DType::kF32:
      return ColumnWidenedPanel<float>(a, panel, packed);
  }
}

#if defined(__AVX512F__)
void RunColumnPanels(const KernelArgs& a, int p0, int p1) {
  FlushDenormals flush;
  ColumnPanelsNoInline(a, p0, p1);
}
#endif

void RunItemPanels(const KernelArgs& a, float* packed) {
  switch (a.wtype) {
    case DType::kBF16: {
      FlushDenormals flush;
      return ItemPanelsNoInline<BF16>(a, packed);
    }
    case DType::kF16:
      return ItemPanels<F16>(a, packed);
    case DType::kF32:
      return ItemPanels<float>(a, packed);
  }
}

}  // namespace
}  // namespace failsafe::cpu

#include "backend/cpu/row_kernels_impl.h"
