// Vectors of 16 floats for the CPU kernels: one AVX-512 register where the
// translation unit is built for it, two AVX2 registers, or four SSE registers
// with fused multiply-adds by double sums (GCC vector extensions).
//
// Fma is a true fused multiply-add (one rounding) on every path, vector and
// scalar, so that a chain of Fma gives bit-identical results whichever path
// computes it: the batch-invariant kernels depend on it.
//
// Everything here lives in an inline namespace named after the instruction
// set the including file is compiled for (gemm_avx512.cc, gemm_avx2.cc and
// gemm_generic.cc each include it with their own flags), so the copies never
// meet at link time: a generic caller can never end up in AVX-512 code.
#pragma once

#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>

#if defined(__AVX512F__)
#define FS_SIMD_NAMESPACE simd_avx512
#elif defined(__AVX2__) && defined(__FMA__)
#define FS_SIMD_NAMESPACE simd_avx2
#else
#define FS_SIMD_NAMESPACE simd_generic
#endif

// The small helpers are always inlined: a call passes its vectors through
// memory.
#define FS_SIMD_INLINE __attribute__((always_inline)) inline
// The same for a lambda, after its parameters.
#define FS_SIMD_LAMBDA __attribute__((always_inline))

namespace failsafe::cpu {
inline namespace FS_SIMD_NAMESPACE {

#if defined(__AVX512F__)
// One register: GCC's vector extensions, native.
typedef float V16 __attribute__((vector_size(64), aligned(4)));
typedef int32_t I16 __attribute__((vector_size(64)));
typedef uint32_t U16 __attribute__((vector_size(64)));

FS_SIMD_INLINE V16 Load(const float* p) {
  V16 v;
  __builtin_memcpy(&v, p, sizeof(v));
  return v;
}
FS_SIMD_INLINE void Store(float* p, V16 v) { __builtin_memcpy(p, &v, sizeof(v)); }
FS_SIMD_INLINE U16 LoadBits(const void* p) {
  U16 v;
  __builtin_memcpy(&v, p, sizeof(v));
  return v;
}
FS_SIMD_INLINE void StoreBits(void* p, U16 v) { __builtin_memcpy(p, &v, sizeof(v)); }

// Lanes of b where mask is set (all ones), else of c.
template <typename M, typename T>
FS_SIMD_INLINE T Select(M mask, T b, T c) {
  return mask ? b : c;
}
// The same bits as another vector type of 16 lanes.
template <typename To, typename From>
FS_SIMD_INLINE To BitCast(From v) {
  return reinterpret_cast<To>(v);
}
// Lanes L... of (a, b): 0-15 pick from a, 16-31 from b.
template <int... L, typename T>
FS_SIMD_INLINE T Shuffle(T a, T b) {
  return __builtin_shufflevector(a, b, L...);
}
#else
// Without AVX-512 a 64-byte GCC vector has no machine mode: the compiler
// keeps it in memory and moves it through general registers piece by piece
// (every fused multiply-add of a register tile waited on stores and
// reloads). So a vector here is its 16 lanes in parts of the widest native
// width, two AVX2 registers or four SSE registers, each operation applied
// part by part; the lanes, and so every chain, are the same as one
// AVX-512 register's.
#if defined(__AVX2__)
inline constexpr int kPartBytes = 32;
// Set where V16 is two AVX2 registers: code ordered for their sixteen.
#define FS_SIMD_AVX2_PARTS 1
#else
inline constexpr int kPartBytes = 16;
#endif

template <typename E>
struct Vec16 {
  static constexpr int kLanes = kPartBytes / static_cast<int>(sizeof(E));  // per part
  static constexpr int kParts = 16 / kLanes;
  // (Natural alignment and no may_alias: either made GCC copy every
  // loaded part through the stack.)
  typedef E Part __attribute__((vector_size(kPartBytes)));
  Part p[kParts];

  Vec16() = default;  // V16{} is zero; V16 v; is not set
  // Sixteen lanes, in order.
  template <typename... T>
  requires(sizeof...(T) == 16) explicit Vec16(T... lanes) {
    const E v[16] = {static_cast<E>(lanes)...};
    __builtin_memcpy(p, v, sizeof(p));
  }
  E operator[](int i) const { return p[i / kLanes][i % kLanes]; }
};
typedef Vec16<float> V16;
typedef Vec16<int32_t> I16;
typedef Vec16<uint32_t> U16;

#define FS_SIMD_PARTS(T) _Pragma("GCC unroll 4") for (int j = 0; j < T::kParts; ++j)

#define FS_SIMD_BINARY(op)                                                    \
  template <typename E>                                                       \
  FS_SIMD_INLINE Vec16<E> operator op(const Vec16<E>& a, const Vec16<E>& b) { \
    Vec16<E> r;                                                               \
    FS_SIMD_PARTS(Vec16<E>) r.p[j] = a.p[j] op b.p[j];                        \
    return r;                                                                 \
  }                                                                           \
  template <typename E, typename S>                                           \
  FS_SIMD_INLINE Vec16<E> operator op(const Vec16<E>& a, S b) {               \
    Vec16<E> r;                                                               \
    FS_SIMD_PARTS(Vec16<E>) r.p[j] = a.p[j] op static_cast<E>(b);             \
    return r;                                                                 \
  }                                                                           \
  template <typename E, typename S>                                           \
  FS_SIMD_INLINE Vec16<E> operator op(S a, const Vec16<E>& b) {               \
    Vec16<E> r;                                                               \
    FS_SIMD_PARTS(Vec16<E>) r.p[j] = static_cast<E>(a) op b.p[j];             \
    return r;                                                                 \
  }                                                                           \
  template <typename E, typename S>                                           \
  FS_SIMD_INLINE Vec16<E>& operator op##=(Vec16<E>& a, const S& b) {          \
    return a = a op b;                                                        \
  }
FS_SIMD_BINARY(+)
FS_SIMD_BINARY(-)
FS_SIMD_BINARY(*)
FS_SIMD_BINARY(/)
FS_SIMD_BINARY(&)
FS_SIMD_BINARY(|)
FS_SIMD_BINARY(^)
#undef FS_SIMD_BINARY

template <typename E>
FS_SIMD_INLINE Vec16<E> operator<<(const Vec16<E>& a, int s) {
  Vec16<E> r;
  FS_SIMD_PARTS(Vec16<E>) r.p[j] = a.p[j] << s;
  return r;
}
template <typename E>
FS_SIMD_INLINE Vec16<E> operator>>(const Vec16<E>& a, int s) {
  Vec16<E> r;
  FS_SIMD_PARTS(Vec16<E>) r.p[j] = a.p[j] >> s;
  return r;
}
template <typename E>
FS_SIMD_INLINE Vec16<E> operator-(const Vec16<E>& a) {
  Vec16<E> r;
  FS_SIMD_PARTS(Vec16<E>) r.p[j] = -a.p[j];
  return r;
}

#define FS_SIMD_COMPARE(op)                                                                    \
  template <typename E>                                                                        \
  FS_SIMD_INLINE I16 operator op(const Vec16<E>& a, const Vec16<E>& b) {                       \
    I16 r;                                                                                     \
    FS_SIMD_PARTS(Vec16<E>) r.p[j] = reinterpret_cast<I16::Part>(a.p[j] op b.p[j]);            \
    return r;                                                                                  \
  }                                                                                            \
  template <typename E, typename S>                                                            \
  FS_SIMD_INLINE I16 operator op(const Vec16<E>& a, S b) {                                     \
    I16 r;                                                                                     \
    FS_SIMD_PARTS(Vec16<E>) r.p[j] = reinterpret_cast<I16::Part>(a.p[j] op static_cast<E>(b)); \
    return r;                                                                                  \
  }
FS_SIMD_COMPARE(<)
FS_SIMD_COMPARE(>)
FS_SIMD_COMPARE(<=)
FS_SIMD_COMPARE(>=)
FS_SIMD_COMPARE(==)
FS_SIMD_COMPARE(!=)
#undef FS_SIMD_COMPARE

FS_SIMD_INLINE V16 Load(const float* p) {
  V16 v;
  FS_SIMD_PARTS(V16) __builtin_memcpy(&v.p[j], p + j * V16::kLanes, kPartBytes);
  return v;
}
FS_SIMD_INLINE void Store(float* p, const V16& v) {
  FS_SIMD_PARTS(V16) __builtin_memcpy(p + j * V16::kLanes, &v.p[j], kPartBytes);
}
FS_SIMD_INLINE U16 LoadBits(const void* p) {
  U16 v;
  FS_SIMD_PARTS(U16)
  __builtin_memcpy(&v.p[j], static_cast<const char*>(p) + j * kPartBytes, kPartBytes);
  return v;
}
FS_SIMD_INLINE void StoreBits(void* p, const U16& v) {
  FS_SIMD_PARTS(U16) __builtin_memcpy(static_cast<char*>(p) + j * kPartBytes, &v.p[j], kPartBytes);
}

template <typename E>
FS_SIMD_INLINE Vec16<E> Select(const I16& mask, const Vec16<E>& b, const Vec16<E>& c) {
  Vec16<E> r;
  FS_SIMD_PARTS(Vec16<E>) r.p[j] = mask.p[j] ? b.p[j] : c.p[j];
  return r;
}
template <typename To, typename From>
FS_SIMD_INLINE To BitCast(const From& v) {
  static_assert(sizeof(To) == sizeof(From));
  To r;
  FS_SIMD_PARTS(To) r.p[j] = reinterpret_cast<typename To::Part>(v.p[j]);
  return r;
}

// Shuffle's part j: lanes L... (0-15 of a, 16-31 of b) that fall in output
// part j, taken from at most two source parts by one native shuffle
// (every shuffle the kernels use is so).
template <int J, int... L, typename T, int... K>
FS_SIMD_INLINE void ShufflePart(const T& a, const T& b, T* r, std::integer_sequence<int, K...>) {
  constexpr int n = T::kLanes, idx[] = {L...};
  constexpr int s0 = idx[J * n] / n;  // a source part of 2 * kParts (a's, then b's)
  constexpr int s1 = [] {
    for (int l = 0; l < n; ++l)
      if (idx[J * n + l] / n != s0) return idx[J * n + l] / n;
    return s0;
  }();
  static_assert(
      [] {
        for (int l = 0; l < n; ++l)
          if (idx[J * n + l] / n != s0 && idx[J * n + l] / n != s1) return false;
        return true;
      }(),
      "a part of a shuffle takes lanes from at most two parts");
  auto part = [&](int s) -> const typename T::Part& {
    return s < T::kParts ? a.p[s] : b.p[s - T::kParts];
  };
  constexpr auto local = [](int i) { return i / n == s0 ? i % n : n + i % n; };
#if defined(__clang__)
  r->p[J] = __builtin_shufflevector(part(s0), part(s1), local(idx[J * n + K])...);
#else
  // (GCC's builtin with the mask built so: the code the kernels were
  // measured with.)
  typename I16::Part mask;
  for (int l = 0; l < n; ++l) mask[l] = local(idx[J * n + l]);
  r->p[J] = __builtin_shuffle(part(s0), part(s1), mask);
#endif
}
template <int... L, typename T, int... J>
FS_SIMD_INLINE T ShuffleParts(const T& a, const T& b, std::integer_sequence<int, J...>) {
  T r;
  (ShufflePart<J, L...>(a, b, &r, std::make_integer_sequence<int, T::kLanes>()), ...);
  return r;
}
template <int... L, typename T>
FS_SIMD_INLINE T Shuffle(const T& a, const T& b) {
  static_assert(sizeof...(L) == 16);
  return ShuffleParts<L...>(a, b, std::make_integer_sequence<int, T::kParts>());
}
#endif

// An f32's bits rounded to bf16 (the upper half; the lower is zero), on one
// uint32_t or on a GCC vector of them lane by lane: branch-free. NaN: quiet,
// with the payload's upper bits; else to nearest, ties to even.
FS_SIMD_INLINE uint32_t Select(bool c, uint32_t b, uint32_t d) { return c ? b : d; }
template <typename U>
FS_SIMD_INLINE U Bf16Bits(U b) {
  const U nan = b | 0x00400000u, rounded = b + 0x7fffu + ((b >> 16) & 1u);
  return Select((b & 0x7fffffffu) > 0x7f800000u, nan, rounded) & 0xffff0000u;
}
FS_SIMD_INLINE V16 Splat(float x) {
#if defined(__AVX512F__)
  return V16{x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x};
#elif defined(__AVX2__)
  V16 v;
  v.p[0] = v.p[1] = V16::Part{x, x, x, x, x, x, x, x};
  return v;
#else
  V16 v;
  v.p[0] = v.p[1] = v.p[2] = v.p[3] = V16::Part{x, x, x, x};
  return v;
#endif
}

// 16-bit weights, widened exactly to f32 in registers.
struct BF16 {
  uint16_t bits;
};
struct F16 {
  uint16_t bits;
};

FS_SIMD_INLINE V16 Load(const BF16* p) {
#if defined(__AVX512F__)
  typedef uint16_t U16x16 __attribute__((vector_size(32), aligned(2)));
  U16x16 h;
  __builtin_memcpy(&h, p, sizeof(h));
  const U16 w = __builtin_convertvector(h, U16) << 16;  // bf16 is f32's upper half
  return reinterpret_cast<V16>(w);
#else
  U16 w;
#if defined(__AVX2__)
  FS_SIMD_PARTS(U16) {
    w.p[j] = reinterpret_cast<U16::Part>(_mm256_slli_epi32(
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8 * j))), 16));
  }
