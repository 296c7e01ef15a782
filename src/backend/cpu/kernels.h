// CPU kernel entry points shared by the CPU backend's files.
#pragma once

#include <cstdint>

#include "backend/backend.h"

namespace failsafe::cpu {

// 16 floats: one AVX-512 register where available, two AVX2 registers otherwise.
typedef float V16 __attribute__((vector_size(64), aligned(4)));

inline V16 Load(const float* p) {
  V16 v;
  __builtin_memcpy(&v, p, sizeof(v));
  return v;
}
inline void Store(float* p, V16 v) { __builtin_memcpy(p, &v, sizeof(v)); }
inline V16 Splat(float x) { return V16{} + x; }
inline float Sum(V16 v) {
  float s = 0;
  for (int i = 0; i < 16; ++i) s += v[i];
  return s;
}
float Dot(const float* a, const float* b, int n);
// y += a * x
void Axpy(float a, const float* x, float* y, int n);

void LinearNT(const float* x, int64_t ldx, const float* w, float* y, int64_t ldy, int m, int n,
              int k, bool accumulate, int threads);
void LinearNN(const float* x, int64_t ldx, const float* w, float* y, int64_t ldy, int m, int n,
              int k, bool accumulate, int threads);
void Attention(const AttentionArgs& a);
bool AttentionIsStreaming(const AttentionArgs& a);
int Sample(const float* logits, int vocab, const SamplingParams& p, uint64_t counter);

}  // namespace failsafe::cpu
