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
#include <cstring>
#include <type_traits>
#include <utility>

#include "backend/backend.h"
#include "backend/cpu/gemm_kernels.h"
#include "backend/cpu/simd.h"
#include "common/check.h"
#include "common/fixed_point.h"

namespace failsafe::cpu {

namespace {

#define FS_INLINE __attribute__((always_inline)) inline

// Whether the kernels take W's k-values in pairs, two per 32-bit lane
// widened in-lane: bf16, as its blocked layout holds them (Blocked16Pairs and
// Blocked16Index in backend/backend.h) and as a row of [n, k] holds two
// neighbours.
template <typename W>
constexpr bool kPairs = std::is_same_v<W, BF16>;

// The bf16 chain's activations of row i from k-value kk's slot on
// (KernelArgs::xs): the chain's pair (kk + 2p, kk + 2p + 1) at slots 2p, 2p + 1
// when kk starts a pair.
FS_INLINE const float* XsRow(const KernelArgs& a, int i, int kk) {
  return a.xs + i * a.ldxs + XSlot(a, kk);
}

// The first `count` (1 to 16) floats at p, the other lanes 0; and their
// store: a whole vector when count is 16, never touching memory past them.
FS_INLINE V16 LoadPart(const float* p, int count) {
  if (count == 16) return Load(p);
#if defined(__AVX512F__)
  return reinterpret_cast<V16>(_mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << count) - 1), p));
#else
  float tmp[16] = {};
  for (int j = 0; j < count; ++j) tmp[j] = p[j];
  return Load(tmp);
#endif
}
FS_INLINE void StorePart(float* p, V16 v, int count) {
  if (count == 16) return Store(p, v);
#if defined(__AVX512F__)
  _mm512_mask_storeu_ps(p, static_cast<__mmask16>((1u << count) - 1), reinterpret_cast<__m512>(v));
#else
  for (int j = 0; j < count; ++j) p[j] = v[j];
#endif
}

// Row r of w (nt: an output column; nn: a k-value) in its element type W.
template <typename W>
FS_INLINE const W* WRow(const KernelArgs& a, int r) {
  if (a.w_rows) return reinterpret_cast<const W*>(a.w_rows[r]);
  return static_cast<const W*>(a.w) + static_cast<int64_t>(r) * a.ldw;
}

// Rows x and y (B apart) of the recursive block transpose's round B:
// lanes 0-15 of the shuffles pick from x, 16-31 from y.
template <int B, typename V, int... L>
FS_INLINE void SwapRows(V* x, V* y, std::integer_sequence<int, L...>) {
  const V a = *x, c = *y;
  *x = Shuffle<((L & B) ? 16 + (L - B) : L)...>(a, c);
  *y = Shuffle<((L & B) ? 16 + L : L + B)...>(a, c);
}

// One round of the recursive block transpose: swaps the off-diagonal B x B
// blocks of every 2B x 2B block.
template <int B, typename V>
FS_INLINE void SwapBlocks(V r[16]) {
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) {
    if (i & B) continue;
    SwapRows<B>(&r[i], &r[i + B], std::make_integer_sequence<int, 16>());
  }
}

// r[i][l] becomes r[l][i] (16 float or 32-bit integer lanes; bits move
// unchanged).
template <typename V>
FS_INLINE void Transpose16(V r[16]) {
  SwapBlocks<8>(r);
  SwapBlocks<4>(r);
  SwapBlocks<2>(r);
  SwapBlocks<1>(r);
}

// ---------------------------------------------------------------------------
// nt with few rows (decode): the weights are read once, as they lie. Sixteen
// weight rows at a time (sixteen output columns, one vector): each 16 x 16
// block is transposed in registers, so that the chains over k run along the
// columns. MR <= kDirectRows rows of x.

// The accumulators of MR rows over output columns [j0, j0 + cols), cols <=
// 16: y's values when accumulating onto it, else zero.
template <int MR>
inline void StartAccumulators(const KernelArgs& a, int j0, int cols, V16* acc) {
  float tmp[16];
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i) {
    if (a.out == GemmOut::kAccumulate) {
      std::memset(tmp, 0, sizeof(tmp));
      std::memcpy(tmp, a.y + static_cast<int64_t>(i) * a.ldy + j0, sizeof(float) * cols);
      acc[i] = Load(tmp);
    } else {
      acc[i] = V16{};
    }
  }
}

// Rows given by pointers (GemmArgs::w_rows) are asked for kRowsAheadNT /
// kRowsAheadNN rows ahead of their use (gemm.h).
template <typename W>
FS_INLINE void PrefetchRows(const KernelArgs& a, int r0, int r1, int c0, int64_t bytes) {
  for (int r = r0; r < r1; ++r) {
    const char* row = reinterpret_cast<const char*>(WRow<W>(a, r) + c0);
    for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(row + b);
  }
}

