// The GEMM's kernels on blocked weights (GemmArgs::w_blocked16: items in
// blocks of 16 rows and a tail, k-major, Blocked16Index in
// backend/backend.h; column-blocked nn items as the nt weights they are),
// read where they lie. Part of gemm_impl.h, which
// includes it after the register tiles it uses (Panel, TileRows); not a
// header of its own.
//
// The chains are those of every other path (gemm.h): each output element
// takes its k-values in increasing order (bf16: the bf16 chain, pairs odd
// then even).
#pragma once

namespace failsafe::cpu {
namespace {

// A block of 16 rows of a blocked weight (k-major, 16 wide), widened into 16
// columns of a packed panel: dst[kk * kNR + q].
template <typename W>
void WidenBlock(const W* b, int k, float* dst) {
  int kk = 0;
  if constexpr (kPairs<W>) {
    for (; kk + 2 <= k; kk += 2) {
      V16 e, o;
      LoadPair(b + static_cast<int64_t>(kk) * 16, &e, &o);
      Store(dst + static_cast<int64_t>(kk) * kNR, e);
      Store(dst + static_cast<int64_t>(kk + 1) * kNR, o);
    }
  }
  for (; kk < k; ++kk)
    Store(dst + static_cast<int64_t>(kk) * kNR, Load(b + static_cast<int64_t>(kk) * 16));
}

// A vector of a blocked nt weight's panel (BlockedVectorAt) that is not a
// whole block: its runs (an item's tail, or two items' tails) widened into
// its lanes of a packed panel, one after the other, the lanes after them
// zero.
template <typename W>
void WidenRuns(const KernelArgs& a, const W* w, const BlockedVector& v, float* dst) {
  const int used = v.width[0] + v.width[1];
  for (int kk = 0; kk < a.k; ++kk) {
    float* d = dst + static_cast<int64_t>(kk) * kNR;
    int lane = 0;
    for (int r = 0; r < 2; ++r) {
      const W* run = w + v.at[r];
      const int width = v.width[r];
      if constexpr (std::is_same_v<W, float>) {
        std::memcpy(d + lane, run + static_cast<int64_t>(kk) * width, sizeof(float) * width);
      } else {
        for (int q = 0; q < width; ++q)
          d[lane + q] = Widen(run[Blocked16Index(q, kk, width, a.k, a.wtype)]);
      }
      lane += width;
    }
    std::memset(d + used, 0, sizeof(float) * (16 - used));
  }
}

#if defined(__AVX512F__)
// A blocked bf16 item's tail of t < 16 rows at `tail`, as a block of 16 rows
// (Blocked16Index with 16 rows) whose rows past the tail are zero: out holds
// 16 * a.k values. Each pair of k-values is the tail's rows' words side by
// side, one masked load and one cache line each.
inline void PadTailToBlock(const KernelArgs& a, const BF16* tail, int t, BF16* out) {
  const __mmask16 lanes = static_cast<__mmask16>((1u << t) - 1);
  int kk = 0;
  for (; kk + 2 <= a.k; kk += 2) {
    _mm512_storeu_si512(out + static_cast<int64_t>(kk) * 16,
                        _mm512_maskz_loadu_epi32(lanes, tail + static_cast<int64_t>(kk) * t));
  }
  if (kk < a.k) {  // an odd k's last value: one per row, as f32's lie
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + static_cast<int64_t>(kk) * 16),
                        _mm256_maskz_loadu_epi16(lanes, tail + static_cast<int64_t>(kk) * t));
  }
}
#endif

// Panel::ahead of a blocked panel whose first vector is `first`, read where
// it lies: how far on the next panel's first vector starts. Only with more
// rows than a register tile's, whose first pass waits on memory.
inline int64_t NextPanelAhead(const KernelArgs& a, int panel, const BlockedVector& first) {
  if (a.m <= kMR || 2 * panel + 2 >= BlockedVectors(a)) return 0;
  return BlockedVectorAt(a, 2 * panel + 2).at[0] - first.at[0];
}