#else
  typedef uint16_t Half __attribute__((vector_size(kPartBytes / 2), aligned(2)));
  FS_SIMD_PARTS(U16) {
    Half h;
    __builtin_memcpy(&h, p + j * U16::kLanes, sizeof(h));
    w.p[j] = __builtin_convertvector(h, U16::Part) << 16;
  }
#endif
  return BitCast<V16>(w);
#endif
}

// Sixteen 32-bit lanes, each holding two bf16 values (low and high half),
// widened exactly and in-lane: even = lane << 16, odd = lane & 0xffff0000.
FS_SIMD_INLINE void WidenPair(I16 lanes, V16* even, V16* odd) {
  const U16 w = BitCast<U16>(lanes);
  *even = BitCast<V16>(w << 16);
  *odd = BitCast<V16>(w & 0xffff0000u);
}

// 32 bf16 values as 16 lanes of two (for WidenPair), bits unchanged.
FS_SIMD_INLINE I16 LoadLanes(const BF16* p) { return BitCast<I16>(LoadBits(p)); }

// Two k-values of 16 columns of bf16, interleaved: column q's values for the
// even and the odd k-value in the low and high half of 32-bit lane q (the
// paired blocked layout, Blocked16Index in backend/backend.h).
FS_SIMD_INLINE void LoadPair(const BF16* p, V16* even, V16* odd) {
  WidenPair(LoadLanes(p), even, odd);
}

