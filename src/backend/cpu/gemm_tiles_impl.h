// Register tiles: many rows over a panel of up to 32 output columns, the f32
// and bf16 chains, in plain or fixed-point mode.
// Part of the GEMM's kernel body: gemm_impl.h includes it once per
// instruction-set level, in order, inside an unnamed namespace; not a
// header of its own.
#pragma once

namespace failsafe::cpu {
namespace {

#if defined(__AVX512F__)
constexpr int kMR = 8;  // rows per register tile: 16 accumulators in 32 registers
#elif defined(__AVX2__)
constexpr int kMR = 3;  // 6 accumulators (12 of 16 AVX2 registers)
#else
constexpr int kMR = 2;  // 4 accumulators (16 SSE registers)
#endif

// Where a panel's results go when its two vectors are not the cols columns
// from j0 (a blocked nt weight's panels, BlockedVectorAt): vector q's first
// lanes[q][0] lanes to the columns from col[q][0], its next lanes[q][1] to
// those from col[q][1].
struct PanelOut {
  int col[2][2];
  int lanes[2][2];
};

// A panel: the weights of up to 32 output columns, k-major, as two vectors
// of 16 lanes: lane q of k-value kk at b0[kk * step + q] and b1[kk * step +
// q]; unless `out` says otherwise, b0's lanes are columns j0.. j0 + 15 and
// b1's the rest of the cols columns. Packed panels are f32 with step 32; a
// blocked weight (GemmArgs::w_blocked16) is read where it lies, in its own
// type.
template <typename W>
struct Panel {
  const W* b0;
  const W* b1;  // b0 again when the panel is one vector (its results are not stored)
  int64_t step;
  int cols;  // columns in all
  // Set: the results go where it says, not to the cols columns from j0.
  // Never in fixed-point mode, whose blocked weights are one item each
  // (their panels' columns run on; BlockedPanel checks).
  const PanelOut* out = nullptr;
  // bf16 packed in pairs for vdpbf16ps (PackPairsNN): the chains' slots
  // (KernelArgs::xs) in pairs, pair p (slots 2p, 2p + 1) of 16 columns at
  // b0 + p * 2 * step, a lone k-value with its zero.
  bool slot_pairs = false;
  // slot_pairs in fixed-point mode: elements from one item's first pair to
  // the next's (0: the items' pairs one after another, as packed).
  int64_t item_step = 0;
  // A blocked bf16 weight read as it lies by vdpbf16ps: how far on (in
  // elements) each load asks the memory for the line of the next panel.
  // With more rows than a register tile's, the panel's first pass waits on
  // the weight's reads, the others on the products; so the first pass keeps
  // the next panel's reads in flight too. 0: none.
  int64_t ahead = 0;
};

// Vector q of a row's results by PanelOut (row: the row's first column).
FS_INLINE V16 LoadRuns(const float* row, const PanelOut& o, int q) {
  float tmp[16] = {};
  std::memcpy(tmp, row + o.col[q][0], sizeof(float) * o.lanes[q][0]);
  std::memcpy(tmp + o.lanes[q][0], row + o.col[q][1], sizeof(float) * o.lanes[q][1]);
  return Load(tmp);
}
FS_INLINE void StoreRuns(float* row, const PanelOut& o, int q, V16 v) {
  float tmp[16];
  Store(tmp, v);
  std::memcpy(row + o.col[q][0], tmp, sizeof(float) * o.lanes[q][0]);
  std::memcpy(row + o.col[q][1], tmp + o.lanes[q][0], sizeof(float) * o.lanes[q][1]);
}

template <int MR>
struct Acc {
  V16 v[MR][2];
};

// The f32 chain's steps kk in [k0, k1): a0[i] and a1[i] (row i's two
// vectors) take xr[i][kk] times the vectors at b0 and b1, which move on by
// step per k-value (and are left after the last). The loop is unrolled by
// four, so that its pointer arithmetic takes fewer of the vector ports'
// slots.
template <int MR, typename W>
FS_INLINE void ChainSteps(const float* const* xr, int k0, int k1, int64_t step, const W*& b0,
                          const W*& b1, V16* a0, V16* a1) {
#if defined(FS_SIMD_AVX2_PARTS)
  if constexpr (std::is_same_v<W, float>) {
    // Sixteen registers: MR x 4 accumulators, the MR rows' broadcasts and
    // one part of the weights at a time (all four parts at once left no
    // register for the broadcast, and one accumulator went to the stack).
    typedef V16::Part P;
#pragma GCC unroll 2
    for (int kk = k0; kk < k1; ++kk, b0 += step, b1 += step) {
      P s[MR];
#pragma GCC unroll 4
      for (int i = 0; i < MR; ++i) s[i] = reinterpret_cast<P>(_mm256_set1_ps(xr[i][kk]));
#pragma GCC unroll 4
      for (int q = 0; q < 4; ++q) {
        P w;
        __builtin_memcpy(&w, (q < 2 ? b0 : b1) + 8 * (q % 2), sizeof(w));
#pragma GCC unroll 4
        for (int i = 0; i < MR; ++i) {
          V16& acc = q < 2 ? a0[i] : a1[i];
          acc.p[q % 2] = reinterpret_cast<P>(
              _mm256_fmadd_ps(reinterpret_cast<__m256>(s[i]), reinterpret_cast<__m256>(w),
                              reinterpret_cast<__m256>(acc.p[q % 2])));
        }
      }
    }
    return;
  }
#endif
#pragma GCC unroll 4
  for (int kk = k0; kk < k1; ++kk, b0 += step, b1 += step) {
    const V16 w0 = Load(b0), w1 = Load(b1);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const V16 s = Splat(xr[i][kk]);
      a0[i] = Fma(s, w0, a0[i]);
      a1[i] = Fma(s, w1, a1[i]);
    }
  }
}

// acc[i][*] goes on with the f32 chain over k in [k0, k1) of x[i0 + i, kk] *
// b[kk, *] (f32 or f16 weights).
template <int MR, typename W>
FS_INLINE Acc<MR> Chain(const KernelArgs& a, int i0, const Panel<W>& p, int k0, int k1, Acc<MR> c) {
  const W* b0 = p.b0 + static_cast<int64_t>(k0) * p.step;
  const W* b1 = p.b1 + static_cast<int64_t>(k0) * p.step;
  const float* xr[MR];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) xr[i] = a.x + (i0 + i) * a.ldx;
  V16 a0[MR], a1[MR];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) {
    a0[i] = c.v[i][0];
    a1[i] = c.v[i][1];
  }
  ChainSteps<MR>(xr, k0, k1, p.step, b0, b1, a0, a1);
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) {
    c.v[i][0] = a0[i];
    c.v[i][1] = a1[i];
  }
  return c;
}