// Panel `panel` of a blocked nt weight (BlockedPanels of them: vectors
// 2 panel and 2 panel + 1, BlockedVectorAt), every row. A panel of whole
// blocks is read where it lies, k-major already (no transposing), except
// that 16-bit weights under several tiles are widened into `packed` (a.k *
// kNR floats) first; a panel with a tail is widened into it whole, except
// that vdpbf16ps reads a bf16 tail as a block padded with zero rows and a
// block where it lies.
template <typename W>
void BlockedPanel(const KernelArgs& a, int panel, float* packed) {
  const int count = 2 * panel + 1 < BlockedVectors(a) ? 2 : 1;
  BlockedVector v[2];
  v[0] = BlockedVectorAt(a, 2 * panel);
  if (count == 2) v[1] = BlockedVectorAt(a, 2 * panel + 1);
  PanelOut out;
  for (int q = 0; q < 2; ++q) {
    for (int r = 0; r < 2; ++r) {
      out.col[q][r] = v[q].col[r];
      out.lanes[q][r] = v[q].width[r];
    }
  }
  const int j0 = v[0].col[0], lanes0 = v[0].width[0] + v[0].width[1];
  const int cols = lanes0 + v[1].width[0] + v[1].width[1];
  // The default: the cols columns from j0, the first vector's 16 then the
  // second's (or the first's alone).
  const bool runs_on = v[0].width[1] == 0 && v[1].width[1] == 0 &&
                       (count == 1 || (lanes0 == 16 && v[1].col[0] == j0 + 16));
  const PanelOut* where = runs_on ? nullptr : &out;
  // Fixed-point tiles store by j0 and cols: their blocked weights are one
  // item each (ColumnBlockedItem), whose panels' columns run on.
  FS_CHECK(where == nullptr || a.out != GemmOut::kFixedItems);
  const W* w = static_cast<const W*>(a.w);
  const W* b0 = w + v[0].at[0];
  const W* b1 = count == 2 ? w + v[1].at[0] : b0;
  if (v[0].width[0] == 16 && (count == 1 || v[1].width[0] == 16)) {  // whole blocks
    if (std::is_same_v<W, float> || a.m <= kMR || a.dpbf16) {
      Panel<W> p{b0, b1, 16, cols};
      p.out = where;
      p.ahead = NextPanelAhead(a, panel, v[0]);
      PanelRows<kPairs<W>>(a, j0, p);
      return;
    }
    // 16-bit weights under several tiles: widened once into the panel (the
    // same values), not once per tile.
    WidenBlock(b0, a.k, packed);
    if (count == 2) WidenBlock(b1, a.k, packed + 16);
  } else {
#if defined(__AVX512F__)
    if constexpr (kPairs<W>) {
      if (a.dpbf16) {
        // vdpbf16ps reads a tail (never two in a vector here:
        // BlockedTailsJoined) as a block of 16 rows, its rows past the
        // tail zero (never stored); a block stays where it lies.
        const BF16* src[2] = {b0, b1};
        for (int q = 0; q < count; ++q) {
          if (v[q].width[0] == 16) continue;
          BF16* pad = reinterpret_cast<BF16*>(packed) + q * 16 * static_cast<int64_t>(a.k);
          PadTailToBlock(a, w + v[q].at[0], v[q].width[0], pad);
          src[q] = pad;
        }
        Panel<W> p{src[0], count == 2 ? src[1] : src[0], 16, cols};
        p.out = where;
        // (A padded tail asks for lines of the packed buffer's.)
        if (v[0].width[0] == 16) p.ahead = NextPanelAhead(a, panel, v[0]);
        PanelRows<true>(a, j0, p);
        return;
      }
    }
#endif
    for (int q = 0; q < count; ++q) {
      if (v[q].width[0] == 16) {
        WidenBlock(w + v[q].at[0], a.k, packed + 16 * q);
      } else {
        WidenRuns(a, w, v[q], packed + 16 * q);
      }
    }
  }
  Panel<float> p{packed, count == 2 ? packed + 16 : packed, kNR, cols};
  p.out = where;
  WidenedPanelRows<W>(a, j0, p);
}

// bf16 decode and batched decode (DirectWide) read each weight once, unit
// by unit: every load also asks for the line KernelArgs::ahead_bytes further
// down its unit, so that more of the weight's reads are in flight than the
// hardware prefetchers keep (f32 decode's four runs of long units reach the
// bandwidth without it).
template <typename W>
FS_INLINE void PrefetchAhead(const KernelArgs& a, const W* p) {
  __builtin_prefetch(reinterpret_cast<const char*>(p) + a.ahead_bytes);
}

// Below AVX-512 a vector is two registers (or four) of sixteen: the blocks
// read side by side are fewer (DirectBlockedRange) and each block's vectors
// go straight into its chains, where loading every block's first kept more
// vectors live than there are registers (each k-value spilled and
// reloaded).
#if defined(__AVX512F__)
inline constexpr bool kFewRegisters = false;
#else
inline constexpr bool kFewRegisters = true;
#endif

