// Fixed-point sums of the GEMM's items (GemmOut::kFixedItems): each item's
// f32 chains converted exactly (ToFixed) and added in int64, in any order
// with the same bits; split sums where the level has no int64 conversion.
// Part of the GEMM's kernel body: gemm_impl.h includes it once per
// instruction-set level, in order, inside an unnamed namespace; not a
// header of its own.
#pragma once

namespace failsafe::cpu {
namespace {

// ToFixed's clamp (NaN counts as 0); the two bounds in the operand order of
// vminps / vmaxps, so that each is one instruction.
FS_INLINE V16 ClampForFixed(V16 v) {
  const V16 lim = Splat(kFixedLimit), zero{};
  v = Select(v == v, v, zero);
  v = Select(lim < v, lim, v);
  return Select(-lim > v, -lim, v);
}

#if defined(FS_SIMD_AVX2_PARTS)
// Whether all eight lanes of x are below `bound` in magnitude (NaN is not).
FS_INLINE bool AllBelow(__m256 x, __m256 bound) {
  const __m256 magnitude = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x);
  return _mm256_movemask_ps(_mm256_cmp_ps(magnitude, bound, _CMP_LT_OQ)) == 0xff;
}
#endif

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
#if defined(FS_SIMD_AVX2_PARTS)
  if (cols >= 16) {
    // Four lanes at a time: four int64 sums are one AVX2 register.
    typedef float F4 __attribute__((vector_size(16)));
    typedef int64_t L4 __attribute__((vector_size(32)));
    typedef uint64_t U4 __attribute__((vector_size(32)));
#pragma GCC unroll 2
    for (int j = 0; j < V16::kParts; ++j) {
      // AVX2 has no vector conversion to int64 (each lane's went through a
      // general register). Eight lanes all below 2^19 in magnitude (no NaN,
      // no clamp) have v 2^32 below 2^51: its truncation is exact in float
      // and in double, and a double integer below 2^51 plus 1.5 * 2^52 has
      // the integer in its low bits (the same two's complement as the
      // conversion's).
      const __m256 x = reinterpret_cast<__m256>(v.p[j]);
      if (AllBelow(x, _mm256_set1_ps(524288.0f))) {
        const __m256 f = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kFixedOne)),
                                         _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
        const __m256d magic = _mm256_set1_pd(6755399441055744.0);  // 1.5 * 2^52
        const __m256i lo = _mm256_sub_epi64(
            _mm256_castpd_si256(_mm256_add_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(f)), magic)),
            _mm256_castpd_si256(magic));
        const __m256i hi = _mm256_sub_epi64(
            _mm256_castpd_si256(_mm256_add_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(f, 1)), magic)),
            _mm256_castpd_si256(magic));
        __m256i* s = reinterpret_cast<__m256i*>(acc64 + 8 * j);
        _mm256_storeu_si256(s, _mm256_add_epi64(_mm256_loadu_si256(s), lo));
        _mm256_storeu_si256(s + 1, _mm256_add_epi64(_mm256_loadu_si256(s + 1), hi));
        continue;
      }
      const V16 c = ClampForFixed(v) * Splat(kFixedOne);  // the lanes one by one
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
//
// Eight lanes all below `whole` in magnitude (FixedWholeBound: no NaN, no
// clamp) skip the split: v 2^32 and its truncation are exact in float, and
// the double lanes take ToFixed(v) itself, exact as long as the items'
// terms cannot reach 2^53 together.
FS_INLINE void FixedSplitAdd(const V16& v, int32_t* h, double* t, __m256 whole_bound) {
  const __m256 lim = _mm256_set1_ps(kFixedLimit), one = _mm256_set1_ps(kFixedOne);
#pragma GCC unroll 2
  for (int j = 0; j < 2; ++j) {
    __m256 x = reinterpret_cast<__m256>(v.p[j]);
    double* tv = t + 8 * j;
    if (AllBelow(x, whole_bound)) {
      const __m256 f =
          _mm256_round_ps(_mm256_mul_ps(x, one), _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
      _mm256_store_pd(
          tv, _mm256_add_pd(_mm256_load_pd(tv), _mm256_cvtps_pd(_mm256_castps256_ps128(f))));
      _mm256_store_pd(tv + 4, _mm256_add_pd(_mm256_load_pd(tv + 4),
                                            _mm256_cvtps_pd(_mm256_extractf128_ps(f, 1))));
      continue;
    }
    x = _mm256_and_ps(_mm256_cmp_ps(x, x, _CMP_ORD_Q), x);  // NaN: 0
    x = _mm256_max_ps(_mm256_min_ps(x, lim), _mm256_sub_ps(_mm256_setzero_ps(), lim));
    const __m256 whole = _mm256_round_ps(x, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m256 part = _mm256_round_ps(_mm256_mul_ps(_mm256_sub_ps(x, whole), one),
                                        _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    __m256i* hv = reinterpret_cast<__m256i*>(h + 8 * j);
    _mm256_store_si256(hv, _mm256_add_epi32(_mm256_load_si256(hv), _mm256_cvttps_epi32(whole)));
    _mm256_store_pd(
        tv, _mm256_add_pd(_mm256_load_pd(tv), _mm256_cvtps_pd(_mm256_castps256_ps128(part))));
    _mm256_store_pd(tv + 4, _mm256_add_pd(_mm256_load_pd(tv + 4),
                                          _mm256_cvtps_pd(_mm256_extractf128_ps(part, 1))));
  }
}
// FixedSplitAdd's bound for `items` items: each takes one term below 2^(B
// + 32) into a double lane (a whole value below 2^B, or a split's second
// part), so with items <= 2^b, B = 21 - b keeps the lane below 2^53. Past
// 2^21 items nothing is taken whole. 2^B made from its exponent bits: every
// register tile makes one.
FS_INLINE __m256 FixedWholeBound(int items) {
  const int b = items <= 1 ? 0 : std::bit_width(static_cast<unsigned>(items - 1));
  if (b > 21) return _mm256_setzero_ps();
  return _mm256_castsi256_ps(_mm256_set1_epi32((127 + 21 - b) << 23));
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
  // `items`: how many items Add takes per row, at most.
  FS_INLINE TileItemSums(int64_t* const* rows, int cols, int items) : cols_(cols) {
    for (int i = 0; i < MR; ++i) rows_[i] = rows[i];
#if defined(FS_SIMD_AVX2_PARTS)
    whole_bound_ = FixedWholeBound(items);
    std::memset(h_, 0, sizeof(h_));
    std::memset(t_, 0, sizeof(t_));
#else
    (void)items;
#endif
  }
  FS_INLINE void Add(int i, const V16& v0, const V16& v1) {
#if defined(FS_SIMD_AVX2_PARTS)
    FixedSplitAdd(v0, h_[i], t_[i], whole_bound_);
    FixedSplitAdd(v1, h_[i] + 16, t_[i] + 16, whole_bound_);
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
  __m256 whole_bound_;
  alignas(32) int32_t h_[MR][kNR];
  alignas(32) double t_[MR][kNR];
#endif
};

}  // namespace
}  // namespace failsafe::cpu