inline float Widen(BF16 b) {
  const uint32_t bits = static_cast<uint32_t>(b.bits) << 16;
  float f;
  __builtin_memcpy(&f, &bits, 4);
  return f;
}

// IEEE half to float, exact (subnormals, infinities and NaN included).
inline float Widen(F16 h) {
  const uint32_t sign = static_cast<uint32_t>(h.bits & 0x8000) << 16;
  const uint32_t exp = (h.bits >> 10) & 0x1f, mant = h.bits & 0x3ff;
  float f;
  if (exp == 0) {
    f = std::ldexp(static_cast<float>(mant), -24);  // zero or subnormal
    uint32_t bits;
    __builtin_memcpy(&bits, &f, 4);
    bits |= sign;
    __builtin_memcpy(&f, &bits, 4);
    return f;
  }
  const uint32_t bits =
      sign | (exp == 0x1f ? 0x7f800000u | (mant << 13) : ((exp + 112) << 23) | (mant << 13));
  __builtin_memcpy(&f, &bits, 4);
  return f;
}

FS_SIMD_INLINE V16 Load(const F16* p) {
#if defined(__AVX512F__)
  return reinterpret_cast<V16>(
      _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))));
#elif defined(__AVX2__) && defined(__F16C__)
  V16 v;
  FS_SIMD_PARTS(V16) {
    v.p[j] = reinterpret_cast<V16::Part>(
        _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8 * j))));
  }
  return v;