// nt with few rows on a blocked weight: NB blocks of 16 rows (b[q], output
// columns from col[q]) stream side by side, one vector of each per k-value,
// into MR x NB accumulators.
template <int MR, int NB, typename W>
void DirectBlocked(const KernelArgs& a, const W* const* bp, const int* col) {
  V16 acc[MR][NB];
  const W* b[NB];
#pragma GCC unroll 4
  for (int q = 0; q < NB; ++q) b[q] = bp[q];
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int q = 0; q < NB; ++q) {
      acc[i][q] = a.out == GemmOut::kAccumulate
                      ? Load(a.y + static_cast<int64_t>(i) * a.ldy + col[q])
                      : V16{};
    }
  }
  int kk = 0;
  if constexpr (kPairs<W>) {
    // Two k-values per vector, widened in-lane; the bf16 chain takes the odd
    // one, then the even one; an odd k's last value after a zero pair.
    const float* xs[MR];
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) xs[i] = XsRow(a, i, 0);
    for (; kk < a.k; kk += 2) {
      if (kFewRegisters && kk + 2 <= a.k) {
#pragma GCC unroll 4
        for (int q = 0; q < NB; ++q) {
          V16 e, o;
          PrefetchAhead(a, b[q] + static_cast<int64_t>(kk) * 16);
          LoadPair(b[q] + static_cast<int64_t>(kk) * 16, &e, &o);
#pragma GCC unroll 4
          for (int i = 0; i < MR; ++i) {
            acc[i][q] = FmaBf16(Splat(xs[i][kk + 1]), o, acc[i][q]);
            acc[i][q] = FmaBf16(Splat(xs[i][kk]), e, acc[i][q]);
          }
        }
        continue;
      }
      V16 we[NB], wo[NB];
      if (kk + 2 <= a.k) {
#pragma GCC unroll 4
        for (int q = 0; q < NB; ++q) LoadPair(b[q] + static_cast<int64_t>(kk) * 16, &we[q], &wo[q]);
      } else {
#pragma GCC unroll 4
        for (int q = 0; q < NB; ++q) {
          we[q] = Load(b[q] + static_cast<int64_t>(kk) * 16);
          wo[q] = V16{};
        }
      }
#pragma GCC unroll 4
      for (int i = 0; i < MR; ++i) {
        const V16 s = Splat(xs[i][kk]), t = Splat(xs[i][kk + 1]);
#pragma GCC unroll 4
        for (int q = 0; q < NB; ++q) {
          acc[i][q] = FmaBf16(t, wo[q], acc[i][q]);
          acc[i][q] = FmaBf16(s, we[q], acc[i][q]);
        }
      }
    }
  } else {
    for (; kk < a.k; ++kk) {
      if constexpr (kFewRegisters) {
#pragma GCC unroll 4
        for (int q = 0; q < NB; ++q) {
          const V16 w = Load(b[q] + static_cast<int64_t>(kk) * 16);
#pragma GCC unroll 4
          for (int i = 0; i < MR; ++i) acc[i][q] = Fma(Splat(a.x[i * a.ldx + kk]), w, acc[i][q]);
        }
        continue;
      }
      V16 w[NB];
#pragma GCC unroll 4
      for (int q = 0; q < NB; ++q) w[q] = Load(b[q] + static_cast<int64_t>(kk) * 16);
#pragma GCC unroll 4
      for (int i = 0; i < MR; ++i) {
        const V16 s = Splat(a.x[i * a.ldx + kk]);
#pragma GCC unroll 4
        for (int q = 0; q < NB; ++q) acc[i][q] = Fma(s, w[q], acc[i][q]);
      }
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int q = 0; q < NB; ++q) {
      if (a.out == GemmOut::kFixedItems) {
        AddFixed16(acc[i][q], a.acc + static_cast<int64_t>(i) * a.ldacc + col[q], 16);
      } else {
        Store(a.y + static_cast<int64_t>(i) * a.ldy + col[q], acc[i][q]);
      }
    }
  }
}

// Loads `count` elements of W at p into a vector, the other lanes 0: a tail's
// values near the end of a weight, where a whole vector would read past it.
template <typename W>
FS_INLINE V16 LoadPart(const W* p, int count) {
  W tmp[16] = {};
  std::memcpy(tmp, p, sizeof(W) * count);
  return Load(tmp);
}
FS_INLINE void LoadPairPart(const BF16* p, int lanes, V16* even, V16* odd) {
  BF16 tmp[32] = {};
  std::memcpy(tmp, p, sizeof(BF16) * 2 * lanes);
  LoadPair(tmp, even, odd);
}

// A tail's k-values kk and kk + 1 (t wide, at element `at` of its `end`):
// widened pairs, from a copy near the end; an odd k's last value (`last`)
// with a zero pair.
FS_INLINE void LoadTailPair(const BF16* w, int64_t at, int64_t end, int t, bool last, V16* e,
                            V16* o) {
  if (last) {
    *e = at + 16 <= end ? Load(w + at) : LoadPart(w + at, t);
    *o = V16{};
  } else if (at + 32 <= end) {
    LoadPair(w + at, e, o);
  } else {
    LoadPairPart(w + at, t, e, o);
  }
}

