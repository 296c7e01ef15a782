// Grouped-query attention over a paged KV cache.
//
// Few query tokens (decode): stream K and V page by page, all query heads of
// the group at once, so each KV byte is read once. Many query tokens (prefill
// chunks): gather the context into contiguous K and V and use GEMMs, in
// query tiles so that scores stay bounded in memory.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/kernels.h"

namespace failsafe::cpu {

namespace {

constexpr int kGemmMinTokens = 8;
constexpr int kQueryTile = 64;

inline const float* KeyRow(const AttentionArgs& a, int pos) {
  return a.pages[pos / a.block_size] + (pos % a.block_size) * a.head_dim;
}
inline const float* ValueRow(const AttentionArgs& a, int pos) {
  return a.pages[pos / a.block_size] + (a.block_size + pos % a.block_size) * a.head_dim;
}

inline int FirstKey(const AttentionArgs& a, int pos) {
  return a.sliding_window > 0 ? std::max(0, pos - a.sliding_window + 1) : 0;
}

void SoftmaxInPlace(float* s, int n) {
  float mx = -std::numeric_limits<float>::infinity();
  for (int i = 0; i < n; ++i) mx = std::max(mx, s[i]);
  float sum = 0;
  for (int i = 0; i < n; ++i) {
    s[i] = std::exp(s[i] - mx);
    sum += s[i];
  }
  float inv = 1.0f / sum;
  for (int i = 0; i < n; ++i) s[i] *= inv;
}

void AttentionStreaming(const AttentionArgs& a) {
  const int hd = a.head_dim, g = a.group_size;
  thread_local std::vector<float> scores;
  for (int t = 0; t < a.num_tokens; ++t) {
    const int pos = a.start_pos + t;
    const int lo = FirstKey(a, pos);
    const int ctx = pos - lo + 1;
    scores.resize(static_cast<size_t>(g) * ctx);
    const float* q = a.q + t * a.ldq;
    for (int p = lo; p <= pos; ++p) {
      const float* k = KeyRow(a, p);
      for (int j = 0; j < g; ++j) scores[j * ctx + (p - lo)] = Dot(q + j * hd, k, hd) * a.scale;
    }
    for (int j = 0; j < g; ++j) SoftmaxInPlace(scores.data() + j * ctx, ctx);
    float* out = a.out + t * a.ldo;
    for (int j = 0; j < g; ++j) std::fill(out + j * hd, out + (j + 1) * hd, 0.0f);
    for (int p = lo; p <= pos; ++p) {
      const float* v = ValueRow(a, p);
      for (int j = 0; j < g; ++j) Axpy(scores[j * ctx + (p - lo)], v, out + j * hd, hd);
    }
  }
}

void AttentionGemm(const AttentionArgs& a) {
  const int hd = a.head_dim;
  const int first = FirstKey(a, a.start_pos);
  const int last = a.start_pos + a.num_tokens - 1;
  const int ctx = last - first + 1;
  thread_local std::vector<float> kc, vc, s;
  kc.resize(static_cast<size_t>(ctx) * hd);
  vc.resize(static_cast<size_t>(ctx) * hd);
  for (int p = first; p <= last; ++p) {
    std::copy_n(KeyRow(a, p), hd, kc.data() + static_cast<size_t>(p - first) * hd);
    std::copy_n(ValueRow(a, p), hd, vc.data() + static_cast<size_t>(p - first) * hd);
  }
  for (int t0 = 0; t0 < a.num_tokens; t0 += kQueryTile) {
    const int rows = std::min(kQueryTile, a.num_tokens - t0);
    // Keys this tile can see: [k0, k1] in context coordinates.
    const int k0 = FirstKey(a, a.start_pos + t0) - first;
    const int k1 = a.start_pos + t0 + rows - 1 - first;
    const int width = k1 - k0 + 1;
    s.resize(static_cast<size_t>(rows) * width);
    for (int j = 0; j < a.group_size; ++j) {
      const float* q = a.q + static_cast<int64_t>(t0) * a.ldq + j * hd;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, width, hd, a.scale, q,
                  static_cast<int>(a.ldq), kc.data() + static_cast<size_t>(k0) * hd, hd, 0.0f,
                  s.data(), width);
      for (int r = 0; r < rows; ++r) {
        const int pos = a.start_pos + t0 + r;
        const int lo = FirstKey(a, pos) - first - k0;  // visible keys [lo, hi] in the row
        const int hi = pos - first - k0;
        float* row = s.data() + static_cast<size_t>(r) * width;
        std::fill(row, row + lo, 0.0f);
        SoftmaxInPlace(row + lo, hi - lo + 1);
        std::fill(row + hi + 1, row + width, 0.0f);
      }
      float* out = a.out + static_cast<int64_t>(t0) * a.ldo + j * hd;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hd, width, 1.0f, s.data(), width,
                  vc.data() + static_cast<size_t>(k0) * hd, hd, 0.0f, out, static_cast<int>(a.ldo));
    }
  }
}

}  // namespace

bool AttentionIsStreaming(const AttentionArgs& a) { return a.num_tokens < kGemmMinTokens; }

void Attention(const AttentionArgs& a) {
  if (a.num_tokens <= 0) return;
  if (AttentionIsStreaming(a)) {
    AttentionStreaming(a);
  } else {
    AttentionGemm(a);
  }
}

}  // namespace failsafe::cpu
