// The attention kernels' test cases, shared by CudaBackend's test on a GPU
// (cuda_backend_test.cc) and the emulated kernels' test on any machine
// (emulation/emulation_test.cc): both check the same sequences and
// variants against the CPU backend, with the same tolerances.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/safetensors.h"  // FloatToBFloat16

namespace failsafe::attention_cases {

// Head dims of every kind of step of 16, groups from 1 to 17 (a warp's rows
// cut mid-token, a token's over two blocks), a sharp softmax (q_scale 8:
// scores eight times as spread) and a softcap.
struct Shape {
  int hd, group;
  float q_scale, softcap;
};
inline constexpr Shape kShapes[] = {{64, 4, 1, 0}, {128, 4, 1, 0}, {16, 1, 8, 0},
                                    {48, 3, 8, 5}, {80, 7, 1, 0},  {112, 17, 8, 0}};

inline const char* KernelName(GpuAttention mode) {
  return mode == GpuAttention::kTensor     ? "tensor cores"
         : mode == GpuAttention::kSegments ? "CUDA cores in segments"
                                           : "CUDA cores";
}

// The largest difference from the CPU backend's outputs, relative to their
// largest: on CUDA cores f32 near the CPU backend's; on tensor cores
// (queries, keys, values and weights in bf16) within bf16 rounding of it,
// whose error grows with a score's size, and a sharp softmax's with it.
inline double Tolerance(GpuAttention mode, const Shape& s) {
  const bool sharp = s.q_scale > 1 || s.softcap > 0;
  return mode == GpuAttention::kTensor ? (sharp ? 3e-2 : 5e-3) : (sharp ? 5e-5 : 2e-5);
}

// The largest difference from `want`, relative to its largest element
// (infinite where `got` is not finite).
inline double MaxRelError(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    num = std::max(num, std::fabs(static_cast<double>(got[i]) - want[i]));
    den = std::max(den, std::fabs(static_cast<double>(want[i])));
  }
  return den > 0 ? num / den : num;
}

inline std::vector<float> Uniform(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-scale, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Sequences with scattered pages over a pool of pages of `kv` (the keys
// already stored, random), each with its queries and this step's keys and
// values. From the fifth on, past the first segment of 512 keys: a chunk, a
// decode step over three segments, a chunk across a segment's edge (with a
// window of 300, queries that see no key in the first), and a short chunk
// over three.
struct Case {
  struct Seq {
    int start, tokens;
    std::vector<int> pages;    // the pool's pages holding its positions, in order
    std::vector<float> q, kv;  // [tokens, group * hd], [tokens, 2 hd]
  };
  Shape shape;
  DType kv;
  int window;
  int block_size = 16, pool_pages = 320;
  int64_t page_floats = 0;  // a page's size in floats (bf16 pages: half as many)
  std::vector<float> pool;
  std::vector<Seq> seqs;

  Case(const Shape& s, DType kv_dtype, int sliding_window)
      : shape(s), kv(kv_dtype), window(sliding_window) {
    const int hd = s.hd;
    page_floats = 2LL * block_size * hd * static_cast<int64_t>(DTypeSize(kv)) / 4;
    pool = Uniform(static_cast<size_t>(pool_pages) * page_floats, 11);
    if (kv == DType::kBF16) {  // bf16 values, as stored ones
      const auto f = Uniform(2 * pool.size(), 11);
      auto* h = reinterpret_cast<uint16_t*>(pool.data());
      for (size_t i = 0; i < f.size(); ++i) h[i] = FloatToBFloat16(f[i]);
    }
    std::mt19937 rng(hd + window);
    std::vector<int> order(pool_pages);
    for (int i = 0; i < pool_pages; ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), rng);
    const int spans[][2] = {{0, 70},   {45, 1},   {100, 23}, {5, 1},
                            {600, 40}, {1100, 1}, {509, 4},  {1530, 3}};
    size_t next_page = 0;
    for (size_t i = 0; i < std::size(spans); ++i) {
      Seq q;
      q.start = spans[i][0];
      q.tokens = spans[i][1];
      const int pos = q.start + q.tokens;
      for (int p = 0; p < (pos + block_size - 1) / block_size; ++p) {
        q.pages.push_back(order.at(next_page++));
      }
      q.q = Uniform(static_cast<size_t>(q.tokens) * s.group * hd, 20 + i, s.q_scale);
      q.kv = Uniform(static_cast<size_t>(q.tokens) * 2 * hd, 30 + i);
      seqs.push_back(std::move(q));
    }
  }

  // Sequence i's problem over a copy of the pool at `pool_copy` (page
  // addresses into `table`, which must outlive it), with its queries,
  // new keys and values and outputs at q, kv and out in the same memory.
  AttentionArgs Args(size_t i, float* pool_copy, const float* q, const float* new_kv, float* out,
                     std::vector<float*>* table) const {
    const Seq& s = seqs[i];
    table->clear();
    for (int p : s.pages) table->push_back(pool_copy + p * page_floats);
    AttentionArgs a;
    a.q = q;
    a.ldq = shape.group * shape.hd;
    a.out = out;
    a.ldo = shape.group * shape.hd;
    a.num_tokens = s.tokens;
    a.start_pos = s.start;
    a.group_size = shape.group;
    a.head_dim = shape.hd;
    a.pages = table->data();
    a.kv_dtype = kv;
    a.new_kv = new_kv;
    a.ld_new_kv = 2 * shape.hd;
    a.block_size = block_size;
    a.sliding_window = window;
    a.scale = 1.0f / std::sqrt(static_cast<float>(shape.hd));
    a.softcap = shape.softcap;
    return a;
  }

  // Sequences whose last token is computed again alone (a decode step after
  // the prefill): the same bits as in its chunk.
  static std::vector<size_t> Chunks() { return {0, 4, 6, 7}; }

  std::string Name(GpuAttention mode) const {
    return std::string(KernelName(mode)) + " " + DTypeName(kv) + " hd " + std::to_string(shape.hd) +
           " group " + std::to_string(shape.group) + " q scale " + std::to_string(shape.q_scale) +
           " softcap " + std::to_string(shape.softcap) + " window " + std::to_string(window);
  }
};

}  // namespace failsafe::attention_cases