// The bf16 chain of the same over the chain [k0, k1) (whole pairs from k0; a
// last lone k-value paired with a zero), on weights widened to f32 (W float:
// k-value kk at b + kk * step) or a blocked bf16 weight read as it lies (W
// BF16: pairs of k-values per lane, Blocked16Index; one chain from k0 = 0,
// an odd k's last value alone in its lane).
template <int MR, typename W>
FS_INLINE Acc<MR> ChainBf16(const KernelArgs& a, int i0, const Panel<W>& p, int k0, int k1,
                            Acc<MR> c) {
  const W* b0 = p.b0 + static_cast<int64_t>(k0) * p.step;
  const W* b1 = p.b1 + static_cast<int64_t>(k0) * p.step;
  const float* xs[MR];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) xs[i] = XsRow(a, i0 + i, k0);
  V16 a0[MR], a1[MR];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) {
    a0[i] = c.v[i][0];
    a1[i] = c.v[i][1];
  }
  int kk = k0;
#if defined(FS_SIMD_AVX2_PARTS)
  // Sixteen registers (as ChainSteps): the odd k-value's products of every
  // part, then the even one's, one part of the weights at a time, each
  // chain taking its pair's two in the chain's order. A blocked bf16
  // pair's odd value is widened by two shifts, which need no mask register.
  {
    typedef V16::Part P;
    for (; kk + 2 <= k1; kk += 2, b0 += 2 * p.step, b1 += 2 * p.step) {
      const int s = kk - k0;
#pragma GCC unroll 2
      for (int odd = 1; odd >= 0; --odd) {
        P x[MR];
#pragma GCC unroll 4
        for (int i = 0; i < MR; ++i) x[i] = reinterpret_cast<P>(_mm256_set1_ps(xs[i][s + odd]));
#pragma GCC unroll 4
        for (int q = 0; q < 4; ++q) {
          const W* src = q < 2 ? b0 : b1;
          __m256 w;
          if constexpr (kPairs<W>) {
            const __m256i raw =
                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 16 * (q % 2)));
            w = _mm256_castsi256_ps(odd ? _mm256_slli_epi32(_mm256_srli_epi32(raw, 16), 16)
                                        : _mm256_slli_epi32(raw, 16));
          } else {
            w = _mm256_loadu_ps(src + (odd ? p.step : 0) + 8 * (q % 2));
          }
#pragma GCC unroll 4
          for (int i = 0; i < MR; ++i) {
            V16& acc = q < 2 ? a0[i] : a1[i];
            acc.p[q % 2] = reinterpret_cast<P>(_mm256_fmadd_ps(
                reinterpret_cast<__m256>(x[i]), w, reinterpret_cast<__m256>(acc.p[q % 2])));
          }
        }
      }
    }
  }
