// The nt kernels with few rows (decode): weights read once, as they lie.
// Part of the GEMM's kernel body: gemm_impl.h includes it once per
// instruction-set level, in order, inside an unnamed namespace; not a
// header of its own.
#pragma once

namespace failsafe::cpu {
namespace {

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

// The accumulators' first `cols` lanes into y's MR rows at column j0.
template <int MR>
FS_INLINE void StoreAccumulators(const KernelArgs& a, int j0, int cols, const V16* acc) {
  for (int i = 0; i < MR; ++i) {
    float* y = a.y + static_cast<int64_t>(i) * a.ldy + j0;
    if (cols == 16) {  // a whole vector straight from its registers (decode attention's scores)
      Store(y, acc[i]);
      continue;
    }
    float tmp[16];
    Store(tmp, acc[i]);
    std::memcpy(y, tmp, sizeof(float) * cols);
  }
}

// Rows given by pointers (GemmArgs::w_rows), [r, r + count) of `rows` read
// next: asked for `near` rows ahead of their use (kRowsAheadNT /
// kRowsAheadNN, gemm.h) and, into the second-level cache only, `far` rows
// ahead (kRowsFarNT / kRowsFarNN); `bytes` of each from column c0.
template <typename W, int Locality>
FS_INLINE void PrefetchRows(const KernelArgs& a, int r0, int r1, int c0, int64_t bytes) {
  for (int r = r0; r < r1; ++r) {
    const char* row = reinterpret_cast<const char*>(WRow<W>(a, r) + c0);
    for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(row + b, 0, Locality);
  }
}
template <typename W>
FS_INLINE void PrefetchRowsAhead(const KernelArgs& a, int r, int count, int rows, int near, int far,
                                 int c0, int64_t bytes) {
  PrefetchRows<W, 3>(a, std::min(rows, r + near), std::min(rows, r + near + count), c0, bytes);
  PrefetchRows<W, 1>(a, std::min(rows, r + far), std::min(rows, r + far + count), c0, bytes);
}

template <int MR, typename W>
void DirectNT(const KernelArgs& a, int j0, int cols) {
  V16 acc[MR];
  StartAccumulators<MR>(a, j0, cols, acc);
  float tmp[16];
  const W* wr[16];
  for (int q = 0; q < 16; ++q) wr[q] = WRow<W>(a, j0 + std::min(q, cols - 1));
  if (a.w_rows) PrefetchRowsAhead<W>(a, j0, 16, a.n, kRowsAheadNT, kRowsFarNT, 0, a.k * sizeof(W));
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
          acc[i] = FmaBf16(Splat(xs[i][kb + 2 * t + 1]), odd, acc[i]);
          acc[i] = FmaBf16(Splat(xs[i][kb + 2 * t]), even, acc[i]);
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
        acc[i] = FmaBf16(Splat(xs[i][kb + 1]), Load(odd), acc[i]);
        acc[i] = FmaBf16(Splat(xs[i][kb]), Load(even), acc[i]);
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
  StoreAccumulators<MR>(a, j0, cols, acc);
}

#if defined(FS_SIMD_AVX2_PARTS)
// The most k-values DirectNTStaged takes (its staging buffer, on the stack).
inline constexpr int kStagedMaxK = 256;

// rows[t][q] becomes rows[q][t] (8 x 8 floats).
FS_INLINE void Transpose8(__m256 r[8]) {
  __m256 t[8], u[8];
#pragma GCC unroll 4
  for (int q = 0; q < 8; q += 2) {
    t[q] = _mm256_unpacklo_ps(r[q], r[q + 1]);
    t[q + 1] = _mm256_unpackhi_ps(r[q], r[q + 1]);
  }
#pragma GCC unroll 2
  for (int q = 0; q < 8; q += 4) {
    u[q] = _mm256_shuffle_ps(t[q], t[q + 2], 0x44);
    u[q + 1] = _mm256_shuffle_ps(t[q], t[q + 2], 0xee);
    u[q + 2] = _mm256_shuffle_ps(t[q + 1], t[q + 3], 0x44);
    u[q + 3] = _mm256_shuffle_ps(t[q + 1], t[q + 3], 0xee);
  }
#pragma GCC unroll 4
  for (int q = 0; q < 4; ++q) {
    r[q] = _mm256_permute2f128_ps(u[q], u[q + 4], 0x20);
    r[q + 4] = _mm256_permute2f128_ps(u[q], u[q + 4], 0x31);
  }
}

// Eight k-values of a row as f32 (bf16 widened exactly).
FS_INLINE __m256 Load8(const float* p) { return _mm256_loadu_ps(p); }
FS_INLINE __m256 Load8(const BF16Wide* p) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(
      _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
}

// DirectNT on f32 or bf16 rows given by pointer (attention's scores), where a
// vector is two AVX2 registers: a 16 x 16 transpose in registers needs
// thirty-two of their sixteen (every round went through the stack). The
// block's sixteen rows are first laid out by k-value, eight at a time
// through registers, into a buffer that stays in the first-level cache
// (16 floats a k-value); then each k-value's sixteen weights are one load,
// the accumulators never leaving their registers. The same chains as
// DirectNT: each output's fused multiply-adds in increasing k from the same
// start, so the same bits.
template <int MR, typename W>
void DirectNTStaged(const KernelArgs& a, int j0, int cols) {
  V16 acc[MR];
  StartAccumulators<MR>(a, j0, cols, acc);
  const W* wr[16];
  for (int q = 0; q < 16; ++q) wr[q] = WRow<W>(a, j0 + std::min(q, cols - 1));
  PrefetchRowsAhead<W>(a, j0, 16, a.n, kRowsAheadNT, kRowsFarNT, 0, a.k * sizeof(W));
  alignas(64) float staged[kStagedMaxK * 16];
  int kb = 0;
  for (; kb + 8 <= a.k; kb += 8) {
#pragma GCC unroll 2
    for (int h = 0; h < 16; h += 8) {
      __m256 r[8];
#pragma GCC unroll 8
      for (int q = 0; q < 8; ++q) r[q] = Load8(wr[h + q] + kb);
      Transpose8(r);
#pragma GCC unroll 8
      for (int t = 0; t < 8; ++t) _mm256_store_ps(staged + (kb + t) * 16 + h, r[t]);
    }
  }
  for (; kb < a.k; ++kb) {
    for (int q = 0; q < 16; ++q) staged[kb * 16 + q] = Widen(wr[q][kb]);
  }
#pragma GCC unroll 2
  for (int k = 0; k < a.k; ++k) {
    const V16 w = Load(staged + k * 16);
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) acc[i] = Fma(Splat(a.x[i * a.ldx + k]), w, acc[i]);
  }
  StoreAccumulators<MR>(a, j0, cols, acc);
}
#endif

template <int MR, typename W>
void DirectBlockedRange(const KernelArgs& a, int j0, int j1);
template <typename W>
void DirectWide(const KernelArgs& a, int j0, int j1);

// f(std::integral_constant<int, MR>{}) for the direct kernels' MR rows: m,
// at most kDirectRows.
template <typename F>
FS_INLINE void WithDirectRows(int m, F f) {
  static_assert(kDirectRows == 4);
  switch (m) {
    case 1:
      return f(std::integral_constant<int, 1>{});
    case 2:
      return f(std::integral_constant<int, 2>{});
    case 3:
      return f(std::integral_constant<int, 3>{});
    default:
      return f(std::integral_constant<int, 4>{});
  }
}

template <typename W>
void DirectRange(const KernelArgs& a, int j0, int j1) {
  if (a.w_blocked16) {
    if constexpr (std::is_same_v<W, float> || kPairs<W>) {
      if (a.m > kDirectRows) return DirectWide<W>(a, j0, j1);
    }
    return WithDirectRows(a.m, [&](auto mr) { DirectBlockedRange<mr(), W>(a, j0, j1); });
  }
  // Sixteen rows of weights are read side by side; more streams than that
  // serve worse.
  for (int j = j0; j < j1; j += 16) {
    const int cols = std::min(16, j1 - j);
#if defined(FS_SIMD_AVX2_PARTS)
    if constexpr (std::is_same_v<W, float> || std::is_same_v<W, BF16Wide>) {
      if (a.w_rows && a.k <= kStagedMaxK) {
        WithDirectRows(a.m, [&](auto mr) { DirectNTStaged<mr(), W>(a, j, cols); });
        continue;
      }
    }
#endif
    WithDirectRows(a.m, [&](auto mr) { DirectNT<mr(), W>(a, j, cols); });
  }
}

}  // namespace
}  // namespace failsafe::cpu
