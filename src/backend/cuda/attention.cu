// Paged attention for chunked prefill and decode, with GQA and a sliding
// window (kernels.h: Attention).
//
// A block of kWarps warps computes kWarps queries (token, query head) of one
// problem, one per warp, over chunks of kChunk keys at fixed positions
// ([32 c, 32 c + 32)), loaded once into shared memory for all its warps.
// Each warp runs the online softmax over the chunks its query reaches, in
// increasing order; a chunk it does not reach changes nothing. So a query's
// result depends only on its own keys: the same in a prefill chunk of any
// size as in a decode step.
//
// Pages of bf16 (AttentionProblem::kv_bf16) hold keys and values rounded to
// nearest even as they are stored, as the CPU backend rounds them; they are
// widened exactly into shared memory and attended in f32 as f32 pages are.
#include <cuda_bf16.h>

#include <cfloat>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"

namespace failsafe::cuda {
namespace {

constexpr int kWarps = 16;      // queries per block, sharing each chunk's keys
constexpr int kChunk = 32;      // keys per chunk: one per lane
constexpr int kMaxPerLane = 8;  // head_dim up to 256

// Element i of a page, widened to f32.
__device__ __forceinline__ float PageAt(const float* page, int64_t i, int bf16) {
  if (bf16) return __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(page)[i]);
  return page[i];
}

// Every problem's new keys and values into its pages: block (problem, token).
__global__ void StoreKvKernel(const AttentionProblem* problems) {
  const AttentionProblem& a = problems[blockIdx.x];
  if (!a.new_kv) return;
  const int hd = a.head_dim, bs = a.block_size;
  for (int t = blockIdx.y; t < a.num_tokens; t += gridDim.y) {
    const int p = a.start_pos + t;
    float* page = const_cast<float*>(a.pages[p / bs]);
    const float* src = a.new_kv + static_cast<int64_t>(t) * a.ld_new_kv;
    const int64_t k = static_cast<int64_t>(p % bs) * hd, v = static_cast<int64_t>(bs + p % bs) * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
      if (a.kv_bf16) {
        auto* h = reinterpret_cast<__nv_bfloat16*>(page);
        h[k + d] = __float2bfloat16_rn(src[d]);
        h[v + d] = __float2bfloat16_rn(src[hd + d]);
      } else {
        page[k + d] = src[d];
        page[v + d] = src[hd + d];
      }
    }
  }
}