template <int MR, typename W>
void DirectNT(const KernelArgs& a, int j0, int cols) {
  V16 acc[MR];
  StartAccumulators<MR>(a, j0, cols, acc);
  float tmp[16];
  const W* wr[16];
  for (int q = 0; q < 16; ++q) wr[q] = WRow<W>(a, j0 + std::min(q, cols - 1));
  if (a.w_rows) {
    PrefetchRows<W>(a, std::min(a.n, j0 + kRowsAheadNT), std::min(a.n, j0 + kRowsAheadNT + 16), 0,
                    static_cast<int64_t>(a.k * sizeof(W)));
  }
  int kb = 0;
  if constexpr (kPairs<W>) {
    // bf16: 32 k-values of each row at a time, as 16 lanes of two; the
    // transpose moves the lanes (half the shuffles per value of transposing
    // widened values), then each lane is widened in-lane into k-values
    // kb + 2t and kb + 2t + 1, taken odd first (the bf16 chain).
    const float* xs[MR];
    for (int i = 0; i < MR; ++i) xs[i] = XsRow(a, i, 0);
    for (; kb + 32 <= a.k; kb += 32) {
      I16 r[16];
#pragma GCC unroll 16
      for (int q = 0; q < 16; ++q) r[q] = LoadLanes(wr[q] + kb);
      Transpose16(r);  // lane q of r[t]: w[j0 + q][kb + 2t], w[j0 + q][kb + 2t + 1]
#pragma GCC unroll 16
      for (int t = 0; t < 16; ++t) {
        V16 even, odd;
        WidenPair(r[t], &even, &odd);
#pragma GCC unroll 4
        for (int i = 0; i < MR; ++i) {
          acc[i] = Fma(Splat(xs[i][kb + 2 * t + 1]), odd, acc[i]);
          acc[i] = Fma(Splat(xs[i][kb + 2 * t]), even, acc[i]);
        }
      }
    }
    // The last pairs, an odd k's last value with a zero (its slot is 0).
    for (; kb < a.k; kb += 2) {
      float even[16], odd[16];
      for (int q = 0; q < 16; ++q) {
        even[q] = Widen(wr[q][kb]);
        odd[q] = kb + 1 < a.k ? Widen(wr[q][kb + 1]) : 0.0f;
      }
      for (int i = 0; i < MR; ++i) {
        acc[i] = Fma(Splat(xs[i][kb + 1]), Load(odd), acc[i]);
        acc[i] = Fma(Splat(xs[i][kb]), Load(even), acc[i]);
      }
    }
  } else {
    for (; kb + 16 <= a.k; kb += 16) {
      V16 r[16];
#pragma GCC unroll 16
      for (int q = 0; q < 16; ++q) r[q] = Load(wr[q] + kb);
      Transpose16(r);  // r[t][q] = w[j0 + q][kb + t]
#pragma GCC unroll 16
      for (int t = 0; t < 16; ++t) {
#pragma GCC unroll 4
        for (int i = 0; i < MR; ++i) acc[i] = Fma(Splat(a.x[i * a.ldx + kb + t]), r[t], acc[i]);
      }
    }
    for (; kb < a.k; ++kb) {
      for (int q = 0; q < 16; ++q) tmp[q] = Widen(wr[q][kb]);
      for (int i = 0; i < MR; ++i) acc[i] = Fma(Splat(a.x[i * a.ldx + kb]), Load(tmp), acc[i]);
    }
  }
  for (int i = 0; i < MR; ++i) {
    float* y = a.y + static_cast<int64_t>(i) * a.ldy + j0;
    if (cols == 16) {  // a whole vector: no call (decode attention's scores: 4 a block)
      Store(y, acc[i]);
      continue;
    }
    Store(tmp, acc[i]);
    std::memcpy(y, tmp, sizeof(float) * cols);
  }
}

template <int MR, typename W>
void DirectBlockedRange(const KernelArgs& a, int j0, int j1);
template <typename W>
void DirectWide(const KernelArgs& a, int j0, int j1);

template <typename W>
void DirectRange(const KernelArgs& a, int j0, int j1) {
  if (a.w_blocked16) {
    if constexpr (std::is_same_v<W, float> || kPairs<W>) {
      if (a.m > kDirectRows) return DirectWide<W>(a, j0, j1);
    }
    switch (a.m) {
      case 1:
        return DirectBlockedRange<1, W>(a, j0, j1);
      case 2:
        return DirectBlockedRange<2, W>(a, j0, j1);
      case 3:
        return DirectBlockedRange<3, W>(a, j0, j1);
      default:
        return DirectBlockedRange<4, W>(a, j0, j1);
    }
  }
  // Sixteen rows of weights are read side by side; more streams than that
  // serve worse.
  for (int j = j0; j < j1; j += 16) {
    const int cols = std::min(16, j1 - j);
    switch (a.m) {
      case 1:
        DirectNT<1, W>(a, j, cols);
        break;
      case 2:
        DirectNT<2, W>(a, j, cols);
        break;
      case 3:
        DirectNT<3, W>(a, j, cols);
        break;
      default:
        DirectNT<4, W>(a, j, cols);
        break;
    }
  }
}

