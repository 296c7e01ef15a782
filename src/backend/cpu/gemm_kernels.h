// The GEMM's kernels for one instruction-set level, and the limits the
// dispatcher (gemm.cc) and the kernels share. Internal to gemm.cc and the
// gemm_<level>.cc files, which build gemm_impl.h with their level's flags.
//
// Every level computes the same chain of fused multiply-adds per output
// element (gemm.h); they differ only in how many registers a tile holds.
//
// Thread-safety: the kernels are stateless; scratch is passed in by the
// caller (one buffer per thread).
#pragma once

#include <cstdint>

#include "backend/cpu/gemm.h"

namespace failsafe::cpu {

inline constexpr int kDirectRows = 4;     // nt with at most this many rows: Direct
inline constexpr int kStreamRows = 4;     // nn with at most this many rows: Stream
inline constexpr int kStreamCols = 4096;  // accumulators of one Stream call (floats)
inline constexpr int kNR = 32;            // columns of a packed panel

struct GemmKernels {
  int tile_rows;  // rows of a register tile over a packed panel
  // nt, a.m <= kDirectRows: output columns [j0, j1).
  void (*direct)(const GemmArgs& a, int j0, int j1);
  // nn, a.m <= kStreamRows: columns [c0, c0 + cols), cols <= kStreamCols / a.m.
  // scratch: StreamScratchFloats() floats.
  void (*stream)(const GemmArgs& a, int c0, int cols, float* scratch);
  // Any shape: the kNR columns of panel `panel`, every row. packed: a.k * kNR floats.
  void (*panel)(const GemmArgs& a, int panel, float* packed);
};

inline constexpr int64_t StreamScratchFloats() {
  return int64_t{kStreamRows} * (kStreamCols + 16) + 16;
}

const GemmKernels& GemmKernelsGeneric();
const GemmKernels& GemmKernelsAvx2();
const GemmKernels& GemmKernelsAvx512();

}  // namespace failsafe::cpu