// One k-value kk of NB tails side by side: tail q's vector (load(q)) times
// each row's x onto its accumulators, fma(x, vector, accumulator) being the
// accumulators' fused multiply-add.
template <int MR, int NB, typename Acc, typename Load, typename FmaOp>
FS_INLINE void TailsStep(const KernelArgs& a, int kk, Acc (&acc)[NB][MR], Load load, FmaOp fma) {
#pragma GCC unroll 4
  for (int q = 0; q < NB; ++q) {
    const V16 v = load(q);
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) acc[q][i] = fma(a.x[i * a.ldx + kk], v, acc[q][i]);
  }
}
// The bf16 chain's k-values kk and kk + 1 (load(q, &even, &odd)), the odd
// one first.
template <int MR, int NB, typename Acc, typename Load, typename FmaOp>
FS_INLINE void TailsPairStep(const float* const* xs, int kk, Acc (&acc)[NB][MR], Load load,
                             FmaOp fma) {
#pragma GCC unroll 4
  for (int q = 0; q < NB; ++q) {
    V16 e, o;
    load(q, &e, &o);
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) {
      acc[q][i] = fma(xs[i][kk + 1], o, acc[q][i]);
      acc[q][i] = fma(xs[i][kk], e, acc[q][i]);
    }
  }
}
// The bf16 chain's pairs of NB tails t wide from k-value kk to the end,
// each loaded as it lies (LoadTailPair).
template <int MR, int NB, typename Acc, typename FmaOp>
FS_INLINE void TailsPairsFrom(const KernelArgs& a, const BF16* const* w, const float* const* xs,
                              int kk, int t, Acc (&acc)[NB][MR], FmaOp fma) {
  const int64_t end = static_cast<int64_t>(t) * a.k;  // elements of a tail
  for (; kk < a.k; kk += 2) {
    const int64_t at = static_cast<int64_t>(kk) * t;
    const bool last = kk + 2 > a.k;
    TailsPairStep<MR, NB>(
        xs, kk, acc,
        [&](int q, V16* e, V16* o) FS_INLINE_LAMBDA { LoadTailPair(w[q], at, end, t, last, e, o); },
        fma);
  }
}
// Row i of a tail t wide at column j0, its chains in v: into y, or added to
// the item sums.
FS_INLINE void StoreTail(const KernelArgs& a, int i, int j0, int t, const V16& v) {
  if (a.out == GemmOut::kFixedItems) {
    AddFixed16(v, a.acc + static_cast<int64_t>(i) * a.ldacc + j0, t);
    return;
  }
  float tmp[16];
  Store(tmp, v);
  std::memcpy(a.y + static_cast<int64_t>(i) * a.ldy + j0, tmp, sizeof(float) * t);
}

// nt with few rows on the tails of NB blocked items, each t < 16 rows wide
// (output columns [j0[q], j0[q] + t)), lying k-major, t wide
// (Blocked16Index). A vector read at a k-value holds a tail's rows in lanes
// [0, t); the lanes after hold the next k-values' and are never stored. A
// tail alone is one chain of dependent fused multiply-adds per lane, two per
// pair of k-values, which waits on their latency; side by side (as decode's
// blocks are) the tails' chains overlap.
template <int MR, int NB, typename W>
void DirectTails(const KernelArgs& a, const W* const* w, const int* j0, int t) {
  V16 acc[NB][MR];
#pragma GCC unroll 4
  for (int q = 0; q < NB; ++q) StartAccumulators<MR>(a, j0[q], t, acc[q]);
  auto fma = [](float x, const V16& v, const V16& c)
                 FS_INLINE_LAMBDA { return Fma(Splat(x), v, c); };
  const int64_t end = static_cast<int64_t>(t) * a.k;  // elements of a tail
  if constexpr (kPairs<W>) {
    const float* xs[MR];
    for (int i = 0; i < MR; ++i) xs[i] = XsRow(a, i, 0);
    TailsPairsFrom<MR, NB>(a, w, xs, 0, t, acc,
                           [](float x, const V16& v, const V16& c)
                               FS_INLINE_LAMBDA { return FmaBf16(Splat(x), v, c); });
  } else {
    for (int kk = 0; kk < a.k; ++kk) {
      const int64_t at = static_cast<int64_t>(kk) * t;
      TailsStep<MR, NB>(
          a, kk, acc,
          [&](int q) FS_INLINE_LAMBDA {
            return at + 16 <= end ? Load(w[q] + at) : LoadPart(w[q] + at, t);
          },
          fma);
    }
  }
  for (int q = 0; q < NB; ++q) {
    for (int i = 0; i < MR; ++i) StoreTail(a, i, j0[q], t, acc[q][i]);
  }
}