#endif
  for (; kk + 2 <= k1; kk += 2, b0 += 2 * p.step, b1 += 2 * p.step) {
    V16 e0, o0, e1, o1;
    if constexpr (kPairs<W>) {
      LoadPair(b0, &e0, &o0);
      LoadPair(b1, &e1, &o1);
    } else {
      e0 = Load(b0);
      e1 = Load(b1);
      o0 = Load(b0 + p.step);
      o1 = Load(b1 + p.step);
    }
    const int s = kk - k0;
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const V16 xe = Splat(xs[i][s]), xo = Splat(xs[i][s + 1]);
      a0[i] = FmaBf16(xo, o0, a0[i]);
      a1[i] = FmaBf16(xo, o1, a1[i]);
      a0[i] = FmaBf16(xe, e0, a0[i]);
      a1[i] = FmaBf16(xe, e1, a1[i]);
    }
  }
  if (kk < k1) {  // a lone last k-value: after the zero pair of its padding
    const V16 w0 = Load(b0), w1 = Load(b1);
    const int s = kk - k0;
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const V16 xe = Splat(xs[i][s]), xo = Splat(xs[i][s + 1]);  // xo: the padding's 0
      a0[i] = FmaBf16(xo, V16{}, a0[i]);
      a1[i] = FmaBf16(xo, V16{}, a1[i]);
      a0[i] = FmaBf16(xe, w0, a0[i]);
      a1[i] = FmaBf16(xe, w1, a1[i]);
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) {
    c.v[i][0] = a0[i];
    c.v[i][1] = a1[i];
  }
  return c;
}

#if defined(__AVX512F__)
// The bf16 chain's pairs by vdpbf16ps (KernelArgs::dpbf16): `pairs` pairs of
// rows i0.. from slot `slot` (even) of their activations (KernelArgs::xw),
// weights as 16 lanes of two, pair p of the two blocks at b0 + p * pair_step
// and b1 + p * pair_step. Each instruction is the chain's two fused
// multiply-adds (gemm.h; Dpbf16MatchesChain checked that on this CPU).
template <int MR>
__attribute__((target("avx512bf16"), noinline)) Acc<MR> ChainDpbf16(const KernelArgs& a, int i0,
                                                                    int64_t slot, const BF16* b0,
                                                                    const BF16* b1,
                                                                    int64_t pair_step, int pairs,
                                                                    Acc<MR> c, int64_t ahead = 0) {
  const uint32_t* xw[MR];
  __m512 a0[MR], a1[MR];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) {
    xw[i] = a.xw + ((i0 + i) * a.ldxs + slot) / 2;
    a0[i] = reinterpret_cast<__m512>(c.v[i][0]);
    a1[i] = reinterpret_cast<__m512>(c.v[i][1]);
  }
  for (int p = 0; p < pairs; ++p, b0 += pair_step, b1 += pair_step) {
    if (ahead) {  // Panel::ahead
      __builtin_prefetch(b0 + ahead);
      __builtin_prefetch(b1 + ahead);
    }
    const __m512bh w0 = reinterpret_cast<__m512bh>(_mm512_loadu_si512(b0));
    const __m512bh w1 = reinterpret_cast<__m512bh>(_mm512_loadu_si512(b1));
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const __m512bh s = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(xw[i][p])));
      a0[i] = _mm512_dpbf16_ps(a0[i], s, w0);
      a1[i] = _mm512_dpbf16_ps(a1[i], s, w1);
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) {
    c.v[i][0] = reinterpret_cast<V16>(a0[i]);
    c.v[i][1] = reinterpret_cast<V16>(a1[i]);
  }
  return c;
}
#endif

