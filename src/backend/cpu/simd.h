// Vectors of 16 floats for the CPU kernels: one AVX-512 register where the
// machine has it, two AVX2 registers otherwise (GCC vector extensions).
//
// Fma is a true fused multiply-add (one rounding) on every path, vector and
// scalar, so that a chain of Fma gives bit-identical results whichever path
// computes it: the batch-invariant kernels depend on it.
#pragma once

#include <immintrin.h>

#include <cmath>
#include <cstdint>

namespace failsafe::cpu {

typedef float V16 __attribute__((vector_size(64), aligned(4)));
typedef int32_t I16 __attribute__((vector_size(64)));

inline V16 Load(const float* p) {
  V16 v;
  __builtin_memcpy(&v, p, sizeof(v));
  return v;
}
inline void Store(float* p, V16 v) { __builtin_memcpy(p, &v, sizeof(v)); }
inline V16 Splat(float x) { return V16{x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x}; }

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
inline float Fma(float a, float b, float c) { return std::fma(a, b, c); }

}  // namespace failsafe::cpu
