// The nn kernels with few rows: weight rows streamed through accumulators.
// Part of the GEMM's kernel body: gemm_impl.h includes it once per
// instruction-set level, in order, inside an unnamed namespace; not a
// header of its own.
#pragma once

namespace failsafe::cpu {
namespace {

// ---------------------------------------------------------------------------
// nn: chains over k. Few rows: the accumulators live in a small buffer and
// weight rows stream through it. Many rows: register tiles of kMR rows x 32
// columns over a packed panel.

// bf16 rows stream 32 columns at a time: one vector holds them as pairs
// (columns 2q and 2q + 1 in 32-bit lane q), which LoadPair widens in-lane
// into the even and the odd columns. Their accumulators are therefore held
// by parity: in each group of 32 columns, the 16 even columns and then the
// 16 odd ones (ParityOrder), and put back in column order (ColumnOrder)
// before anything reads them. Only their place changes, not their chains.
template <typename W>
constexpr bool kParityGroups = std::is_same_v<W, BF16>;

// The even and the odd lanes of (a, b), 32 lanes in all.
template <typename T>
FS_INLINE T EvenLanes(T a, T b) {
  return Shuffle<0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30>(a, b);
}
template <typename T>
FS_INLINE T OddLanes(T a, T b) {
  return Shuffle<1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31>(a, b);
}

// Columns [0, 32 * groups) of acc from column order to parity order.
inline void ParityOrder(float* acc, int groups) {
  for (int g = 0; g < groups; ++g) {
    const V16 c0 = Load(acc + 32 * g), c1 = Load(acc + 32 * g + 16);
    Store(acc + 32 * g, EvenLanes(c0, c1));
    Store(acc + 32 * g + 16, OddLanes(c0, c1));
  }
}

// Columns [0, 32 * groups) of acc from parity order to column order.
inline void ColumnOrder(float* acc, int groups) {
  for (int g = 0; g < groups; ++g) {
    const V16 e = Load(acc + 32 * g), o = Load(acc + 32 * g + 16);
    Store(acc + 32 * g, Shuffle<0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23>(e, o));
    Store(acc + 32 * g + 16,
          Shuffle<8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31>(e, o));
  }
}

// bf16 decode streams each [k, n] weight once, 8 rows at a time, and each
// row's columns are a stream too short (a few KiB) for the hardware
// prefetchers to learn: each load also asks for the same columns of the row
// 8 below, the next group's, `ahead` elements on (0: rows not evenly spaced,
// no prefetch). On a Zen 5 it streams bf16 o and down projections about a
// quarter faster; f32 rows, twice as long, reach the bandwidth without it.
template <typename W>
FS_INLINE void StreamPrefetch(const W* p, int64_t ahead) {
  if (ahead != 0) __builtin_prefetch(p + ahead);
}

// Weight rows kk..kk+R-1 into MR rows of accumulators, column vector by
// column vector: acc[i][c] = fma(x[i][kk+r], w[kk+r][c], acc[i][c]) for r in
// order. Several weight rows per pass load and store each accumulator once.
//
// With few rows a pass takes G column vectors at once (about four chains in
// flight in all): f32 decode's o and down projections on one thread stream
// 30 GB/s this way against 26-28 one vector at a time. Only independent
// chains interleave.
template <int MR, int R, int G, typename W>
FS_INLINE void StreamRowsPass(const W* const* wr, const V16 (&xv)[MR][R], float* const* acc,
                              int v) {
  V16 c[MR][G];
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) c[i][g] = Load(acc[i] + 16 * (v + g));
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    V16 wv[G];
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) wv[g] = Load(wr[r] + 16 * (v + g));
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
      for (int g = 0; g < G; ++g) c[i][g] = Fma(xv[i][r], wv[g], c[i][g]);
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) Store(acc[i] + 16 * (v + g), c[i][g]);
  }
}

template <int MR, int R, typename W>
FS_INLINE void StreamRows(const W* const* wr, const float* x, int64_t ldx, int kk,
                          float* const* acc, int vecs) {
  constexpr int G = MR >= 4 ? 1 : 4 / MR;
  V16 xv[MR][R];
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) xv[i][r] = Splat(x[i * ldx + kk + r]);
  }
  int v = 0;
  for (; v + G <= vecs; v += G) StreamRowsPass<MR, R, G>(wr, xv, acc, v);
  for (; v < vecs; ++v) StreamRowsPass<MR, R, 1>(wr, xv, acc, v);
}