#else
  float v[16];
  for (int i = 0; i < 16; ++i) v[i] = Widen(p[i]);
  return Load(v);
#endif
}

inline float Widen(float f) { return f; }

// bf16 values taken by the f32 chain: rows of a bf16 KV cache
// (GemmArgs::w_rows of wtype kBF16), widened exactly as BF16's and then
// multiplied as f32 values are, k-value by k-value (not in pairs, nothing
// flushed), so the same bits as f32 rows holding the widened values.
struct BF16Wide {
  uint16_t bits;
};
FS_SIMD_INLINE V16 Load(const BF16Wide* p) { return Load(reinterpret_cast<const BF16*>(p)); }
inline float Widen(BF16Wide b) { return Widen(BF16{b.bits}); }

#if !defined(__FMA__)
// A fused multiply-add without one in hardware (the generic level: x86-64's
// SSE2). The product of two floats is exact in double (24 + 24 bits of 53),
// so a * b + c rounded once to double is within half a double ulp of the
// exact value, and rounding that to float gives the fused result, except
// where the double lies exactly halfway between two floats (its own
// rounding may have put it there: double rounding) or below 2^-125 (where
// float's rounding point moves up into the denormals). Both are rare and
// checked for; such a lane takes FmaExact. Under MXCSR's DAZ and FTZ the
// conversions read denormal inputs as zero and flush a result that rounds
// below 2^-126, as the instruction does.
//
// a * b + c exactly rounded: the double sum's error by TwoSum (exact), the
// sum rounded to odd (its last bit set where it was inexact and clear), which
// float's rounding then takes correctly (53 >= 24 + 2 bits).
__attribute__((noinline, cold)) inline float FmaExact(float a, float b, float c) noexcept {
  const double p = static_cast<double>(a) * static_cast<double>(b), cd = c;
  double s = p + cd;
  const double cv = s - p, pv = s - cv;  // TwoSum: the error, exactly
  const double e = (p - pv) + (cd - cv);
  if (e != 0) {
    uint64_t bits;
    __builtin_memcpy(&bits, &s, sizeof(bits));
    // Truncated toward zero, then the last bit set: up one in magnitude where
    // the error has the sum's sign, down one where it has the other.
    if ((bits & 1) == 0) bits += (e > 0) == (s > 0) ? 1 : uint64_t(-1);
    __builtin_memcpy(&s, &bits, sizeof(bits));
  }
  return static_cast<float>(s);
}

