// CPU kernel entry points shared by the CPU backend's files.
#pragma once

#include <cstdint>

#include "backend/backend.h"
#include "backend/cpu/simd.h"

namespace failsafe::cpu {

inline float Sum(V16 v) {
  float s = 0;
  for (int i = 0; i < 16; ++i) s += v[i];
  return s;
}
float Dot(const float* a, const float* b, int n);

void LinearNT(const float* x, int64_t ldx, const float* w, float* y, int64_t ldy, int m, int n,
              int k, bool accumulate, int threads);
void LinearNN(const float* x, int64_t ldx, const float* w, float* y, int64_t ldy, int m, int n,
              int k, bool accumulate, int threads);
void LinearNNFixed(const float* x, int64_t ldx, const float* w, int64_t* acc, int64_t ldacc, int m,
                   int n, int k, int item_k, int threads);
void Attention(const AttentionArgs& a);
int Sample(const float* logits, int vocab, const SamplingParams& p, uint64_t counter);

}  // namespace failsafe::cpu