#if defined(__AVX512F__)
// A tile in fixed-point mode on bf16 [k, n] panels in pairs
// (Panel::slot_pairs: packed, or a column-blocked weight's as they lie): each
// item's chain from zero, made fixed point (ToFixed) and added to the item
// sums. kDp: by vdpbf16ps, as ChainDpbf16 computes it; else each pair widened
// in registers (shared by the tile's rows) for the chain's two fused
// multiply-adds, as ChainBf16 computes it (where vdpbf16ps is slow,
// GemmDpbf16TilesFor).
// kWhole: the panel's 32 columns all there (the sums' additions straight
// vector stores). kFar: a column-blocked weight (Panel::item_step), whose
// items lie far apart, each read as a short run the hardware prefetchers do
// not follow: each load asks for the line kFixedAhead items on (after the
// last item, the next panel's first ones).
inline constexpr int kFixedAhead = 2;
template <int MR, bool kWhole, bool kFar, bool kDp>
__attribute__((target("avx512bf16"))) FS_INLINE void TileFixedPairsItems(const KernelArgs& a,
                                                                         int i0, int j0,
                                                                         const Panel<BF16>& p) {
  const int pairs = (a.item_k + 1) / 2, items = a.k / a.item_k;
  const int64_t item_slots = (a.item_k + 1) & ~1;     // XSlot of item c's first k-value: c * this
  const int v0 = kWhole ? 16 : std::min(16, p.cols);  // columns per vector
  const int v1 = kWhole ? 16 : std::max(0, p.cols - 16);
  const uint32_t* xw[MR];
  const float* xs[MR];
  int64_t* row[MR];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) {
    if constexpr (kDp) {
      xw[i] = a.xw + (i0 + i) * a.ldxs / 2;
    } else {
      xs[i] = a.xs + (i0 + i) * a.ldxs;
    }
    row[i] = a.acc + static_cast<int64_t>(i0 + i) * a.ldacc + j0;
  }
  const int64_t item_step = p.item_step ? p.item_step : item_slots * p.step;
  for (int c = 0; c < items; ++c) {
    const BF16* b0 = p.b0 + c * item_step;
    const BF16* b1 = p.b1 + c * item_step;
    const int64_t ahead = c + kFixedAhead < items
                              ? kFixedAhead * item_step
                              : (kFixedAhead - items) * item_step + kNR * item_slots;
    const int64_t w0 = c * item_slots / 2;  // the item's first word in a row of xw
    __m512 a0[MR], a1[MR];
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) a0[i] = a1[i] = _mm512_setzero_ps();
    for (int q = 0; q < pairs; ++q, b0 += 2 * p.step, b1 += 2 * p.step) {
      if constexpr (kFar) {
        __builtin_prefetch(b0 + ahead);
        __builtin_prefetch(b1 + ahead);
      }
      if constexpr (kDp) {
        const __m512bh wv0 = reinterpret_cast<__m512bh>(_mm512_loadu_si512(b0));
        const __m512bh wv1 = reinterpret_cast<__m512bh>(_mm512_loadu_si512(b1));
#pragma GCC unroll 16
        for (int i = 0; i < MR; ++i) {
          const __m512bh x =
              reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(xw[i][w0 + q])));
          a0[i] = _mm512_dpbf16_ps(a0[i], x, wv0);
          a1[i] = _mm512_dpbf16_ps(a1[i], x, wv1);
        }
      } else {
        V16 e0, o0, e1, o1;
        LoadPair(b0, &e0, &o0);
        LoadPair(b1, &e1, &o1);
        const int64_t s = 2 * (w0 + q);
#pragma GCC unroll 16
        for (int i = 0; i < MR; ++i) {
          const V16 xe = Splat(xs[i][s]), xo = Splat(xs[i][s + 1]);
          V16 c0 = reinterpret_cast<V16>(a0[i]), c1 = reinterpret_cast<V16>(a1[i]);
          c0 = Fma(xo, o0, c0);
          c1 = Fma(xo, o1, c1);
          a0[i] = reinterpret_cast<__m512>(Fma(xe, e0, c0));
          a1[i] = reinterpret_cast<__m512>(Fma(xe, e1, c1));
        }
      }
    }
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      AddFixed16(reinterpret_cast<V16>(a0[i]), row[i], v0);
      if (v1 > 0) AddFixed16(reinterpret_cast<V16>(a1[i]), row[i] + 16, v1);
    }
  }
}

template <int MR, bool kDp>
__attribute__((target("avx512bf16"), noinline)) void TileFixedPairs(const KernelArgs& a, int i0,
                                                                    int j0, const Panel<BF16>& p) {
  if (p.cols < 32) return TileFixedPairsItems<MR, false, false, kDp>(a, i0, j0, p);
  if (p.item_step) return TileFixedPairsItems<MR, true, true, kDp>(a, i0, j0, p);
  TileFixedPairsItems<MR, true, false, kDp>(a, i0, j0, p);
}
#endif