// Four lanes of a * b + c in two pairs of doubles: the exact products, the
// addends, and the sums rounded once to double.
struct DoubleSums {
  __m128d p0, p1, c0, c1, s0, s1;
};
FS_SIMD_INLINE DoubleSums SumInDoubles(__m128 a, __m128 b, __m128 c) {
  DoubleSums d;
  d.p0 = _mm_mul_pd(_mm_cvtps_pd(a), _mm_cvtps_pd(b));
  d.p1 = _mm_mul_pd(_mm_cvtps_pd(_mm_movehl_ps(a, a)), _mm_cvtps_pd(_mm_movehl_ps(b, b)));
  d.c0 = _mm_cvtps_pd(c);
  d.c1 = _mm_cvtps_pd(_mm_movehl_ps(c, c));
  d.s0 = _mm_add_pd(d.p0, d.c0);
  d.s1 = _mm_add_pd(d.p1, d.c1);
  return d;
}
// The sums rounded to float, four lanes.
FS_SIMD_INLINE __m128 ToFloats(const DoubleSums& d) {
  return _mm_movelh_ps(_mm_cvtpd_ps(d.s0), _mm_cvtpd_ps(d.s1));
}

// Four lanes of FmaExact's result by the double sum, taking the exact path
// only for the lanes that need it.
FS_SIMD_INLINE __m128 FmaSse2(__m128 a, __m128 b, __m128 c) {
  const DoubleSums d = SumInDoubles(a, b, c);
  const __m128d p0 = d.p0, p1 = d.p1, c0 = d.c0, c1 = d.c1, s0 = d.s0, s1 = d.s1;
  const __m128 s0f = _mm_castpd_ps(s0), s1f = _mm_castpd_ps(s1);
  // The doubles' low and high halves, lane by lane.
  const __m128i lo = _mm_castps_si128(_mm_shuffle_ps(s0f, s1f, _MM_SHUFFLE(2, 0, 2, 0)));
  const __m128i hi = _mm_castps_si128(_mm_shuffle_ps(s0f, s1f, _MM_SHUFFLE(3, 1, 3, 1)));
  // Halfway: the 29 bits below float's last are 1 then zeros.
  const __m128i half =
      _mm_cmpeq_epi32(_mm_and_si128(lo, _mm_set1_epi32(0x1FFFFFFF)), _mm_set1_epi32(0x10000000));
  // Small: a biased exponent in [1, 897] (|s| < 2^-125, not zero; never a
  // double denormal, the sum being a multiple of 2^-298). An unsigned range
  // check by a signed compare: exponent - 1 below 897 with the sign flipped.
  const __m128i exponent = _mm_and_si128(hi, _mm_set1_epi32(0x7FF00000));
  const __m128i small = _mm_cmpgt_epi32(_mm_set1_epi32(static_cast<int32_t>(0xB8100000u)),
                                        _mm_add_epi32(exponent, _mm_set1_epi32(0x7FF00000)));
  const __m128 r = ToFloats(d);
  if (__builtin_expect(_mm_movemask_ps(_mm_castsi128_ps(_mm_or_si128(half, small))) == 0, 1)) {
    return r;
  }
  // Halfway points are common where the sum is exact (a bf16 chain's
  // products have 16 bits), and there the float rounding is right. So the
  // sums' errors by TwoSum first, four lanes at once: only an inexact
  // halfway lane, or a small one, takes FmaExact.
  const __m128d cv0 = _mm_sub_pd(s0, p0), cv1 = _mm_sub_pd(s1, p1);
  const __m128d pv0 = _mm_sub_pd(s0, cv0), pv1 = _mm_sub_pd(s1, cv1);
  const __m128d e0 = _mm_add_pd(_mm_sub_pd(p0, pv0), _mm_sub_pd(c0, cv0));
  const __m128d e1 = _mm_add_pd(_mm_sub_pd(p1, pv1), _mm_sub_pd(c1, cv1));
  const __m128 inexact =
      _mm_shuffle_ps(_mm_castpd_ps(_mm_cmpneq_pd(e0, _mm_setzero_pd())),
                     _mm_castpd_ps(_mm_cmpneq_pd(e1, _mm_setzero_pd())), _MM_SHUFFLE(2, 0, 2, 0));
  const int redo = _mm_movemask_ps(
      _mm_or_ps(_mm_castsi128_ps(small), _mm_and_ps(_mm_castsi128_ps(half), inexact)));
  if (redo == 0) return r;
  alignas(16) float av[4], bv[4], cv[4], rv[4];
  _mm_store_ps(av, a);
  _mm_store_ps(bv, b);
  _mm_store_ps(cv, c);
  _mm_store_ps(rv, r);
  for (int l = 0; l < 4; ++l) {
    if (redo & (1 << l)) rv[l] = FmaExact(av[l], bv[l], cv[l]);
  }
  return _mm_load_ps(rv);
}
#endif