#if defined(FS_SIMD_AVX2_PARTS)
// DirectTails where every t is at most 8: only the first of a vector's two
// AVX2 registers holds lanes that are stored, so each chain is one register
// and each load one register's (a gate_up item of 88 rows has a tail of 8:
// DirectTails computed and loaded both halves, and its sixteen accumulator
// registers went through the stack at every k-value). The same chains.
template <int MR, int NB, typename W>
void DirectTailsHalf(const KernelArgs& a, const W* const* w, const int* j0, int t) {
  typedef V16::Part P;
  P acc[NB][MR];
#pragma GCC unroll 4
  for (int q = 0; q < NB; ++q) {
    V16 start[MR];
    StartAccumulators<MR>(a, j0[q], t, start);
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) acc[q][i] = start[i].p[0];
  }
  auto fma = [](float x, const V16& v, P c) FS_INLINE_LAMBDA {
    return reinterpret_cast<P>(_mm256_fmadd_ps(_mm256_set1_ps(x), reinterpret_cast<__m256>(v.p[0]),
                                               reinterpret_cast<__m256>(c)));
  };
  const int64_t end = static_cast<int64_t>(t) * a.k;  // elements of a tail
  // Whole loads first, with no branch (the accumulators stay in registers;
  // lanes 8-15 are unused, their loads dropped), then the last few
  // k-values.
  int kk = 0;
  if constexpr (kPairs<W>) {
    const float* xs[MR];
    for (int i = 0; i < MR; ++i) xs[i] = XsRow(a, i, 0);
    for (; kk + 2 <= a.k && static_cast<int64_t>(kk) * t + 32 <= end; kk += 2) {
      const int64_t at = static_cast<int64_t>(kk) * t;
      TailsPairStep<MR, NB>(
          xs, kk, acc, [&](int q, V16* e, V16* o) FS_INLINE_LAMBDA { LoadPair(w[q] + at, e, o); },
          fma);
    }
    TailsPairsFrom<MR, NB>(a, w, xs, kk, t, acc, fma);
  } else {
    for (; kk < a.k && static_cast<int64_t>(kk) * t + 16 <= end; ++kk) {
      const int64_t at = static_cast<int64_t>(kk) * t;
      TailsStep<MR, NB>(
          a, kk, acc, [&](int q) FS_INLINE_LAMBDA { return Load(w[q] + at); }, fma);
    }
    for (; kk < a.k; ++kk) {
      const int64_t at = static_cast<int64_t>(kk) * t;
      TailsStep<MR, NB>(
          a, kk, acc, [&](int q) FS_INLINE_LAMBDA { return LoadPart(w[q] + at, t); }, fma);
    }
  }
  for (int q = 0; q < NB; ++q) {
    for (int i = 0; i < MR; ++i) {
      V16 r{};
      r.p[0] = acc[q][i];
      StoreTail(a, i, j0[q], t, r);
    }
  }
}
#else
template <int MR, int NB, typename W>
void DirectTailsHalf(const KernelArgs& a, const W* const* w, const int* j0, int t) {
  DirectTails<MR, NB, W>(a, w, j0, t);
}
#endif

template <int MR, typename W>
void DirectTail(const KernelArgs& a, const W* w, int t, int j0) {
  if (t <= 8) return DirectTailsHalf<MR, 1, W>(a, &w, &j0, t);
  DirectTails<MR, 1, W>(a, &w, &j0, t);
}

// Decode's blocks (and bf16's units by vdpbf16ps) are taken in batches of
// up to this many, four side by side from the four quarters of a batch
// (DirectBlockedRange, DirectDpbf16Quarters).
inline constexpr int kQuarterUnits = 128;

#if defined(__AVX512F__)

// A unit of a blocked bf16 weight for DirectDpbf16: a block of 16 rows or an
// item's tail of fewer, k-major in pairs ([k / 2][width][2], then an odd k's
// last value [width]), whose rows are output columns [col, col + width).
struct DirectUnit {
  const BF16* w;
  int width;
  int col;
};

// nt with few rows on a blocked bf16 weight by vdpbf16ps
// (KernelArgs::dpbf16): NB units side by side, one instruction per pair and
// unit (DirectBlocked's chains, bit for bit: Dpbf16MatchesChain), a third of
// the instructions per byte of widening each pair for two fused
// multiply-adds, which keeps more of the weight's reads in flight. A tail
// (a unit narrower than 16) is read with masked loads, its lanes past its
// width zero, never past its end. An odd k's last value takes
// the two fused multiply-adds of its zero-padded pair.
template <int MR, int NB>
__attribute__((target("avx512bf16"), always_inline)) inline void DirectDpbf16Body(
    const KernelArgs& a, const DirectUnit* u) {
  __m512 acc[MR][NB];
  __mmask32 pairs_mask[NB];
  __mmask16 lanes_mask[NB];
#pragma GCC unroll 4
  for (int q = 0; q < NB; ++q) {
    pairs_mask[q] = u[q].width >= 16 ? ~__mmask32{0} : (__mmask32{1} << (2 * u[q].width)) - 1;
    lanes_mask[q] = static_cast<__mmask16>((1u << u[q].width) - 1);
  }
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int q = 0; q < NB; ++q) {
      acc[i][q] = a.out == GemmOut::kAccumulate
                      ? _mm512_maskz_loadu_ps(lanes_mask[q],
                                              a.y + static_cast<int64_t>(i) * a.ldy + u[q].col)
                      : _mm512_setzero_ps();
    }
  }
  const uint32_t* xw[MR];
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i) xw[i] = a.xw + i * a.ldxs / 2;
  const int pairs = a.k / 2;
  for (int p = 0; p < pairs; ++p) {
    __m512bh w[NB];
#pragma GCC unroll 4
    for (int q = 0; q < NB; ++q) {
      const BF16* at = u[q].w + static_cast<int64_t>(p) * 2 * u[q].width;
      PrefetchAhead(a, at);
      w[q] = reinterpret_cast<__m512bh>(
          u[q].width == 16 ? _mm512_loadu_si512(at) : _mm512_maskz_loadu_epi16(pairs_mask[q], at));
    }
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) {
      const __m512bh x = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(xw[i][p])));