// ---------------------------------------------------------------------------
// nn: chains over k. Few rows: the accumulators live in a small buffer and
// weight rows stream through it. Many rows: register tiles of kMR rows x 32
// columns over a packed panel.

// ToFixed's clamp (NaN counts as 0); the two bounds in the operand order of
// vminps / vmaxps, so that each is one instruction.
FS_INLINE V16 ClampForFixed(V16 v) {
  const V16 lim = Splat(kFixedLimit), zero{};
  v = Select(v == v, v, zero);
  v = Select(lim < v, lim, v);
  return Select(-lim > v, -lim, v);
}

// acc64[j] += ToFixed(v[j]) for j < cols (up to 16).
FS_INLINE void AddFixed16(V16 v, int64_t* acc64, int cols) {
#if defined(__AVX512F__)
  typedef float V8F __attribute__((vector_size(32)));
  typedef int64_t V8L __attribute__((vector_size(64)));
  typedef uint64_t V8U __attribute__((vector_size(64)));
#endif
#if defined(__AVX512DQ__)
  if (cols >= 16) {
    // ToFixed in three instructions: vrangeps takes the smaller magnitude
    // of v and the limit with v's sign (the clamp), the scaling is masked
    // to zero where v is NaN; then the same truncations (vcvttps2qq).
    const __m512 x = reinterpret_cast<__m512>(v);
    const __mmask16 number = _mm512_cmp_ps_mask(x, x, _CMP_ORD_Q);
    const __m512 cv = _mm512_maskz_mul_ps(
        number, _mm512_range_ps(x, _mm512_set1_ps(kFixedLimit), 0x2), _mm512_set1_ps(kFixedOne));
    const __m512i lo = _mm512_cvttps_epi64(_mm512_castps512_ps256(cv));
    const __m512i hi = _mm512_cvttps_epi64(_mm512_extractf32x8_ps(cv, 1));
    _mm512_storeu_si512(acc64, _mm512_add_epi64(_mm512_loadu_si512(acc64), lo));
    _mm512_storeu_si512(acc64 + 8, _mm512_add_epi64(_mm512_loadu_si512(acc64 + 8), hi));
    return;
  }
#endif
  const V16 c = ClampForFixed(v) * Splat(kFixedOne);
#if defined(__AVX512F__)
  if (cols >= 16) {
    const V8F lo = __builtin_shufflevector(c, c, 0, 1, 2, 3, 4, 5, 6, 7);
    const V8F hi = __builtin_shufflevector(c, c, 8, 9, 10, 11, 12, 13, 14, 15);
    V8U a0, a1;
    __builtin_memcpy(&a0, acc64, 64);
    __builtin_memcpy(&a1, acc64 + 8, 64);
    a0 += reinterpret_cast<V8U>(__builtin_convertvector(lo, V8L));  // wrapping, as AddFixed
    a1 += reinterpret_cast<V8U>(__builtin_convertvector(hi, V8L));
    __builtin_memcpy(acc64, &a0, 64);
    __builtin_memcpy(acc64 + 8, &a1, 64);
    return;
  }
#elif defined(FS_SIMD_AVX2_PARTS)
  if (cols >= 16) {
    // Four lanes at a time: four int64 sums are one AVX2 register.
    typedef float F4 __attribute__((vector_size(16)));
    typedef int64_t L4 __attribute__((vector_size(32)));
    typedef uint64_t U4 __attribute__((vector_size(32)));
#pragma GCC unroll 2
    for (int j = 0; j < V16::kParts; ++j) {
      const F4 lo = __builtin_shufflevector(c.p[j], c.p[j], 0, 1, 2, 3);
      const F4 hi = __builtin_shufflevector(c.p[j], c.p[j], 4, 5, 6, 7);
      U4 s0, s1;
      __builtin_memcpy(&s0, acc64 + 8 * j, 32);
      __builtin_memcpy(&s1, acc64 + 8 * j + 4, 32);
      s0 += reinterpret_cast<U4>(__builtin_convertvector(lo, L4));  // wrapping, as AddFixed
      s1 += reinterpret_cast<U4>(__builtin_convertvector(hi, L4));
      __builtin_memcpy(acc64 + 8 * j, &s0, 32);
      __builtin_memcpy(acc64 + 8 * j + 4, &s1, 32);
    }
    return;
  }
#endif
  for (int j = 0; j < cols; ++j) acc64[j] = AddFixed(acc64[j], static_cast<int64_t>(c[j]));
}