// A tile in fixed-point mode on f32 (or f16) panels: each item's chain from
// zero over its item_k k-values (ChainSteps, as Chain),
// made fixed point (ToFixed) and added to the item sums, the accumulators
// never leaving their registers. kWhole: the panel's 32 columns all there
// (the sums' additions straight vector stores).
template <int MR, bool kWhole, typename W>
FS_INLINE void TileFixedItems(const KernelArgs& a, int i0, int j0, const Panel<W>& p) {
  const int items = a.k / a.item_k;
  const float* xr[MR];
  int64_t* row[MR];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) {
    xr[i] = a.x + (i0 + i) * a.ldx;
    row[i] = a.acc + static_cast<int64_t>(i0 + i) * a.ldacc + j0;
  }
  TileItemSums<MR> sums(row, kWhole ? kNR : p.cols, items);
  const W* b0 = p.b0;
  const W* b1 = p.b1;
  for (int c = 0, k0 = 0; c < items; ++c, k0 += a.item_k) {
    V16 a0[MR], a1[MR];
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) a0[i] = a1[i] = V16{};
    ChainSteps<MR>(xr, k0, k0 + a.item_k, p.step, b0, b1, a0, a1);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) sums.Add(i, a0[i], a1[i]);
  }
  sums.Finish();
}

template <int MR, typename W>
__attribute__((noinline)) void TileFixed(const KernelArgs& a, int i0, int j0, const Panel<W>& p) {
  if (p.cols == kNR) return TileFixedItems<MR, true>(a, i0, j0, p);
  TileFixedItems<MR, false>(a, i0, j0, p);
}

// The chain of a tile: bf16 (kB) or f32.
template <int MR, bool kB, typename W>
FS_INLINE Acc<MR> TileChain(const KernelArgs& a, int i0, const Panel<W>& p, int k0, int k1,
                            Acc<MR> c) {
  if constexpr (kB) {
#if defined(__AVX512F__)
    if constexpr (kPairs<W>) {
      if (p.slot_pairs) {  // every pair packed, a lone value's with its zero
        const int64_t slot = XSlot(a, k0);
        return ChainDpbf16<MR>(a, i0, slot, p.b0 + slot * p.step, p.b1 + slot * p.step, 2 * p.step,
                               (k1 - k0 + 1) / 2, c);
      }
      if (a.dpbf16) {  // blocked (k0 = 0): the pairs, then an odd k's last value
        const int pairs = (k1 - k0) / 2;
        c = ChainDpbf16<MR>(a, i0, XSlot(a, k0), p.b0, p.b1, 2 * p.step, pairs, c, p.ahead);
        if (k0 + 2 * pairs == k1) return c;
        return ChainBf16<MR>(a, i0, p, k1 - 1, k1, c);
      }
    }
#endif
    return ChainBf16<MR>(a, i0, p, k0, k1, c);
  } else {
    return Chain<MR>(a, i0, p, k0, k1, c);
  }
}

