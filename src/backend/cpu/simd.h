// Vectors of 16 floats for the CPU kernels: one AVX-512 register where the
// translation unit is built for it, two AVX2 registers, or four SSE registers
// with scalar fused multiply-adds (GCC vector extensions).
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

#if defined(__AVX512F__)
#define FS_SIMD_NAMESPACE simd_avx512
#elif defined(__AVX2__) && defined(__FMA__)
#define FS_SIMD_NAMESPACE simd_avx2
#else
#define FS_SIMD_NAMESPACE simd_generic
#endif

namespace failsafe::cpu {
inline namespace FS_SIMD_NAMESPACE {

typedef float V16 __attribute__((vector_size(64), aligned(4)));
typedef int32_t I16 __attribute__((vector_size(64)));

inline V16 Load(const float* p) {
  V16 v;
  __builtin_memcpy(&v, p, sizeof(v));
  return v;
}
inline void Store(float* p, V16 v) { __builtin_memcpy(p, &v, sizeof(v)); }

// An f32's bits rounded to bf16 (the upper half; the lower is zero), on one
// uint32_t or on a GCC vector of them lane by lane: branch-free. NaN: quiet,
// with the payload's upper bits; else to nearest, ties to even.
template <typename U>
inline U Bf16Bits(U b) {
  const U nan = b | 0x00400000u, rounded = b + 0x7fffu + ((b >> 16) & 1u);
  return ((b & 0x7fffffffu) > 0x7f800000u ? nan : rounded) & 0xffff0000u;
}
inline V16 Splat(float x) { return V16{x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x}; }

// 16-bit weights, widened exactly to f32 in registers.
struct BF16 {
  uint16_t bits;
};
struct F16 {
  uint16_t bits;
};

inline V16 Load(const BF16* p) {
  typedef uint16_t U16x16 __attribute__((vector_size(32), aligned(2)));
  typedef uint32_t U32x16 __attribute__((vector_size(64)));
  U16x16 h;
  __builtin_memcpy(&h, p, sizeof(h));
  const U32x16 w = __builtin_convertvector(h, U32x16) << 16;  // bf16 is f32's upper half
  V16 v;
  __builtin_memcpy(&v, &w, sizeof(v));
  return v;
}

// Sixteen 32-bit lanes, each holding two bf16 values (low and high half),
// widened exactly and in-lane: even = lane << 16, odd = lane & 0xffff0000.
inline void WidenPair(I16 lanes, V16* even, V16* odd) {
  typedef uint32_t U32x16 __attribute__((vector_size(64)));
  const U32x16 w = reinterpret_cast<U32x16>(lanes);
  const U32x16 lo = w << 16, hi = w & 0xffff0000u;
  __builtin_memcpy(even, &lo, sizeof(lo));
  __builtin_memcpy(odd, &hi, sizeof(hi));
}

// 32 bf16 values as 16 lanes of two (for WidenPair), bits unchanged.
inline I16 LoadLanes(const BF16* p) {
  I16 v;
  __builtin_memcpy(&v, p, sizeof(v));
  return v;
}

// Two k-values of 16 columns of bf16, interleaved: column q's values for the
// even and the odd k-value in the low and high half of 32-bit lane q (the
// paired blocked layout, Blocked16Index in backend/backend.h).
inline void LoadPair(const BF16* p, V16* even, V16* odd) { WidenPair(LoadLanes(p), even, odd); }

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

inline V16 Load(const F16* p) {
#if defined(__AVX512F__)
  return reinterpret_cast<V16>(
      _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))));
#elif defined(__F16C__)
  typedef float V8 __attribute__((vector_size(32)));
  struct Halves {
    V8 lo, hi;
  } r;
  r.lo =
      reinterpret_cast<V8>(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  r.hi = reinterpret_cast<V8>(
      _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8))));
  V16 v;
  __builtin_memcpy(&v, &r, sizeof(v));
  return v;
#else
  V16 v;
  for (int i = 0; i < 16; ++i) v[i] = Widen(p[i]);
  return v;
#endif
}

inline float Widen(float f) { return f; }

// a * b + c with one rounding, lane by lane.
inline V16 Fma(V16 a, V16 b, V16 c) {
#if defined(__AVX512F__)
  return reinterpret_cast<V16>(_mm512_fmadd_ps(
      reinterpret_cast<__m512>(a), reinterpret_cast<__m512>(b), reinterpret_cast<__m512>(c)));
#elif defined(__FMA__)
  typedef float V8 __attribute__((vector_size(32)));
  struct Halves {
    V8 lo, hi;
  };
  Halves ha, hb, hc, r;
  __builtin_memcpy(&ha, &a, 64);
  __builtin_memcpy(&hb, &b, 64);
  __builtin_memcpy(&hc, &c, 64);
  r.lo = reinterpret_cast<V8>(_mm256_fmadd_ps(reinterpret_cast<__m256>(ha.lo),
                                              reinterpret_cast<__m256>(hb.lo),
                                              reinterpret_cast<__m256>(hc.lo)));
  r.hi = reinterpret_cast<V8>(_mm256_fmadd_ps(reinterpret_cast<__m256>(ha.hi),
                                              reinterpret_cast<__m256>(hb.hi),
                                              reinterpret_cast<__m256>(hc.hi)));
  V16 out;
  __builtin_memcpy(&out, &r, 64);
  return out;
#else
  V16 out;
  for (int i = 0; i < 16; ++i) out[i] = std::fma(a[i], b[i], c[i]);
  return out;
#endif
}
inline float Fma(float a, float b, float c) {
#if defined(__FMA__)
  return __builtin_fmaf(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

// exp(x) lane by lane, the same bits on every level: the range reduction
// (x = n ln 2 + r, n rounded to nearest by adding 1.5 * 2^23), Cephes' degree
// 5 polynomial on r by fused multiply-adds and the scaling by 2^n in two
// exact halves use only operations IEEE 754 rounds one way. Within 2 ulp
// of the exact value; +inf above 88.72, 0 below -87.34 (where exp is
// subnormal), NaN for NaN.
inline V16 Exp(V16 x) {
  typedef uint32_t U16 __attribute__((vector_size(64)));
  const V16 big = Splat(88.7228391f), tiny = Splat(-87.3365479f);
  V16 c = x < tiny ? tiny : x;
  c = c > big ? big : c;
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
  U16 tb;
  __builtin_memcpy(&tb, &t, 64);
  const I16 ni = reinterpret_cast<I16>(tb - 0x4B400000u);  // n, from t's low bits
  const I16 n1 = ni >> 1, n2 = ni - n1;                    // both in [-63, 64]
  const I16 s1 = (n1 + 127) << 23, s2 = (n2 + 127) << 23;
  V16 f1, f2;
  __builtin_memcpy(&f1, &s1, 64);
  __builtin_memcpy(&f2, &s2, 64);
  y = y * f1 * f2;
  y = x > big ? Splat(__builtin_inff()) : y;
  y = x < tiny ? V16{} : y;
  return x != x ? x : y;
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