#if defined(FS_SIMD_AVX2_PARTS)
// The sum of ToFixed over items, split: a value v (clamped, NaN as 0) is
// h + r, h = trunc(v) and r = v - h (both exact), so ToFixed(v) =
// h 2^32 + trunc(r 2^32) exactly, the second part below 2^32 in magnitude.
// Over items the h add up in int32 lanes (only their low 32 bits reach the
// int64 sum: it wraps at 2^64) and the second parts in double lanes (exact
// below 2^53: 2^21 items). The same bits as AddFixed16 item by item.
FS_INLINE void FixedSplitAdd(const V16& v, int32_t* h, double* t) {
  const __m256 lim = _mm256_set1_ps(kFixedLimit), one = _mm256_set1_ps(kFixedOne);
#pragma GCC unroll 2
  for (int j = 0; j < 2; ++j) {
    __m256 x = reinterpret_cast<__m256>(v.p[j]);
    x = _mm256_and_ps(_mm256_cmp_ps(x, x, _CMP_ORD_Q), x);  // NaN: 0
    x = _mm256_max_ps(_mm256_min_ps(x, lim), _mm256_sub_ps(_mm256_setzero_ps(), lim));
    const __m256 whole = _mm256_round_ps(x, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m256 part = _mm256_round_ps(_mm256_mul_ps(_mm256_sub_ps(x, whole), one),
                                        _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    __m256i* hv = reinterpret_cast<__m256i*>(h + 8 * j);
    _mm256_store_si256(hv, _mm256_add_epi32(_mm256_load_si256(hv), _mm256_cvttps_epi32(whole)));
    double* tv = t + 8 * j;
    _mm256_store_pd(
        tv, _mm256_add_pd(_mm256_load_pd(tv), _mm256_cvtps_pd(_mm256_castps256_ps128(part))));
    _mm256_store_pd(tv + 4, _mm256_add_pd(_mm256_load_pd(tv + 4),
                                          _mm256_cvtps_pd(_mm256_extractf128_ps(part, 1))));
  }
}
// The int64 a split sum stands for (wrapping, as AddFixed).
inline int64_t FixedSplitValue(int32_t h, double t) {
  return static_cast<int64_t>((static_cast<uint64_t>(static_cast<uint32_t>(h)) << 32) +
                              static_cast<uint64_t>(static_cast<int64_t>(t)));
}
#endif

// The exact item sums of a register tile: MR rows (rows[i]) of a panel's
// first `cols` columns (up to kNR), each item's two vectors of chains per
// row added by Add. With AVX2 parts they are summed split over the tile's
// items (FixedSplitAdd; there is no vector conversion to int64) and added to
// the sums once, by Finish; elsewhere each item's go straight in.
template <int MR>
class TileItemSums {
 public:
  FS_INLINE TileItemSums(int64_t* const* rows, int cols) : cols_(cols) {
    for (int i = 0; i < MR; ++i) rows_[i] = rows[i];
#if defined(FS_SIMD_AVX2_PARTS)
    std::memset(h_, 0, sizeof(h_));
    std::memset(t_, 0, sizeof(t_));
#endif
  }
  FS_INLINE void Add(int i, const V16& v0, const V16& v1) {
#if defined(FS_SIMD_AVX2_PARTS)
    FixedSplitAdd(v0, h_[i], t_[i]);
    FixedSplitAdd(v1, h_[i] + 16, t_[i] + 16);
#else
    AddFixed16(v0, rows_[i], std::min(16, cols_));
    if (cols_ > 16) AddFixed16(v1, rows_[i] + 16, cols_ - 16);
#endif
  }
  FS_INLINE void Finish() {
#if defined(FS_SIMD_AVX2_PARTS)
    for (int i = 0; i < MR; ++i) {
      for (int j = 0; j < cols_; ++j)
        rows_[i][j] = AddFixed(rows_[i][j], FixedSplitValue(h_[i][j], t_[i][j]));
    }
#endif
  }

 private:
  int64_t* rows_[MR];
  int cols_;
#if defined(FS_SIMD_AVX2_PARTS)
  alignas(32) int32_t h_[MR][kNR];
  alignas(32) double t_[MR][kNR];
#endif
};

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
        ce = Fma(xo[i][p], we[p][1], ce);
        co = Fma(xo[i][p], wo[p][1], co);
        ce = Fma(xe[i][p], we[p][0], ce);
        co = Fma(xe[i][p], wo[p][0], co);
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
        c = Fma(xo[i][p], w[p][1], c);
        c = Fma(xe[i][p], w[p][0], c);
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
    if (a.w_rows) {
      PrefetchRows<W>(a, std::min(a.k, kk + kRowsAheadNN), std::min(a.k, kk + kRowsAheadNN + r), c0,
                      static_cast<int64_t>(cols * sizeof(W)));
    }
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
            acc[i][c] = Fma(xs[i][q + 1], odd, acc[i][c]);
            acc[i][c] = Fma(xs[i][q], Widen(wr[q][c]), acc[i][c]);
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
      a0[i] = Fma(xo, o0, a0[i]);
      a1[i] = Fma(xo, o1, a1[i]);
      a0[i] = Fma(xe, e0, a0[i]);
      a1[i] = Fma(xe, e1, a1[i]);
    }
  }
  if (kk < k1) {  // a lone last k-value: after the zero pair of its padding
    const V16 w0 = Load(b0), w1 = Load(b1);
    const int s = kk - k0;
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const V16 xe = Splat(xs[i][s]), xo = Splat(xs[i][s + 1]);  // xo: the padding's 0
      a0[i] = Fma(xo, V16{}, a0[i]);
      a1[i] = Fma(xo, V16{}, a1[i]);
      a0[i] = Fma(xe, w0, a0[i]);
      a1[i] = Fma(xe, w1, a1[i]);
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
  TileItemSums<MR> sums(row, kWhole ? kNR : p.cols);
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
    TileItemSums<MR> sums(row, p.cols);
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

// Packing a panel of [k, n] weights reads one or two cache lines per row,
// rows a whole row apart: a stride the hardware prefetchers do not follow,
// so every read waited on memory. Each row's read asks for the same columns
// kPackAhead rows further down (batched decode's o and down projections
// about a third faster).
inline constexpr int kPackAhead = 16;
template <typename W>
FS_INLINE void PrefetchPackRows(const KernelArgs& a, int kk, int rows, int j0) {
  if (a.w_rows || kk + kPackAhead + rows > a.k) return;
  for (int r = 0; r < rows; ++r) {
    const W* p = WRow<W>(a, kk + kPackAhead + r) + j0;
    __builtin_prefetch(p);
    if constexpr (sizeof(W) == 4) __builtin_prefetch(p + 16);  // 32 columns: two lines
  }
}

// Packs columns [j0, j0 + cols) of w k-major into out[k][32], widened to f32.
template <typename W>
void Pack(const KernelArgs& a, int j0, int cols, float* out) {
  if (!a.nt) {
    for (int kk = 0; kk < a.k; ++kk) {
      PrefetchPackRows<W>(a, kk, 1, j0);
      float* dst = out + static_cast<int64_t>(kk) * kNR;
      const W* src = WRow<W>(a, kk) + j0;
      int c = 0;
      for (; c + 16 <= cols; c += 16) Store(dst + c, Load(src + c));
      for (; c < cols; ++c) dst[c] = Widen(src[c]);
      std::memset(dst + cols, 0, sizeof(float) * (kNR - cols));
    }
    return;
  }
  // w is [n, k]: transpose 16 columns x 16 k-values at a time.
  for (int jb = 0; jb < kNR; jb += 16) {
    const W* wr[16];
    for (int q = 0; q < 16; ++q) wr[q] = jb + q < cols ? WRow<W>(a, j0 + jb + q) : nullptr;
    int kb = 0;
    if constexpr (kPairs<W>) {  // lanes of two k-values, as DirectNT
      for (; kb + 32 <= a.k; kb += 32) {
        I16 r[16];
#pragma GCC unroll 16
        for (int q = 0; q < 16; ++q) r[q] = wr[q] ? LoadLanes(wr[q] + kb) : I16{};
        Transpose16(r);
#pragma GCC unroll 16
        for (int t = 0; t < 16; ++t) {
          V16 even, odd;
          WidenPair(r[t], &even, &odd);
          Store(out + static_cast<int64_t>(kb + 2 * t) * kNR + jb, even);
          Store(out + static_cast<int64_t>(kb + 2 * t + 1) * kNR + jb, odd);
        }
      }
    }
    for (; kb + 16 <= a.k; kb += 16) {
      V16 r[16];
#pragma GCC unroll 16
      for (int q = 0; q < 16; ++q) r[q] = wr[q] ? Load(wr[q] + kb) : V16{};
      Transpose16(r);
#pragma GCC unroll 16
      for (int t = 0; t < 16; ++t) Store(out + static_cast<int64_t>(kb + t) * kNR + jb, r[t]);
    }
    for (; kb < a.k; ++kb) {
      float* dst = out + static_cast<int64_t>(kb) * kNR + jb;
      for (int q = 0; q < 16; ++q) dst[q] = wr[q] ? Widen(wr[q][kb]) : 0.0f;
    }
  }
}

}  // namespace
}  // namespace failsafe::cpu