// The bf16 chain of the same (R weight rows, pairs from kk, which starts a
// pair; an odd R only at a chain's end, its last row paired with a zero):
// rows kk + 2p + 1, then kk + 2p. xs[i]: row i's activations from kk's slot.
// The first 32 * (vecs / 2) columns in parity order (kParityGroups).
template <int MR, int R>
FS_INLINE void StreamRowsBf16(const BF16* const* wr, const float* const* xs, float* const* acc,
                              int vecs, int64_t ahead) {
  constexpr int P = (R + 1) / 2;  // pairs
  V16 xe[MR][P], xo[MR][P];
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) {
      xe[i][p] = Splat(xs[i][2 * p]);
      xo[i][p] = Splat(xs[i][2 * p + 1]);  // 0 past an odd R (the chain's padding)
    }
  }
  int v = 0;
  for (; v + 2 <= vecs; v += 2) {
    V16 we[P][2], wo[P][2];  // [pair][even row, odd row]: even and odd columns
#pragma GCC unroll 8
    for (int r = 0; r < 2 * P; ++r) {
      if (r < R) {
        StreamPrefetch(wr[r] + 16 * v, ahead);
        LoadPair(wr[r] + 16 * v, &we[r / 2][r % 2], &wo[r / 2][r % 2]);
      } else {
        we[r / 2][r % 2] = wo[r / 2][r % 2] = V16{};
      }
    }
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) {
      V16 ce = Load(acc[i] + 16 * v), co = Load(acc[i] + 16 * v + 16);
#pragma GCC unroll 4
      for (int p = 0; p < P; ++p) {
        ce = FmaBf16(xo[i][p], we[p][1], ce);
        co = FmaBf16(xo[i][p], wo[p][1], co);
        ce = FmaBf16(xe[i][p], we[p][0], ce);
        co = FmaBf16(xe[i][p], wo[p][0], co);
      }
      Store(acc[i] + 16 * v, ce);
      Store(acc[i] + 16 * v + 16, co);
    }
  }
  for (; v < vecs; ++v) {
    V16 w[P][2];
#pragma GCC unroll 8
    for (int r = 0; r < 2 * P; ++r) w[r / 2][r % 2] = r < R ? Load(wr[r] + 16 * v) : V16{};
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) {
      V16 c = Load(acc[i] + 16 * v);
#pragma GCC unroll 4
      for (int p = 0; p < P; ++p) {
        c = FmaBf16(xo[i][p], w[p][1], c);
        c = FmaBf16(xe[i][p], w[p][0], c);
      }
      Store(acc[i] + 16 * v, c);
    }
  }
}

template <int MR, typename W>
void StreamRowsAnyR(const W* const* wr, const float* x, int64_t ldx, int kk, int r,
                    float* const* acc, int vecs) {
  switch (r) {
    case 8:
      return StreamRows<MR, 8, W>(wr, x, ldx, kk, acc, vecs);
    case 7:
      return StreamRows<MR, 7, W>(wr, x, ldx, kk, acc, vecs);
    case 6:
      return StreamRows<MR, 6, W>(wr, x, ldx, kk, acc, vecs);
    case 5:
      return StreamRows<MR, 5, W>(wr, x, ldx, kk, acc, vecs);
    case 4:
      return StreamRows<MR, 4, W>(wr, x, ldx, kk, acc, vecs);
    case 3:
      return StreamRows<MR, 3, W>(wr, x, ldx, kk, acc, vecs);
    case 2:
      return StreamRows<MR, 2, W>(wr, x, ldx, kk, acc, vecs);
    default:
      return StreamRows<MR, 1, W>(wr, x, ldx, kk, acc, vecs);
  }
}

template <int MR>
void StreamRowsBf16AnyR(const BF16* const* wr, const float* const* xs, int r, float* const* acc,
                        int vecs, int64_t ahead) {
  switch (r) {
    case 8:
      return StreamRowsBf16<MR, 8>(wr, xs, acc, vecs, ahead);
    case 7:
      return StreamRowsBf16<MR, 7>(wr, xs, acc, vecs, ahead);
    case 6:
      return StreamRowsBf16<MR, 6>(wr, xs, acc, vecs, ahead);
    case 5:
      return StreamRowsBf16<MR, 5>(wr, xs, acc, vecs, ahead);
    case 4:
      return StreamRowsBf16<MR, 4>(wr, xs, acc, vecs, ahead);
    case 3:
      return StreamRowsBf16<MR, 3>(wr, xs, acc, vecs, ahead);
    case 2:
      return StreamRowsBf16<MR, 2>(wr, xs, acc, vecs, ahead);
    default:
      return StreamRowsBf16<MR, 1>(wr, xs, acc, vecs, ahead);
  }
}