#pragma GCC unroll 4
      for (int q = 0; q < NB; ++q) acc[i][q] = _mm512_dpbf16_ps(acc[i][q], x, w[q]);
    }
  }
  if (a.k % 2) {  // the last value, after its zero-padded pair (ChainBf16)
    const int kk = a.k - 1;
#pragma GCC unroll 4
    for (int q = 0; q < NB; ++q) {
      const __m256i h =
          _mm256_maskz_loadu_epi16(lanes_mask[q], u[q].w + static_cast<int64_t>(kk) * u[q].width);
      const __m512 wl = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
#pragma GCC unroll 4
      for (int i = 0; i < MR; ++i) {
        const float* xs = XsRow(a, i, 0);
        acc[i][q] = _mm512_fmadd_ps(_mm512_set1_ps(xs[kk + 1]), _mm512_setzero_ps(), acc[i][q]);
        acc[i][q] = _mm512_fmadd_ps(_mm512_set1_ps(xs[kk]), wl, acc[i][q]);
      }
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int q = 0; q < NB; ++q) {
      if (a.out == GemmOut::kFixedItems) {
        AddFixed16(reinterpret_cast<V16>(acc[i][q]),
                   a.acc + static_cast<int64_t>(i) * a.ldacc + u[q].col, u[q].width);
      } else {
        _mm512_mask_storeu_ps(a.y + static_cast<int64_t>(i) * a.ldy + u[q].col, lanes_mask[q],
                              acc[i][q]);
      }
    }
  }
}

template <int MR, int NB>
__attribute__((target("avx512bf16"), noinline)) void DirectDpbf16(const KernelArgs& a,
                                                                  const DirectUnit* u) {
  DirectDpbf16Body<MR, NB>(a, u);
}

// `groups` groups of four units side by side, one group after another
// (u[4 g + q]), in one call.
template <int MR>
__attribute__((target("avx512bf16"), noinline)) void DirectDpbf16Groups(const KernelArgs& a,
                                                                        const DirectUnit* u,
                                                                        int groups) {
  for (int g = 0; g < groups; ++g) DirectDpbf16Body<MR, 4>(a, u + 4 * g);
}

// Up to kQuarterUnits units of a blocked bf16 weight (in column order,
// their weights `shift` elements on) by vdpbf16ps: four side by side, one
// from each quarter of them, rather than four neighbours. Each quarter's
// units lie one after another, so the weight is read as four runs far
// apart, each going on where its last unit ended (a Zen 5, bf16 decode at
// batch 1: 1.01-1.08x on one thread, 1.06-1.13x on two).
template <int MR>
void DirectDpbf16Quarters(const KernelArgs& a, const DirectUnit* units, int count, int64_t shift) {
  static constexpr void (*kSideBySide[])(const KernelArgs&, const DirectUnit*) = {
      nullptr, DirectDpbf16<MR, 1>, DirectDpbf16<MR, 2>, DirectDpbf16<MR, 3>, DirectDpbf16<MR, 4>};
  const int per = (count + 3) / 4;
  DirectUnit u[kQuarterUnits];
  auto take = [&](int i) {
    DirectUnit v = units[i];
    v.w += shift;
    return v;
  };
  int groups = 0;
  for (; groups < per && 3 * per + groups < count; ++groups) {
    for (int q = 0; q < 4; ++q) u[4 * groups + q] = take(q * per + groups);
  }
  if (groups > 0) DirectDpbf16Groups<MR>(a, u, groups);
  for (int i = groups; i < per; ++i) {  // the last quarter is shorter
    int n = 0;
    for (int q = 0; q < 4; ++q)
      if (q * per + i < count) u[n++] = take(q * per + i);
    kSideBySide[n](a, u);
  }
}