template <int MR, bool kB, typename W>
void Tile(const KernelArgs& a, int i0, int j0, const Panel<W>& p) {
  Acc<MR> acc;
#if defined(__AVX512F__)
  if constexpr (kB && kPairs<W>) {
    if (a.out == GemmOut::kFixedItems && p.slot_pairs) {
      return a.dpbf16 ? TileFixedPairs<MR, true>(a, i0, j0, p)
                      : TileFixedPairs<MR, false>(a, i0, j0, p);
    }
  }
#endif
  if constexpr (!kB) {
    if (a.out == GemmOut::kFixedItems) return TileFixed<MR>(a, i0, j0, p);
  }
  if (a.out == GemmOut::kFixedItems) {
    int64_t* row[MR];
    for (int i = 0; i < MR; ++i) row[i] = a.acc + static_cast<int64_t>(i0 + i) * a.ldacc + j0;
    TileItemSums<MR> sums(row, p.cols, a.k / a.item_k);
    for (int k0 = 0; k0 < a.k; k0 += a.item_k) {
      for (int i = 0; i < MR; ++i) acc.v[i][0] = acc.v[i][1] = V16{};
      acc = TileChain<MR, kB>(a, i0, p, k0, k0 + a.item_k, acc);
      for (int i = 0; i < MR; ++i) sums.Add(i, acc.v[i][0], acc.v[i][1]);
    }
    sums.Finish();
    return;
  }
  for (int i = 0; i < MR; ++i) {
    if (a.out == GemmOut::kAccumulate) {
      const float* row = a.y + static_cast<int64_t>(i0 + i) * a.ldy;
      if (p.out) {
        acc.v[i][0] = LoadRuns(row, *p.out, 0);
        acc.v[i][1] = LoadRuns(row, *p.out, 1);
        continue;
      }
      acc.v[i][0] = LoadPart(row + j0, std::min(16, p.cols));
      acc.v[i][1] = p.cols > 16 ? LoadPart(row + j0 + 16, p.cols - 16) : V16{};
    } else {
      acc.v[i][0] = acc.v[i][1] = V16{};
    }
  }
  acc = TileChain<MR, kB>(a, i0, p, 0, a.k, acc);
  for (int i = 0; i < MR; ++i) {
    float* row = a.y + static_cast<int64_t>(i0 + i) * a.ldy;
    if (p.out) {
      StoreRuns(row, *p.out, 0, acc.v[i][0]);
      StoreRuns(row, *p.out, 1, acc.v[i][1]);
      continue;
    }
    StorePart(row + j0, acc.v[i][0], std::min(16, p.cols));
    if (p.cols > 16) StorePart(row + j0 + 16, acc.v[i][1], p.cols - 16);
  }
}

// Rows [i0, i0 + rows) (rows <= kMR) over a panel; kB: the bf16 chain.
template <bool kB, typename W, int MR = kMR>
void TileRows(const KernelArgs& a, int i0, int rows, int j0, const Panel<W>& p) {
  if constexpr (MR > 1) {
    if (rows < MR) return TileRows<kB, W, MR - 1>(a, i0, rows, j0, p);
  }
  Tile<MR, kB>(a, i0, j0, p);
}

// Every row's register tiles over panel p (its columns from j0), a pass per
// kMR rows; Panel::ahead holds for the first pass only.
template <bool kB, typename W>
void PanelRows(const KernelArgs& a, int j0, Panel<W> p) {
  for (int i0 = 0; i0 < a.m; i0 += kMR) {
    TileRows<kB, W>(a, i0, std::min(kMR, a.m - i0), j0, p);
    p.ahead = 0;
  }
}

// Every row's register tiles over a panel of a 16-bit weight widened to f32
// (k-value kk at p.b0 + kk * kNR). With bf16 weights and the swapped slots
// of the activations (KernelArgs::xsw), the panel is laid out again in the
// chains' slots, each pair's two swapped (after the panel in its scratch:
// PanelScratchFloats), and the f32 chain's tiles run over it: over slots
// in the order odd, even, odd, ... they make the bf16 chain's fused
// multiply-adds in its order (a padding slot's included), the same bits,
// with the f32 chain's register allocation (the bf16 chain's tiles at the
// avx2 level left weights in memory operands and copied registers: 0.85x).
template <typename W>
void WidenedPanelRows(const KernelArgs& a, int j0, const Panel<float>& p) {
  if constexpr (kPairs<W>) {
    if (a.xsw != nullptr) {
      const int chains = a.k / a.chain_k, padded = (a.chain_k + 1) & ~1;
      float* slots = const_cast<float*>(p.b0) + static_cast<int64_t>(a.k) * kNR;
      for (int c = 0; c < chains; ++c) {
        for (int s = 0; s < padded; s += 2) {
          const float* even = p.b0 + static_cast<int64_t>(c * a.chain_k + s) * kNR;
          float* dst = slots + (static_cast<int64_t>(c) * padded + s) * kNR;
          if (s + 1 < a.chain_k) {
            std::memcpy(dst, even + kNR, sizeof(float) * kNR);
          } else {
            std::memset(dst, 0, sizeof(float) * kNR);
          }
          std::memcpy(dst + kNR, even, sizeof(float) * kNR);
        }
      }
      KernelArgs sa = a;
      sa.x = a.xsw;
      sa.ldx = a.ldxs;
      sa.k = chains * padded;
      if (a.out == GemmOut::kFixedItems) sa.item_k = padded;
      Panel<float> sp = p;
      sp.b0 = slots;
      sp.b1 = slots + (p.b1 - p.b0);
      return PanelRows<false>(sa, j0, sp);
    }
  }
  PanelRows<kPairs<W>>(a, j0, p);
}

}  // namespace
}  // namespace failsafe::cpu
