// CPU kernel entry points shared by the CPU backend's files.
#pragma once

#include <cstdint>
#include <optional>

#include "backend/backend.h"
#include "backend/cpu/simd.h"

namespace failsafe::cpu {

inline float Sum(V16 v) {
  float s = 0;
  for (int i = 0; i < 16; ++i) s += v[i];
  return s;
}
float Dot(const float* a, const float* b, int n);
// Element i of a weight's storage (in elements of its dtype), as f32.
inline float WeightAt(WeightsRef w, int64_t i) {
  switch (w.dtype) {
    case DType::kBF16:
      return BFloat16ToFloat(static_cast<const uint16_t*>(w.data)[i]);
    case DType::kF16:
      return HalfToFloat(static_cast<const uint16_t*>(w.data)[i]);
    case DType::kF32:
      break;
  }
  return static_cast<const float*>(w.data)[i];
}

// The kernels' instruction-set level and threads, for the Linear* calls.
struct LinearOptions {
  int threads = 1;
  std::optional<CpuIsa> isa;   // unset: the best the CPU supports
  std::optional<bool> dpbf16;  // GemmArgs::dpbf16
};

void LinearNT(const float* x, int64_t ldx, WeightsRef w, float* y, int64_t ldy, int m, int n, int k,
              bool accumulate, const LinearOptions& o);
void LinearNN(const float* x, int64_t ldx, WeightsRef w, float* y, int64_t ldy, int m, int n, int k,
              bool accumulate, const LinearOptions& o);
void LinearNNFixed(const float* x, int64_t ldx, WeightsRef w, int64_t* acc, int64_t ldacc, int m,
                   int n, int k, int item_k, const LinearOptions& o);
void Attention(const AttentionArgs& a, std::optional<CpuIsa> isa);
// Asks for the keys and values a problem reads first, which the kernels'
// own requests (kRowsAheadNT, kRowsAheadNN, and into the second-level cache
// kRowsFarNT, kRowsFarNN: gemm.h) start after: to be called while the
// problem before it runs. Of the problem it reads only its
// page table (no key or value).
void PrefetchAttentionStart(const AttentionArgs& a);
// out[i] = g[i] / (1 + exp(-g[i])) * u[i], i < n; row[i] = exp(row[i] -
// shift), i < n: vectorised at the level's width with one exp (Exp in simd.h)
// whose bits are the same on every level.
void SiluMulRow(const float* g, const float* u, float* out, int n, std::optional<CpuIsa> isa);
void ExpShifted(float* row, int n, float shift, std::optional<CpuIsa> isa);
// The bf16 chain's activations at a level (what Gemm rounds x into):
// dst[i] = RoundToBf16(src[i]), i < n; and words[w] = the bf16 of xs[2w]
// (low half) and of xs[2w + 1] (high half), w < n, from xs so rounded.
void RoundRowToBf16(const float* src, float* dst, int n, std::optional<CpuIsa> isa);
void PackBf16Pairs(const float* xs, uint32_t* words, int64_t n, std::optional<CpuIsa> isa);
// Softmax of row[lo, hi] times scale, in place; the rest of row[0, width)
// exact zeros. The terms are added in 16 lanes by their place from lo, the
// lanes then in a fixed tree: the same bits on every level, and for a query
// whatever [lo, hi] lies in (a decode's row or a prefill tile's).
void SoftmaxRow(float* row, int width, int lo, int hi, float scale, std::optional<CpuIsa> isa);
int Sample(const float* logits, int vocab, const SamplingParams& p, uint64_t counter);

}  // namespace failsafe::cpu
