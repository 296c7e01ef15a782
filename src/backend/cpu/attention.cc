// Grouped-query attention over a paged KV cache, batch-invariant.
//
// Scores and weighted values are two multiplies on the batch-invariant GEMM
// (gemm.h), with the keys and values taken row by row from their pages: a
// query's score for a key is a dot product over the head dimension (times
// the scale); its softmax adds its terms in lanes by their place from the
// first key it sees (SoftmaxRow), the same in any tile; its output is a
// chain over positions in increasing order. A query computed alone (decode)
// and the same query in a prefill chunk thus get the same output bit for
// bit: in a chunk, the positions a query must not see weigh an exact zero,
// which leaves the chain unchanged.
//
// bf16 pages (AttentionArgs::kv_dtype) hold the keys and values rounded once
// as they are stored; the products read them widened (GemmArgs::w_rows of
// bf16), so attention computes exactly as over f32 pages holding the rounded
// values, reading half the bytes.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/cpu/gemm.h"
#include "backend/cpu/kernels.h"
#include "common/check.h"

namespace failsafe::cpu {

namespace {

constexpr int kQueryTile = 64;  // queries whose scores are held at once

inline int FirstKey(const AttentionArgs& a, int pos) {
  return a.sliding_window > 0 ? std::max(0, pos - a.sliding_window + 1) : 0;
}

// Row `row` of a page (keys: 0 to block_size - 1, values: block_size on), of
// head_dim elements of `elem` bytes each.
inline float* PageRow(float* page, int row, int hd, int elem) {
  return reinterpret_cast<float*>(reinterpret_cast<char*>(page) +
                                  static_cast<int64_t>(row) * hd * elem);
}

// n values into a page's row: as they are, or rounded to bf16.
void StoreRow(const float* src, float* dst, int n, DType kv) {
  if (kv == DType::kF32) {
    std::memcpy(dst, src, sizeof(float) * n);
    return;
  }
  auto* h = reinterpret_cast<uint16_t*>(dst);
  for (int i = 0; i < n; ++i) h[i] = FloatToBFloat16(src[i]);
}

// Scores, softmax and weighted values of m query rows (x, row stride ldx)
// over the keys [k0, k0 + width) into out (row stride ldo). Row r is at
// position pos0 + r * step.
void Heads(const AttentionArgs& a, const float* x, int64_t ldx, int m, int pos0, int step, int k0,
           int width, const std::vector<const float*>& keys,
           const std::vector<const float*>& values, float* out, int64_t ldo,
           std::optional<CpuIsa> isa) {
  thread_local std::vector<float> scores;
  scores.resize(static_cast<size_t>(m) * width);
  GemmArgs s;
  s.x = x;
  s.ldx = ldx;
  s.w_rows = keys.data();
  s.wtype = a.kv_dtype;
  s.nt = true;
  s.m = m;
  s.n = width;
  s.k = a.head_dim;
  s.y = scores.data();
  s.ldy = width;
  s.isa = isa;
  Gemm(s);
  for (int r = 0; r < m; ++r) {
    const int pos = pos0 + r * step;
    float* row = scores.data() + static_cast<int64_t>(r) * width;
    const int lo = FirstKey(a, pos) - k0, hi = pos - k0;
    float scale = a.scale;
    if (a.softcap > 0) {
      // Capped scores, key by key (the same in any tile).
      for (int i = std::max(0, lo); i <= hi; ++i)
        row[i] = a.softcap * std::tanh(row[i] * a.scale / a.softcap);
      scale = 1.0f;
    }
    SoftmaxRow(row, width, lo, hi, scale, isa);
  }
  GemmArgs v;
  v.x = scores.data();
  v.ldx = width;
  v.w_rows = values.data();
  v.wtype = a.kv_dtype;
  v.nt = false;
  v.m = m;
  v.n = a.head_dim;
  v.k = width;
  v.y = out;
  v.ldy = ldo;
  v.isa = isa;
  Gemm(v);
}

}  // namespace

void PrefetchAttentionStart(const AttentionArgs& a) {
  if (a.num_tokens <= 0 || a.group_size == 0) return;
  const int bs = a.block_size, hd = a.head_dim, elem = static_cast<int>(DTypeSize(a.kv_dtype));
  // The first query tile's keys and values: the scores' first kRowsAheadNT
  // keys and the weighted values' first kRowsAheadNN rows, and into the
  // second-level cache those up to kRowsFarNT and kRowsFarNN, which the
  // kernels' own requests skip.
  const int k0 = FirstKey(a, a.start_pos);
  const int end = a.start_pos + std::min(kQueryTile, a.num_tokens);  // past the tile's last
  auto ask = [&](int p0, int p1, int offset, bool near) {
    for (int p = p0; p < std::min(end, p1); ++p) {
      const char* row =
          reinterpret_cast<const char*>(PageRow(a.pages[p / bs], offset + p % bs, hd, elem));
      for (int64_t b = 0; b < static_cast<int64_t>(hd) * elem; b += 64) {
        if (near) {
          __builtin_prefetch(row + b);
        } else {
          __builtin_prefetch(row + b, 0, 1);
        }
      }
    }
  };
  ask(k0, k0 + kRowsAheadNT, 0, true);
  ask(k0, k0 + kRowsAheadNN, bs, true);
  ask(k0 + kRowsAheadNT, k0 + kRowsFarNT, 0, false);
  ask(k0 + kRowsAheadNN, k0 + kRowsFarNN, bs, false);
}

void Attention(const AttentionArgs& a, std::optional<CpuIsa> isa) {
  if (a.num_tokens <= 0) return;
  const int g = a.group_size, hd = a.head_dim, bs = a.block_size;
  FS_CHECK_MSG(a.kv_dtype == DType::kF32 || a.kv_dtype == DType::kBF16,
               "KV pages hold f32 or bf16, not {}", DTypeName(a.kv_dtype));
  const int elem = static_cast<int>(DTypeSize(a.kv_dtype));
  if (a.new_kv != nullptr) {
    for (int t = 0; t < a.num_tokens; ++t) {
      const int p = a.start_pos + t;
      float* page = a.pages[p / bs];
      const float* src = a.new_kv + static_cast<int64_t>(t) * a.ld_new_kv;
      StoreRow(src, PageRow(page, p % bs, hd, elem), hd, a.kv_dtype);
      StoreRow(src + hd, PageRow(page, bs + p % bs, hd, elem), hd, a.kv_dtype);
    }
  }
  if (g == 0) return;
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
      float* page = a.pages[p / bs];
      keys[p - k0] = PageRow(page, p % bs, hd, elem);
      values[p - k0] = PageRow(page, bs + p % bs, hd, elem);
    }
    const float* q = a.q + static_cast<int64_t>(t0) * a.ldq;
    float* out = a.out + static_cast<int64_t>(t0) * a.ldo;
    if (rows == 1) {
      // One query (decode): the group's heads are the rows of one multiply,
      // so each key and value is read once for all of them. A row's result
      // does not depend on the rows beside it (gemm.h).
      Heads(a, q, hd, g, a.start_pos + t0, 0, k0, width, keys, values, out, hd, isa);
      continue;
    }
    for (int j = 0; j < g; ++j) {
      Heads(a, q + j * hd, a.ldq, rows, a.start_pos + t0, 1, k0, width, keys, values, out + j * hd,
            a.ldo, isa);
    }
  }
}

}  // namespace failsafe::cpu