#if !defined(__AVX512F__)
// op(a, b, c) on each native part (N: __m256 or __m128) of three vectors,
// op a lambda marked FS_SIMD_LAMBDA.
template <typename N, typename Op>
FS_SIMD_INLINE V16 PartWise(const V16& a, const V16& b, const V16& c, Op op) {
  V16 out;
  FS_SIMD_PARTS(V16) {
    out.p[j] = reinterpret_cast<V16::Part>(
        op(reinterpret_cast<N>(a.p[j]), reinterpret_cast<N>(b.p[j]), reinterpret_cast<N>(c.p[j])));
  }
  return out;
}
#endif

// a * b + c with one rounding, lane by lane.
FS_SIMD_INLINE V16 Fma(V16 a, V16 b, V16 c) {
#if defined(__AVX512F__)
  return reinterpret_cast<V16>(_mm512_fmadd_ps(
      reinterpret_cast<__m512>(a), reinterpret_cast<__m512>(b), reinterpret_cast<__m512>(c)));
#elif defined(__AVX2__) && defined(__FMA__)
  return PartWise<__m256>(a, b, c, [](__m256 x, __m256 y, __m256 z) FS_SIMD_LAMBDA {
    return _mm256_fmadd_ps(x, y, z);
  });
#else
  return PartWise<__m128>(
      a, b, c, [](__m128 x, __m128 y, __m128 z) FS_SIMD_LAMBDA { return FmaSse2(x, y, z); });
#endif
}
FS_SIMD_INLINE float Fma(float a, float b, float c) {
#if defined(__FMA__)
  return __builtin_fmaf(a, b, c);
#else
  return _mm_cvtss_f32(FmaSse2(_mm_set_ss(a), _mm_set_ss(b), _mm_set_ss(c)));
#endif
}