// The units of columns [j0, j1) of a blocked bf16 weight (at the start of
// units), kQuarterUnits at a time: each batch to run(units, count).
template <typename Run>
void DirectUnitBatches(const KernelArgs& a, int j0, int j1, Run run) {
  const int rows = BlockedItemRows(a), full = rows / 16 * 16;
  DirectUnit units[kQuarterUnits];
  int count = 0;
  for (int j = j0; j < j1;) {
    const int c0 = j / rows * rows;  // an item at a time (DirectBlockedRange)
    const BF16* w = static_cast<const BF16*>(a.w) + static_cast<int64_t>(c0) * a.k;
    for (const int end = std::min(c0 + rows, j1); j < end;) {
      const int r = j - c0;
      units[count] = DirectUnit{w + static_cast<int64_t>(r) * a.k, r < full ? 16 : rows - full, j};
      j += units[count++].width;
      if (count == kQuarterUnits) {
        run(units, count);
        count = 0;
      }
    }
  }
  if (count > 0) run(units, count);
}

template <int MR>
void DirectDpbf16Range(const KernelArgs& a, int j0, int j1) {
  DirectUnitBatches(a, j0, j1, [&a](const DirectUnit* units, int count) {
    DirectDpbf16Quarters<MR>(a, units, count, 0);
  });
}
#endif

template <int MR, typename W>
void DirectColumnItems(const KernelArgs& a, int j0, int j1);

// Columns [j0, j1) of a blocked weight, j0 and j1 at the start of a unit
// (BlockedUnitColumn): each tail alone, the blocks of 16 rows four side by
// side, one from each quarter of up to kQuarterUnits of them (as bf16's
// by vdpbf16ps, DirectDpbf16Quarters), so that the weight is read as four
// runs far apart (f32 decode at batch 1 on one thread of a Xeon: 1.09-1.13x
// against four neighbours).
template <int MR, typename W>
void DirectBlockedRange(const KernelArgs& a, int j0, int j1) {
  if (!a.nt) return DirectColumnItems<MR, W>(a, j0, j1);
#if defined(__AVX512F__)
  if constexpr (kPairs<W>) {
    if (a.dpbf16) return DirectDpbf16Range<MR>(a, j0, j1);
  }
#endif
  const int rows = BlockedItemRows(a), full = rows / 16 * 16;
  static constexpr void (*kSideBySide[])(const KernelArgs&, const W* const*, const int*) = {
      nullptr, DirectBlocked<MR, 1, W>, DirectBlocked<MR, 2, W>, DirectBlocked<MR, 3, W>,
      DirectBlocked<MR, 4, W>};
  const W* blocks[kQuarterUnits];
  int cols[kQuarterUnits];
  int count = 0;
  // Tails too go side by side, as many as the blocks (DirectTails); every
  // tail of a weight is as wide, so at most 8 wide or not.
  static constexpr void (*kTailsSideBySide[2][5])(const KernelArgs&, const W* const*, const int*,
                                                  int) = {
      {nullptr, DirectTails<MR, 1, W>, DirectTails<MR, 2, W>, DirectTails<MR, 3, W>,
       DirectTails<MR, 4, W>},
      {nullptr, DirectTailsHalf<MR, 1, W>, DirectTailsHalf<MR, 2, W>, DirectTailsHalf<MR, 3, W>,
       DirectTailsHalf<MR, 4, W>}};
  const bool half_tails = rows - full <= 8;
  const W* tails[4];
  int tail_cols[4];
  int tail_count = 0;
  // Side by side: four, or with fewer registers as many as keep MR x NB
  // vectors of accumulators in eight of them.
  constexpr int kSide = kFewRegisters ? std::max(1, 4 / MR) : 4;
  auto run = [&]() {
    const int per = (count + kSide - 1) / kSide;
    for (int g = 0; g < per; ++g) {
      const W* b[4];
      int c[4], n = 0;
      for (int q = 0; q < kSide; ++q) {
        if (q * per + g < count) {
          b[n] = blocks[q * per + g];
          c[n++] = cols[q * per + g];
        }
      }
      kSideBySide[n](a, b, c);
    }
    count = 0;
  };
  // Item by item (one division each, not one a block: o's blocks are 64
  // k-values long).
  for (int j = j0; j < j1;) {
    const int c0 = j / rows * rows;
    const W* w = static_cast<const W*>(a.w) + static_cast<int64_t>(c0) * a.k;
    for (const int blocks_end = std::min(c0 + full, j1); j < blocks_end; j += 16) {
      blocks[count] = w + static_cast<int64_t>(j - c0) * a.k;
      cols[count++] = j;
      if (count == kQuarterUnits) run();
    }
    if (full < rows && j < j1) {  // at the item's tail
      tails[tail_count] = w + static_cast<int64_t>(full) * a.k;
      tail_cols[tail_count++] = c0 + full;
      if (tail_count == kSide) {
        kTailsSideBySide[half_tails][tail_count](a, tails, tail_cols, rows - full);
        tail_count = 0;
      }
      j = c0 + rows;
    }
  }
  run();
  if (tail_count > 0) kTailsSideBySide[half_tails][tail_count](a, tails, tail_cols, rows - full);
}