// Every row (a.m <= kStreamRows), columns [c0, c0 + cols) (cols <=
// kStreamCols / a.m). scratch: StreamScratchFloats() floats.
template <typename W>
void StreamNN(const KernelArgs& a, int c0, int cols, float* scratch) {
  const int rows = a.m;
  // Rows of accumulators one cache line apart from a power of two, so that
  // they do not compete for the same cache sets.
  constexpr size_t kStride = kStreamCols + 16;
  float* base = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(scratch) + 63) & ~63);
  float* acc[kStreamRows];
  for (int i = 0; i < kStreamRows; ++i) acc[i] = base + i * kStride;
  const int vecs = cols / 16;
  const int groups = kParityGroups<W> ? vecs / 2 : 0;  // of 32 columns in parity order
  auto reset = [&] {
    for (int i = 0; i < rows; ++i) std::memset(acc[i], 0, sizeof(float) * cols);
  };
  if (a.out == GemmOut::kAccumulate) {
    for (int i = 0; i < rows; ++i) {
      std::memcpy(acc[i], a.y + static_cast<int64_t>(i) * a.ldy + c0, sizeof(float) * cols);
      ParityOrder(acc[i], groups);
    }
  } else {
    reset();
  }
  const float* x = a.x;
  const int64_t ahead = a.w_rows ? 0 : 8 * static_cast<int64_t>(a.ldw);
  // Groups of up to 8 weight rows, never across an item's end.
  const int item = a.out == GemmOut::kFixedItems ? a.item_k : a.k;
  for (int kk = 0; kk < a.k;) {
    const int r = std::min({8, a.k - kk, item - kk % item});
    const W* wr[8];
    for (int q = 0; q < r; ++q) wr[q] = WRow<W>(a, kk + q) + c0;
    if (a.w_rows)
      PrefetchRowsAhead<W>(a, kk, r, a.k, kRowsAheadNN, kRowsFarNN, c0, cols * sizeof(W));
    if constexpr (kPairs<W>) {
      // The bf16 chain: groups start at a pair (8 at a time from a chain's
      // start), so an odd r ends a chain.
      const float* xs[kStreamRows];
      for (int i = 0; i < rows; ++i) xs[i] = XsRow(a, i, kk);
      switch (rows) {
        case 1:
          StreamRowsBf16AnyR<1>(wr, xs, r, acc, vecs, ahead);
          break;
        case 2:
          StreamRowsBf16AnyR<2>(wr, xs, r, acc, vecs, ahead);
          break;
        case 3:
          StreamRowsBf16AnyR<3>(wr, xs, r, acc, vecs, ahead);
          break;
        default:
          StreamRowsBf16AnyR<4>(wr, xs, r, acc, vecs, ahead);
          break;
      }
      for (int c = 16 * vecs; c < cols; ++c) {
        for (int i = 0; i < rows; ++i) {
          for (int q = 0; q < r; q += 2) {
            const float odd = q + 1 < r ? Widen(wr[q + 1][c]) : 0.0f;
            acc[i][c] = FmaBf16(xs[i][q + 1], odd, acc[i][c]);
            acc[i][c] = FmaBf16(xs[i][q], Widen(wr[q][c]), acc[i][c]);
          }
        }
      }
    } else {
      switch (rows) {
        case 1:
          StreamRowsAnyR<1>(wr, x, a.ldx, kk, r, acc, vecs);
          break;
        case 2:
          StreamRowsAnyR<2>(wr, x, a.ldx, kk, r, acc, vecs);
          break;
        case 3:
          StreamRowsAnyR<3>(wr, x, a.ldx, kk, r, acc, vecs);
          break;
        default:
          StreamRowsAnyR<4>(wr, x, a.ldx, kk, r, acc, vecs);
          break;
      }
      for (int c = 16 * vecs; c < cols; ++c) {
        for (int i = 0; i < rows; ++i) {
          for (int q = 0; q < r; ++q)
            acc[i][c] = Fma(x[i * a.ldx + kk + q], Widen(wr[q][c]), acc[i][c]);
        }
      }
    }
    kk += r;
    if (a.out == GemmOut::kFixedItems && kk % a.item_k == 0) {
      for (int i = 0; i < rows; ++i) {
        int64_t* dst = a.acc + static_cast<int64_t>(i) * a.ldacc + c0;
        ColumnOrder(acc[i], groups);
        for (int v = 0; v < vecs; ++v) AddFixed16(Load(acc[i] + 16 * v), dst + 16 * v, 16);
        for (int c = 16 * vecs; c < cols; ++c) dst[c] = AddFixed(dst[c], ToFixed(acc[i][c]));
      }
      reset();
    }
  }
  if (a.out == GemmOut::kFixedItems) return;
  for (int i = 0; i < rows; ++i) {
    ColumnOrder(acc[i], groups);
    std::memcpy(a.y + static_cast<int64_t>(i) * a.ldy + c0, acc[i], sizeof(float) * cols);
  }
}

}  // namespace
}  // namespace failsafe::cpu