#include "backend/cpu/gemm_blocked_impl.h"

namespace failsafe::cpu {
namespace {

#if defined(__AVX512F__)
// The first `cols` (up to 32) columns' mask.
inline __mmask32 ColumnMask(int cols) {
  return cols >= 32 ? ~__mmask32{0} : (__mmask32{1} << cols) - 1;
}

// 32 columns of rows `even` and `odd` (nullptr: a padding slot, zero) as
// two vectors of pairs at dst: lane q of the first holds column q of each
// (even low), of the second column 16 + q.
inline void StorePairs(const BF16* even, const BF16* odd, __mmask32 mask, BF16* dst) {
  typedef int16_t S32 __attribute__((vector_size(64)));
  auto idx = [](int base) {
    S32 v;
    for (int q = 0; q < 16; ++q) {
      v[2 * q] = static_cast<int16_t>(base + q);
      v[2 * q + 1] = static_cast<int16_t>(32 + base + q);
    }
    return reinterpret_cast<__m512i>(v);
  };
  const __m512i e = _mm512_maskz_loadu_epi16(mask, even);
  const __m512i o = odd ? _mm512_maskz_loadu_epi16(mask, odd) : _mm512_setzero_si512();
  _mm512_storeu_si512(dst, _mm512_permutex2var_epi16(e, idx(0), o));
  _mm512_storeu_si512(dst + 32, _mm512_permutex2var_epi16(e, idx(16), o));
}

// Columns [j0, j0 + cols) of a bf16 [k, n] weight packed in pairs for
// vdpbf16ps (Panel::slot_pairs): for each pair of the chains' slots, rows kk
// and kk + 1 interleaved (kk's value in the low half of each lane; zero for
// a padding slot), 16 columns per vector, two vectors (32 columns) per pair.
inline void PackPairsNN(const KernelArgs& a, int j0, int cols, BF16* out) {
  const __mmask32 mask = ColumnMask(cols);
  const int padded = (a.chain_k + 1) & ~1;
  for (int c = 0; c < a.k / a.chain_k; ++c) {
    for (int s = 0; s < padded; s += 2) {
      const int kk = c * a.chain_k + s;
      PrefetchPackRows<BF16>(a, kk, 2, j0);
      StorePairs(WRow<BF16>(a, kk) + j0, s + 1 < a.chain_k ? WRow<BF16>(a, kk + 1) + j0 : nullptr,
                 mask, out + (static_cast<int64_t>(c) * padded + s) / 2 * 64);
    }
  }
}
#endif

// Panel `panel` of a column-blocked bf16 weight in fixed-point items (nn,
// GemmArgs::w_blocked16; item_k even, the panel's columns whole blocks of
// 16), every row and every item by vdpbf16ps: each item's two blocks are
// its pairs as packing would lay them (Panel::slot_pairs), read where they
// lie, items Panel::item_step apart.
#if defined(__AVX512F__)
inline void ColumnBlockedPanel(const KernelArgs& a, int panel) {
  const int j0 = panel * kNR, cols = std::min(kNR, a.n - j0);
  const BF16* b0 = static_cast<const BF16*>(a.w) + static_cast<int64_t>(j0) * a.item_k;
  Panel<BF16> p{b0, cols > 16 ? b0 + 16 * static_cast<int64_t>(a.item_k) : b0, 16, cols};
  p.slot_pairs = true;
  p.item_step = static_cast<int64_t>(a.n) * a.item_k;
  PanelRows<true>(a, j0, p);
}

// GemmKernels::column_panels. (Item after item, each over all the panels,
// which reads each item's part of them as one run of memory, was slower:
// every item then adds to every row's sums of all the panels.)
inline void ColumnBlockedPanels(const KernelArgs& a, int p0, int p1) {
  for (int p = p0; p < p1; ++p) ColumnBlockedPanel(a, p);
}
#endif

template <typename W>
void PackedPanel(const KernelArgs& a, int panel, float* packed) {
  if (a.w_blocked16) return BlockedPanel<W>(a, panel, packed);
  const int j0 = panel * kNR, cols = std::min(kNR, a.n - j0);
#if defined(__AVX512F__)
  if constexpr (kPairs<W>) {
    if (a.dpbf16 && !a.nt) {
      BF16* pairs = reinterpret_cast<BF16*>(packed);
      PackPairsNN(a, j0, cols, pairs);
      Panel<BF16> p{pairs, pairs + 32, 32, cols};
      p.slot_pairs = true;
      PanelRows<true>(a, j0, p);
      return;
    }
  }
#endif
  Pack<W>(a, j0, cols, packed);
  PanelRows<kPairs<W>>(a, j0, Panel<float>{packed, packed + 16, kNR, cols});
}

// nn in fixed-point items with more rows than Stream takes (batched
// decode's o and down projections): a block of columns at a time
// (ItemBlockCols), item after item, the item's weight rows in the block read
// as runs of memory into every panel's layout in `packed`, where the tiles
// of all the rows then find them in the first-level cache. Packing a panel
// over all of k instead reads a line or two per weight row, rows a whole row
// apart; an item's whole rows at once (no blocks) packed more than the
// second-level cache holds for the o projection's items of 64 rows.
//
// Each row's read also asks for the same columns of the next row (pair):
// rows of 2 or 4 KiB are streams too short for the hardware prefetchers to
// learn (bf16 batch-16 o and down projections about 15% faster on a Zen 5).
//
// The layout of one item's panels: f32, panel P's k-value kk at
// packed + (P * item_k + kk) * kNR; bf16 for vdpbf16ps, panel P's pairs
// (Panel::slot_pairs) at packed + P * padded * kNR halves, padded the
// item's slots.

// A panel's columns (kNR) of a weight row into the cache.
template <typename W>
FS_INLINE void PrefetchColumns(const W* p) {
  __builtin_prefetch(p);
  if constexpr (sizeof(W) * kNR > 64) __builtin_prefetch(p + 64 / sizeof(W));
}

template <typename W>
void PackItemRows(const KernelArgs& one, float* packed) {
  const int panels = (one.n + kNR - 1) / kNR, last = one.n - (panels - 1) * kNR;
  for (int kk = 0; kk < one.k; ++kk) {
    const W* src = WRow<W>(one, kk);
    const W* next = kk + 1 < one.k ? WRow<W>(one, kk + 1) : nullptr;
    for (int P = 0; P < panels; ++P, src += kNR) {
      if (next) PrefetchColumns(next + P * kNR);
      float* dst = packed + (static_cast<int64_t>(P) * one.k + kk) * kNR;
      if (P + 1 < panels || last == kNR) {
        Store(dst, Load(src));
        Store(dst + 16, Load(src + 16));
        continue;
      }
      int c = 0;
      for (; c + 16 <= last; c += 16) Store(dst + c, Load(src + c));
      for (; c < last; ++c) dst[c] = Widen(src[c]);
      std::memset(dst + last, 0, sizeof(float) * (kNR - last));
    }
  }
}

#if defined(__AVX512F__)
// The same for vdpbf16ps: rows kk and kk + 1 of each pair of slots
// interleaved as PackPairsNN does, a padding slot's row zero.
inline void PackItemPairs(const KernelArgs& one, BF16* packed) {
  const int panels = (one.n + kNR - 1) / kNR, last = one.n - (panels - 1) * kNR;
  const int padded = (one.k + 1) & ~1;
  for (int s = 0; s < padded; s += 2) {
    const BF16* even = WRow<BF16>(one, s);
    const BF16* odd = s + 1 < one.k ? WRow<BF16>(one, s + 1) : nullptr;
    BF16* dst = packed + static_cast<int64_t>(s) * kNR;
    const bool ahead = s + 3 < one.k;  // the next pair's rows
    for (int P = 0; P < panels; ++P, dst += static_cast<int64_t>(padded) * kNR) {
      if (ahead) {
        PrefetchColumns(even + 2 * one.ldw + P * kNR);
        PrefetchColumns(odd + 2 * one.ldw + P * kNR);
      }
      StorePairs(even + P * kNR, odd ? odd + P * kNR : nullptr,
                 ColumnMask(P + 1 < panels ? kNR : last), dst);
    }
  }
}
#endif

// Columns [0, a.n) (ItemBlockCols at most), item after item.
template <typename W>
void ItemPanelsBlock(const KernelArgs& a, float* packed) {
  const int panels = (a.n + kNR - 1) / kNR;
  for (int c = 0; c < a.k / a.item_k; ++c) {
    const KernelArgs one = ItemsCut(a, c, 1);
#if defined(__AVX512F__)
    if constexpr (kPairs<W>) {
      if (a.dpbf16) {
        BF16* pairs = reinterpret_cast<BF16*>(packed);
        const int padded = (a.item_k + 1) & ~1;
        PackItemPairs(one, pairs);
        for (int P = 0; P < panels; ++P) {
          const BF16* b0 = pairs + static_cast<int64_t>(P) * padded * kNR;
          Panel<BF16> p{b0, b0 + 32, 32, std::min(kNR, a.n - P * kNR)};
          p.slot_pairs = true;
          PanelRows<true>(one, P * kNR, p);
        }
        continue;
      }
    }
#endif
    PackItemRows<W>(one, packed);
    for (int P = 0; P < panels; ++P) {
      const float* b0 = packed + static_cast<int64_t>(P) * one.k * kNR;
      PanelRows<kPairs<W>>(one, P * kNR,
                           Panel<float>{b0, b0 + 16, kNR, std::min(kNR, a.n - P * kNR)});
    }
  }
}

template <typename W>
void ItemPanels(const KernelArgs& a, float* packed) {
  const int block = ItemBlockCols(a);
  for (int j0 = 0; j0 < a.n; j0 += block) {
    KernelArgs cols = a;
    cols.n = std::min(block, a.n - j0);
    cols.w = static_cast<const W*>(a.w) + j0;
    cols.acc = a.acc + j0;
    ItemPanelsBlock<W>(cols, packed);
  }
}

// The entry points, by weight type. bf16 weights take the bf16 chain under
// FlushDenormals, which is set around a call that the compiler cannot inline
// (so no operation of the chain moves out of it).
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
#if defined(__AVX512F__)
__attribute__((noinline)) inline void ColumnPanelsNoInline(const KernelArgs& a, int p0, int p1) {
  ColumnBlockedPanels(a, p0, p1);
}
#endif

void RunDirect(const KernelArgs& a, int j0, int j1) {
  switch (a.wtype) {
    case DType::kBF16: {
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
      FlushDenormals flush;
      return PanelNoInline<BF16>(a, panel, packed);
    }
    case DType::kF16:
      return PackedPanel<F16>(a, panel, packed);
    case DType::kF32:
      return PackedPanel<float>(a, panel, packed);
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

// A row's vectors, the last one partial (the same lanes' arithmetic).
void SiluMulRow(const float* g, const float* u, float* out, int n) {
  for (int i = 0; i < n; i += 16) {
    const int c = std::min(16, n - i);
    const V16 gv = LoadPart(g + i, c);
    StorePart(out + i, gv / (Splat(1.0f) + Exp(-gv)) * LoadPart(u + i, c), c);
  }
}

void ExpShifted(float* row, int n, float shift) {
  for (int i = 0; i < n; i += 16) {
    const int c = std::min(16, n - i);
    StorePart(row + i, Exp(LoadPart(row + i, c) - Splat(shift)), c);
  }
}

// RoundActivations' two passes at the level's width, in integer operations,
// so every level gives the same bits. dst[i] = RoundToBf16(src[i]), i < n,
// 16 at a time.
void RoundRowBf16(const float* src, float* dst, int n) {
  int i = 0;
  for (; i + 16 <= n; i += 16) StoreBits(dst + i, Bf16Bits(LoadBits(src + i)));
  for (; i < n; ++i) dst[i] = RoundToBf16(src[i]);
}

// words[w] = the bf16 of xs[2w] (low half) and of xs[2w + 1] (high half),
// w < n; xs holds values rounded to bf16 (their low halves are zero). 16
// words at a time.
void PackPairsRow(const float* xs, uint32_t* words, int64_t n) {
  int64_t w = 0;
  for (; w + 16 <= n; w += 16) {
    const U16 lo = LoadBits(xs + 2 * w), hi = LoadBits(xs + 2 * w + 16);
    StoreBits(words + w, (EvenLanes(lo, hi) >> 16) | (OddLanes(lo, hi) & 0xffff0000u));
  }
  for (; w < n; ++w) {
    uint32_t even, odd;
    std::memcpy(&even, &xs[2 * w], 4);
    std::memcpy(&odd, &xs[2 * w + 1], 4);
    words[w] = (even >> 16) | (odd & 0xffff0000u);
  }
}

// Lanes [0, count) of a vector: true (all ones), the others 0.
FS_INLINE I16 FirstLanes(int count) {
  const I16 lane{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  return lane < I16{} + count;
}

void SoftmaxRow(float* row, int width, int lo, int hi, float scale) {
  float* r = row + lo;
  const int n = hi - lo + 1;
  const V16 none = Splat(-__builtin_inff());
  V16 top = none;
  for (int i = 0; i < n; i += 16) {
    const int c = std::min(16, n - i);
    const V16 v = Select(FirstLanes(c), LoadPart(r + i, c) * Splat(scale), none);
    StorePart(r + i, v, c);
    top = Select(top < v, v, top);  // NaN never taken, as std::max(top, v) does
  }
  float mx = -__builtin_inff();
  for (int j = 0; j < 16; ++j) mx = std::max(mx, top[j]);
  ExpShifted(r, n, mx);
  V16 sums{};
  for (int i = 0; i < n; i += 16) sums += LoadPart(r + i, std::min(16, n - i));
  float lanes[16];
  Store(lanes, sums);
  for (int half = 8; half >= 1; half /= 2) {
    for (int j = 0; j < half; ++j) lanes[j] += lanes[j + half];
  }
  const V16 inv = Splat(1.0f / lanes[0]);
  for (int i = 0; i < n; i += 16) {
    const int c = std::min(16, n - i);
    StorePart(r + i, LoadPart(r + i, c) * inv, c);
  }
  std::fill(row, r, 0.0f);
  std::fill(r + n, row + width, 0.0f);
}

}  // namespace
}  // namespace failsafe::cpu