// nt with kDirectRows < MR <= kWideRows rows on a blocked f32 weight, or a
// bf16 one by fused multiply-adds (batched decode): one block of 16 columns
// at a time, read once for all the rows, whose chains stay in MR registers
// (a bf16 pair widened once for all of them); the rows' activations k-major
// (KernelArgs::xk), so that a k-value's MR broadcasts read one line of the
// first-level cache rather than MR rows far apart; each load asks for the
// block's line KernelArgs::ahead_bytes on. Register tiles of 8 rows read a panel
// from memory in their first pass and wait on it, then again from the cache
// (a Xeon, gate_up at 16 rows: 1.23-1.27x; docs/CPU_PERFORMANCE.md). The
// chains are DirectBlocked's.
template <int MR, typename W>
void DirectWideRows(const KernelArgs& a, int j0, int j1) {
  const int rows = BlockedItemRows(a), full = rows / 16 * 16;
  for (int j = j0; j < j1;) {
    const int item = j / rows, c0 = item * rows, r = j - c0;
    const W* w = static_cast<const W*>(a.w) + static_cast<int64_t>(c0) * a.k;
    if (r >= full) {  // an item's tail
      DirectTail<MR, W>(a, w + static_cast<int64_t>(full) * a.k, rows - full, c0 + full);
      j = c0 + rows;
      continue;
    }
    const W* b = w + static_cast<int64_t>(r) * a.k;
    V16 acc[MR];
    StartAccumulators<MR>(a, j, 16, acc);
    const float* xk = a.xk;
    if constexpr (kPairs<W>) {
      // Two k-values per lane: the odd one, then the even one; an odd k's
      // last value after a zero pair.
      for (int kk = 0; kk < a.k; kk += 2, b += 32, xk += 2 * MR) {
        PrefetchAhead(a, b);
        V16 e, o{};
        if (kk + 2 <= a.k) {
          LoadPair(b, &e, &o);
        } else {
          e = Load(b);
        }
#pragma GCC unroll 16
        for (int i = 0; i < MR; ++i) {
          acc[i] = FmaBf16(Splat(xk[MR + i]), o, acc[i]);
          acc[i] = FmaBf16(Splat(xk[i]), e, acc[i]);
        }
      }
    } else {
#pragma GCC unroll 2
      for (int kk = 0; kk < a.k; ++kk, b += 16, xk += MR) {
        PrefetchAhead(a, b);
        const V16 v = Load(b);
#pragma GCC unroll 16
        for (int i = 0; i < MR; ++i) acc[i] = Fma(Splat(xk[i]), v, acc[i]);
      }
    }
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) Store(a.y + static_cast<int64_t>(i) * a.ldy + j, acc[i]);
    j += 16;
  }
}

template <typename W, int MR = kWideRows>
void DirectWideDispatch(const KernelArgs& a, int j0, int j1) {
  if constexpr (MR > kDirectRows + 1) {
    if (a.m < MR) return DirectWideDispatch<W, MR - 1>(a, j0, j1);
  }
  DirectWideRows<MR, W>(a, j0, j1);
}

template <typename W>
void DirectWide(const KernelArgs& a, int j0, int j1) {
  DirectWideDispatch<W>(a, j0, j1);
}

// Columns [j0, j1) (at the start of units of 16) of a column-blocked weight
// in fixed-point items (nn, GemmArgs::w_blocked16): item after item, each
// the blocked nt weight it is (ColumnBlockedItem). By vdpbf16ps the units are
// laid out once for every item: an item's units are only item_k long.
template <int MR, typename W>
void DirectColumnItems(const KernelArgs& a, int j0, int j1) {
  const int items = a.k / a.item_k;
#if defined(__AVX512F__)
  if constexpr (kPairs<W>) {
    if (a.dpbf16) {
      const int64_t item_step = static_cast<int64_t>(a.n) * a.item_k;
      DirectUnitBatches(ColumnBlockedItem(a, 0), j0, j1,
                        [&a, items, item_step](const DirectUnit* units, int count) {
                          for (int c = 0; c < items; ++c) {
                            DirectDpbf16Quarters<MR>(ColumnBlockedItem(a, c), units, count,
                                                     c * item_step);
                          }
                        });
      return;
    }
  }
#endif
  for (int c = 0; c < items; ++c) DirectBlockedRange<MR, W>(ColumnBlockedItem(a, c), j0, j1);
}

}  // namespace
}  // namespace failsafe::cpu