// One step of the bf16 chain: a * b + c rounded once, where a and b hold
// bf16 values (so a * b is exact in 16 bits) and MXCSR's DAZ and FTZ are set
// (FlushDenormals). Fma itself where the instruction is; on the generic level
// the double sum rounded to float, with none of Fma's checks, which such a
// product never needs. The double sum is inexact only where the two addends
// lie more than 52 bits apart (the exact sum's lowest bit below the double's
// last, 2^(E-52) for a sum in [2^E, 2^(E+1))). If the product is the small
// one, it is below 2^(E-36) and c, a float near the sum, a multiple of
// 2^(E-23); if c is, below 2^(E-28), and the product, of 16 bits near the
// sum, a multiple of 2^(E-16). Either way the double sum is far closer to a
// multiple of 2^(E-23) than the 2^(E-24) that separates one from a float's
// halfway point: an inexact double sum is never halfway, so rounding it to
// float rounds the exact sum. With FTZ the result is flushed or rounded at 24
// bits, never at a denormal's, so no small sum needs a check either.
FS_SIMD_INLINE V16 FmaBf16(V16 a, V16 b, V16 c) {
#if defined(__FMA__)
  return Fma(a, b, c);
#else
  return PartWise<__m128>(a, b, c, [](__m128 x, __m128 y, __m128 z) FS_SIMD_LAMBDA {
    return ToFloats(SumInDoubles(x, y, z));
  });
#endif
}
FS_SIMD_INLINE float FmaBf16(float a, float b, float c) {
#if defined(__FMA__)
  return Fma(a, b, c);
#else
  return static_cast<float>(static_cast<double>(a) * b + c);
#endif
}

// exp(x) lane by lane, the same bits on every level: the range reduction
// (x = n ln 2 + r, n rounded to nearest by adding 1.5 * 2^23), Cephes' degree
// 5 polynomial on r by fused multiply-adds and the scaling by 2^n in two
// exact halves use only operations IEEE 754 rounds one way. Within 2 ulp
// of the exact value; +inf above 88.72, 0 below -87.34 (where exp is
// subnormal), NaN for NaN. Always inlined: below AVX-512 a call took and
// returned its vector through the stack, one at a time (with the loop
// around it, a fifth of decode attention's samples, its pages in cache).
FS_SIMD_INLINE V16 Exp(V16 x) {
  const V16 big = Splat(88.7228391f), tiny = Splat(-87.3365479f);
  V16 c = Select(x < tiny, tiny, x);
  c = Select(c > big, big, c);
  // 1.5 * 2^23 + n: one rounding, to the integer nearest x / ln 2. (Every
  // product here is a fused multiply-add or stands alone, so no level's
  // compiler can contract it otherwise.)
  const V16 t = Fma(c, Splat(1.44269504088896341f), Splat(12582912.0f));
  const V16 n = t - Splat(12582912.0f);
  V16 r = Fma(n, Splat(-0.693359375f), c);
  r = Fma(n, Splat(2.12194440e-4f), r);
  V16 p = Splat(1.9875691500e-4f);
  p = Fma(p, r, Splat(1.3981999507e-3f));
  p = Fma(p, r, Splat(8.3334519073e-3f));
  p = Fma(p, r, Splat(4.1665795894e-2f));
  p = Fma(p, r, Splat(1.6666665459e-1f));
  p = Fma(p, r, Splat(5.0000001201e-1f));
  V16 y = Fma(p, r * r, r) + Splat(1.0f);
  const I16 ni = BitCast<I16>(BitCast<U16>(t) - 0x4B400000u);  // n, from t's low bits
  const I16 n1 = ni >> 1, n2 = ni - n1;                        // both in [-63, 64]
  const I16 s1 = (n1 + 127) << 23, s2 = (n2 + 127) << 23;
  y = y * BitCast<V16>(s1) * BitCast<V16>(s2);
  y = Select(x > big, Splat(__builtin_inff()), y);
  y = Select(x < tiny, V16{}, y);
  return Select(x != x, x, y);
}

// While alive, this thread's floating-point operations read denormal inputs
// as zero and flush denormal results to zero (MXCSR DAZ and FTZ; a result is
// flushed when, rounded to 24 bits with an unbounded exponent, it is below
// 2^-126): the bf16 chain's rule, which vdpbf16ps follows whatever MXCSR says
// (gemm.h). Restores the previous mode when destroyed. Not movable.
class FlushDenormals {
 public:
  FlushDenormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | kDaz | kFtz); }
  ~FlushDenormals() { _mm_setcsr(saved_); }
  FlushDenormals(const FlushDenormals&) = delete;
  FlushDenormals& operator=(const FlushDenormals&) = delete;

 private:
  static constexpr unsigned kDaz = 0x0040, kFtz = 0x8000;
  unsigned saved_;
};

}  // namespace FS_SIMD_NAMESPACE
}  // namespace failsafe::cpu