__device__ __forceinline__ float WarpMax(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float WarpSum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Blocks map to problems through `first_block` (problem i owns blocks
// [first_block[i], first_block[i + 1])).
__global__ void AttendKernel(const AttentionProblem* problems, const int* first_block,
                             int num_problems) {
  extern __shared__ float smem[];
  // Which problem: a binary search over first_block.
  int lo = 0, hi = num_problems - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (first_block[mid] <= static_cast<int>(blockIdx.x)) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  const AttentionProblem& a = problems[lo];
  const int hd = a.head_dim, bs = a.block_size, G = a.group_size;
  if (G == 0) return;  // stores only
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int queries = a.num_tokens * G;
  const int q0 = (static_cast<int>(blockIdx.x) - first_block[lo]) * kWarps;
  const int stride = hd + 1;         // padded rows: lanes read distinct banks
  float* ks = smem;                  // [kChunk][stride]
  float* vs = ks + kChunk * stride;  // [kChunk][stride]
  float* qs = vs + kChunk * stride;  // [kWarps][hd]

  // This warp's query and the keys it attends to.
  const int qi = q0 + warp;
  const bool active = qi < queries;
  const int t = active ? qi / G : 0, j = active ? qi % G : 0;
  const int pos = a.start_pos + t;
  const int first = a.sliding_window > 0 ? max(0, pos - a.sliding_window + 1) : 0;
  if (active) {
    const float* q = a.q + static_cast<int64_t>(t) * a.ldq + static_cast<int64_t>(j) * hd;
    for (int d = lane; d < hd; d += 32) qs[warp * hd + d] = q[d];
  }
  // The block's key range: its first query's first key to its last query's
  // position (queries ascend with their token).
  const int last_q = min(q0 + kWarps, queries) - 1;
  const int block_last = a.start_pos + last_q / G;
  const int p0 = a.start_pos + q0 / G;
  const int block_first = a.sliding_window > 0 ? max(0, p0 - a.sliding_window + 1) : 0;

  float m = -FLT_MAX, l = 0;
  bool any = false;
  float acc[kMaxPerLane];
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) acc[i] = 0;
  for (int c = block_first / kChunk; c * kChunk <= block_last; ++c) {
    __syncthreads();  // the previous chunk is read (and qs written, the first time)
    for (int e = threadIdx.x; e < kChunk * hd; e += blockDim.x) {
      const int key = e / hd, d = e % hd;
      const int p = c * kChunk + key;
      if (p > block_last || p < block_first) continue;
      const float* page = a.pages[p / bs];
      ks[key * stride + d] = PageAt(page, static_cast<int64_t>(p % bs) * hd + d, a.kv_bf16);
      vs[key * stride + d] = PageAt(page, static_cast<int64_t>(bs + p % bs) * hd + d, a.kv_bf16);
    }
    __syncthreads();
    if (!active || c * kChunk > pos || (c + 1) * kChunk <= first) continue;  // not reached
    const int p = c * kChunk + lane;
    const bool valid = p >= first && p <= pos;
    float s = -FLT_MAX;
    if (valid) {
      float dot = 0;
      for (int d = 0; d < hd; ++d) dot = fmaf(qs[warp * hd + d], ks[lane * stride + d], dot);
      s = dot * a.scale;
      if (a.softcap > 0) s = a.softcap * tanhf(s / a.softcap);
    }
    const float cm = WarpMax(s);
    const float m_new = any ? fmaxf(m, cm) : cm;
    const float corr = any ? expf(m - m_new) : 0.0f;
    const float pl = valid ? expf(s - m_new) : 0.0f;
    l = l * corr + WarpSum(pl);
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) acc[i] *= corr;
    for (int key = 0; key < kChunk; ++key) {
      const float w = __shfl_sync(0xffffffffu, pl, key);
#pragma unroll
      for (int i = 0; i < kMaxPerLane; ++i) {
        const int d = lane + 32 * i;
        if (d < hd) acc[i] = fmaf(w, vs[key * stride + d], acc[i]);
      }
    }
    m = m_new;
    any = true;
  }
  if (!active) return;
  float* out = a.out + static_cast<int64_t>(t) * a.ldo + static_cast<int64_t>(j) * hd;
  const float inv = 1.0f / l;
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const int d = lane + 32 * i;
    if (d < hd) out[d] = acc[i] * inv;
  }
}

}  // namespace

void StoreKv(const AttentionProblem* problems, int num_problems, int max_tokens, cudaStream_t s) {
  if (num_problems <= 0 || max_tokens <= 0) return;
  dim3 grid(static_cast<unsigned>(num_problems),
            static_cast<unsigned>(max_tokens < 65535 ? max_tokens : 65535));
  StoreKvKernel<<<grid, 128, 0, s>>>(problems);
  FS_CUDA_CHECK(cudaGetLastError());
}

size_t AttentionSharedBytes(int head_dim) {
  return sizeof(float) * (2 * kChunk * (head_dim + 1) + kWarps * head_dim);
}

int AttentionBlocks(int num_tokens, int group_size) {
  return (num_tokens * group_size + kWarps - 1) / kWarps;
}

void Attend(const AttentionProblem* problems, const int* first_block, int num_problems,
            int total_blocks, int max_head_dim, cudaStream_t s) {
  if (total_blocks <= 0) return;
  FS_CHECK_MSG(max_head_dim <= 32 * kMaxPerLane, "head_dim {} is over {}", max_head_dim,
               32 * kMaxPerLane);
  const size_t shared = AttentionSharedBytes(max_head_dim);
  static size_t raised = 48 << 10;
  if (shared > raised) {
    FS_CUDA_CHECK(cudaFuncSetAttribute(AttendKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(shared)));
    raised = shared;
  }
  AttendKernel<<<total_blocks, kWarps * 32, shared, s>>>(problems, first_block, num_problems);
  FS_CUDA_CHECK(cudaGetLastError());
}

}  // namespace failsafe::cuda
