// Grouped-query attention over a paged KV cache, batch-invariant.
//
// Scores and weighted values are two multiplies on the batch-invariant GEMM
// (gemm.h), with the keys and values taken row by row from their pages: a
// query's score for a key is a dot product over the head dimension (times
// the scale); its softmax adds its terms in position order; its output is a
// chain over positions in increasing order. A query computed alone (decode)
// and the same query in a prefill chunk thus get the same output bit for
// bit: in a chunk, the positions a query must not see weigh an exact zero,
// which leaves the chain unchanged.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/gemm.h"
#include "backend/cpu/kernels.h"

namespace failsafe::cpu {

namespace {

constexpr int kQueryTile = 64;  // queries whose scores are held at once

inline int FirstKey(const AttentionArgs& a, int pos) {
  return a.sliding_window > 0 ? std::max(0, pos - a.sliding_window + 1) : 0;
}

// Softmax of row[lo, hi] in place (terms added in position order); the rest
// of the row becomes exact zeros.
void Softmax(float* row, int width, int lo, int hi, std::optional<CpuIsa> isa) {
  float mx = -std::numeric_limits<float>::infinity();
  for (int i = lo; i <= hi; ++i) mx = std::max(mx, row[i]);
  ExpShifted(row + lo, hi - lo + 1, mx, isa);
  float sum = 0;
  for (int i = lo; i <= hi; ++i) sum += row[i];
  const float inv = 1.0f / sum;
  for (int i = lo; i <= hi; ++i) row[i] *= inv;
  std::fill(row, row + lo, 0.0f);
  std::fill(row + hi + 1, row + width, 0.0f);
}

}  // namespace

void Attention(const AttentionArgs& a, std::optional<CpuIsa> isa) {
  if (a.num_tokens <= 0) return;
  const int g = a.group_size, hd = a.head_dim, bs = a.block_size;
  thread_local std::vector<float> scores;
  thread_local std::vector<const float*> keys, values;
  for (int t0 = 0; t0 < a.num_tokens; t0 += kQueryTile) {
    const int rows = std::min(kQueryTile, a.num_tokens - t0);
    // Keys the tile can see: [k0, k1].
    const int k0 = FirstKey(a, a.start_pos + t0);
    const int k1 = a.start_pos + t0 + rows - 1;
    const int width = k1 - k0 + 1;
    keys.resize(width);
    values.resize(width);
    for (int p = k0; p <= k1; ++p) {
      const float* page = a.pages[p / bs];
      keys[p - k0] = page + (p % bs) * hd;
      values[p - k0] = page + (bs + p % bs) * hd;
    }
    scores.resize(static_cast<size_t>(rows) * width);
    for (int j = 0; j < g; ++j) {
      GemmArgs s;
      s.x = a.q + static_cast<int64_t>(t0) * a.ldq + j * hd;
      s.ldx = a.ldq;
      s.w_rows = keys.data();
      s.nt = true;
      s.m = rows;
      s.n = width;
      s.k = hd;
      s.y = scores.data();
      s.ldy = width;
      s.isa = isa;
      Gemm(s);
      for (int r = 0; r < rows; ++r) {
        float* row = scores.data() + static_cast<int64_t>(r) * width;
        for (int i = 0; i < width; ++i) row[i] *= a.scale;
        const int pos = a.start_pos + t0 + r;
        Softmax(row, width, FirstKey(a, pos) - k0, pos - k0, isa);
      }
      GemmArgs v;
      v.x = scores.data();
      v.ldx = width;
      v.w_rows = values.data();
      v.nt = false;
      v.m = rows;
      v.n = hd;
      v.k = width;
      v.y = a.out + static_cast<int64_t>(t0) * a.ldo + j * hd;
      v.ldy = a.ldo;
      v.isa = isa;
      Gemm(v);
    }
  }
}

}  // namespace failsafe::cpu
