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
// With segments (GpuAttention::kSegments: kAttentionSegment keys at fixed
// positions, [512 s, 512 s + 512)), each query's online softmax starts
// afresh in each segment and the segments' states (maximum, sum, weighted
// values) are merged in increasing order (MergeInto). A block may then take
// one segment of a problem's keys (AttentionProblem::split: decode and other
// problems of a single block over long contexts, which one block would walk
// alone) and leave each query's state in `states`, merged by
// AttendCombineKernel afterwards with the same MergeInto in the same order:
// the same bits whether a problem's segments were split over blocks or not.
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

constexpr int kWarps = 16;        // queries per block, sharing each chunk's keys
constexpr int kChunk = 32;        // keys per chunk: one per lane
constexpr int kMaxPerLane = 8;    // head_dim up to 256
constexpr int kCombineWarps = 4;  // AttendCombineKernel's warps per block
static_assert(kAttentionSegment % kChunk == 0, "a segment is whole chunks");

// Element i of a page, widened to f32.
__device__ __forceinline__ float PageAt(const float* page, int64_t i, int bf16) {
  if (bf16) return __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(page)[i]);
  return page[i];
}

// Every problem's new keys and values into its pages: block (problem, token).
__global__ void StoreKvKernel(const AttentionProblem* problems) {
  FS_KERNEL_PROLOGUE();
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
// [first_block[i], first_block[i + 1])): this block's, by binary search.
__device__ __forceinline__ int ProblemOfBlock(const int* first_block, int num_problems) {
  int lo = 0, hi = num_problems - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (first_block[mid] <= static_cast<int>(blockIdx.x)) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// A segment's state joins the total of the segments before it (in
// increasing order): the first is taken as it is, later ones rescaled to
// the larger maximum. Products and sums rounded one by one (no contraction
// the compiler might choose differently in the two kernels that merge).
__device__ __forceinline__ void MergeInto(float& tm, float& tl, float (&tacc)[kMaxPerLane],
                                          bool& tany, float m, float l,
                                          const float (&acc)[kMaxPerLane]) {
  if (!tany) {
    tm = m;
    tl = l;
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) tacc[i] = acc[i];
    tany = true;
    return;
  }
  const float mx = fmaxf(tm, m);
  const float ct = expf(tm - mx), cs = expf(m - mx);
  tl = __fmaf_rn(tl, ct, __fmul_rn(l, cs));
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) tacc[i] = __fmaf_rn(tacc[i], ct, __fmul_rn(acc[i], cs));
  tm = mx;
}

// Query (token t, query head j)'s result: the weighted values over the sum.
__device__ __forceinline__ void WriteOutput(const AttentionProblem& a, int t, int j, int lane,
                                            float l, const float (&acc)[kMaxPerLane]) {
  float* out = a.out + static_cast<int64_t>(t) * a.ldo + static_cast<int64_t>(j) * a.head_dim;
  const float inv = 1.0f / l;
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const int d = lane + 32 * i;
    if (d < a.head_dim) out[d] = acc[i] * inv;
  }
}

// Blocks map to problems through `first_block` (problem i owns blocks
// [first_block[i], first_block[i + 1])). `segment_keys`: 0, or
// kAttentionSegment (segments merged in order; split problems' blocks take
// one segment each and leave their queries' states in `states`).
__global__ void __launch_bounds__(kWarps * 32)
    AttendKernel(const AttentionProblem* problems, const int* first_block, int num_problems,
                 int segment_keys, float* states) {
  FS_KERNEL_PROLOGUE();
  FS_DYNAMIC_SHARED(float, smem);
  const int lo = ProblemOfBlock(first_block, num_problems);
  const AttentionProblem& a = problems[lo];
  const int hd = a.head_dim, bs = a.block_size, G = a.group_size;
  if (G == 0) return;  // stores only
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int queries = a.num_tokens * G;
  const int local = static_cast<int>(blockIdx.x) - first_block[lo];
  const int split = a.split;  // segments over blocks, or 0
  const int q0 = (split > 0 ? local / split : local) * kWarps;
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
  int block_first = a.sliding_window > 0 ? max(0, p0 - a.sliding_window + 1) : 0;
  // A split problem's block: its segment's keys only.
  int block_end = block_last;
  const int seg_local = split > 0 ? local % split : 0;
  if (split > 0) {
    const int seg = a.seg_first + seg_local;
    block_first = max(block_first, seg * segment_keys);
    block_end = min(block_last, (seg + 1) * segment_keys - 1);
  }
  const int seg_chunks = segment_keys / kChunk;  // 0: no segments

  float m = -FLT_MAX, l = 0;  // this segment's
  bool any = false;
  float acc[kMaxPerLane];
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) acc[i] = 0;
  float tm = -FLT_MAX, tl = 0;  // the segments' before it, merged
  bool tany = false;
  float tacc[kMaxPerLane];
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) tacc[i] = 0;
  for (int c = block_first / kChunk; c * kChunk <= block_end; ++c) {
    if (seg_chunks > 0 && c % seg_chunks == 0 && any) {  // a segment ends
      MergeInto(tm, tl, tacc, tany, m, l, acc);
      m = -FLT_MAX;
      l = 0;
      any = false;
#pragma unroll
      for (int i = 0; i < kMaxPerLane; ++i) acc[i] = 0;
    }
    __syncthreads();  // the previous chunk is read (and qs written, the first time)
    for (int e = threadIdx.x; e < kChunk * hd; e += blockDim.x) {
      const int key = e / hd, d = e % hd;
      const int p = c * kChunk + key;
      if (p > block_end || p < block_first) {
        // Zeros, not what a chunk before left: a lane without a key adds
        // its weight of zero times these, which must be finite.
        ks[key * stride + d] = 0.0f;
        vs[key * stride + d] = 0.0f;
        continue;
      }
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
  if (split > 0) {  // the segment's state, for AttendCombineKernel
    float* st = states + a.state0 + (static_cast<int64_t>(qi) * split + seg_local) * (hd + 2);
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      const int d = lane + 32 * i;
      if (d < hd) st[d] = acc[i];
    }
    if (lane == 0) {
      st[hd] = m;
      st[hd + 1] = any ? l : 0.0f;
    }
    return;
  }
  if (seg_chunks > 0) {  // the last segment joins the total, which is the result
    if (any) MergeInto(tm, tl, tacc, tany, m, l, acc);
    l = tl;
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) acc[i] = tacc[i];
  }
  WriteOutput(a, t, j, lane, l, acc);
}

// Split problems' queries, a warp each (warp w of the grid: problem i's
// query w - first_query[i] for first_query[i] <= w < first_query[i + 1]):
// their segments' states merged in increasing order, as AttendKernel merges
// them in a block.
__global__ void AttendCombineKernel(const AttentionProblem* problems, const int* first_query,
                                    int num_problems, int total_queries, const float* states) {
  FS_KERNEL_PROLOGUE();
  const int w = static_cast<int>(blockIdx.x) * kCombineWarps + static_cast<int>(threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (w >= total_queries) return;
  int lo = 0, hi = num_problems - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (first_query[mid] <= w) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  const AttentionProblem& a = problems[lo];
  const int hd = a.head_dim, G = a.group_size, qi = w - first_query[lo];
  const int t = qi / G, j = qi % G;
  float tm = -FLT_MAX, tl = 0;
  bool tany = false;
  float tacc[kMaxPerLane], acc[kMaxPerLane];
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) tacc[i] = acc[i] = 0;
  for (int s = 0; s < a.split; ++s) {
    const float* st = states + a.state0 + (static_cast<int64_t>(qi) * a.split + s) * (hd + 2);
    const float l = st[hd + 1];
    if (l == 0.0f) continue;  // the query reaches none of the segment's keys
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      const int d = lane + 32 * i;
      acc[i] = d < hd ? st[d] : 0.0f;
    }
    MergeInto(tm, tl, tacc, tany, st[hd], l, acc);
  }
  WriteOutput(a, t, j, lane, tl, tacc);
}

// ---------------------------------------------------------------------------
// Attention on tensor cores (GpuAttention::kTensor). A block of kTcWarps
// warps takes 64 query rows of one problem (row r: token r / G, query head
// r % G), 16 per warp, over chunks of kTcChunk keys at fixed positions
// ([64 c, 64 c + 64)), each chunk's keys and values loaded once into shared
// memory as bf16 for all its warps. Per chunk a warp computes its rows'
// scores by mma.sync m16n8k16 (queries and keys in bf16, f32 sums), masks
// and scales them, runs the online softmax per row in f32, rounds the
// weights to bf16 and adds their products with the values into f32
// accumulators by mma.sync again. A row's scores, maximum, weights and
// sums depend only on its own query and keys (an mma element is a function
// of its own row and column; a quad's reductions run in a fixed order), a
// chunk the row does not reach leaves its state as it was (weights of
// exact zeros, no rescaling), and keys outside the block's range are zeros
// in shared memory: so a query's result is the same whatever the block, its
// prefill chunk or the batch, as on CUDA cores.
//
// mma.sync m16n8k16 fragments (lane = 4 g + q): A (16 x 16, row major)
// a0 = (g, 2q..2q+1), a1 = (g + 8, 2q..), a2 = (g, 8 + 2q..), a3 = (g + 8,
// 8 + 2q..); B (16 x 8, k x n) b0 = (2q..2q+1, g), b1 = (8 + 2q.., g); C
// (16 x 8) c0, c1 = (g, 2q..2q+1), c2, c3 = (g + 8, 2q..2q+1). Two 16-bit
// values in a register: the lower index in the lower half.

constexpr int kTcWarps = 4;
constexpr int kTcRows = 16 * kTcWarps;  // query rows of a block
constexpr int kTcChunk = 64;            // keys of a chunk

__device__ __forceinline__ void MmaBf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                        uint32_t b1) {
#ifdef FAILSAFE_CUDA_EMULATION
  emu::Mma16816(__LINE__, d, a, b0, b1, true);
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// Two bf16 values in a register, `lo` in the lower half.
__device__ __forceinline__ uint32_t Pack(__nv_bfloat16 lo, __nv_bfloat16 hi) {
  return static_cast<uint32_t>(__bfloat16_as_ushort(lo)) |
         (static_cast<uint32_t>(__bfloat16_as_ushort(hi)) << 16);
}
__device__ __forceinline__ uint32_t Load32(const __nv_bfloat16* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

// Shared-memory rows of HD bf16 values and 8 more (rows 16 bytes apart in
// bank order).
__host__ __device__ constexpr int TcPitch(int hd) { return hd + 8; }

template <int HD>
__global__ void __launch_bounds__(kTcWarps * 32)
    AttendTcKernel(const AttentionProblem* problems, const int* first_block, int num_problems) {
  FS_KERNEL_PROLOGUE();
  static_assert(HD % 16 == 0 && HD <= 128);
  constexpr int P = TcPitch(HD), KS = HD / 16, DT = HD / 8;
  FS_DYNAMIC_SHARED(unsigned char, tc_smem);
  auto* ks = reinterpret_cast<__nv_bfloat16*>(tc_smem);  // [kTcChunk][P]
  __nv_bfloat16* vs = ks + kTcChunk * P;                 // [kTcChunk][P]
  __nv_bfloat16* qs = vs + kTcChunk * P;                 // [kTcRows][P]
  const int lo = ProblemOfBlock(first_block, num_problems);
  const AttentionProblem& a = problems[lo];
  const int bs = a.block_size, G = a.group_size;
  if (G == 0) return;  // stores only
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
  const int queries = a.num_tokens * G;
  const int r0 = (static_cast<int>(blockIdx.x) - first_block[lo]) * kTcRows;

  // The block's queries, rounded to bf16 (rows past the last: zeros).
  for (int e = threadIdx.x; e < kTcRows * HD; e += blockDim.x) {
    const int r = e / HD, d = e % HD, qi = r0 + r;
    float v = 0.0f;
    if (qi < queries) {
      v = a.q[static_cast<int64_t>(qi / G) * a.ldq + static_cast<int64_t>(qi % G) * HD + d];
    }
    qs[r * P + d] = __float2bfloat16_rn(v);
  }
  // This lane's rows: g and g + 8 of its warp's 16.
  int pos[2], first[2];
  bool live[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int qi = r0 + warp * 16 + g + 8 * h;
    live[h] = qi < queries;
    pos[h] = a.start_pos + (live[h] ? qi / G : 0);
    first[h] = a.sliding_window > 0 ? max(0, pos[h] - a.sliding_window + 1) : 0;
  }
  const int last_q = min(r0 + kTcRows, queries) - 1;
  const int block_last = a.start_pos + last_q / G;
  const int p0 = a.start_pos + r0 / G;
  const int block_first = a.sliding_window > 0 ? max(0, p0 - a.sliding_window + 1) : 0;
  __syncthreads();
  uint32_t qf[KS][4];
  {
    const __nv_bfloat16* qw = qs + warp * 16 * P;
#pragma unroll
    for (int k = 0; k < KS; ++k) {
      qf[k][0] = Load32(qw + g * P + 16 * k + 2 * q);
      qf[k][1] = Load32(qw + (g + 8) * P + 16 * k + 2 * q);
      qf[k][2] = Load32(qw + g * P + 16 * k + 8 + 2 * q);
      qf[k][3] = Load32(qw + (g + 8) * P + 16 * k + 8 + 2 * q);
    }
  }
  float o[DT][4];
#pragma unroll
  for (int t = 0; t < DT; ++t) o[t][0] = o[t][1] = o[t][2] = o[t][3] = 0.0f;
  float m[2] = {0.0f, 0.0f}, l[2] = {0.0f, 0.0f};
  bool any[2] = {false, false};
  const __nv_bfloat16 zero = __float2bfloat16_rn(0.0f);
  for (int c = block_first / kTcChunk; c * kTcChunk <= block_last; ++c) {
    __syncthreads();  // the previous chunk is read (and the queries, the first time)
    for (int e = threadIdx.x; e < kTcChunk * HD / 2; e += blockDim.x) {
      const int key = e / (HD / 2), d = 2 * (e % (HD / 2));
      const int p = c * kTcChunk + key;
      __nv_bfloat162 kv2[2] = {{zero, zero}, {zero, zero}};
      if (p >= block_first && p <= block_last) {
        const float* page = a.pages[p / bs];
        const int64_t at[2] = {static_cast<int64_t>(p % bs) * HD + d,
                               static_cast<int64_t>(bs + p % bs) * HD + d};
#pragma unroll
        for (int part = 0; part < 2; ++part) {
          if (a.kv_bf16) {
            kv2[part] = *reinterpret_cast<const __nv_bfloat162*>(
                reinterpret_cast<const __nv_bfloat16*>(page) + at[part]);
          } else {
            kv2[part] = __floats2bfloat162_rn(page[at[part]], page[at[part] + 1]);
          }
        }
      }
      *reinterpret_cast<__nv_bfloat162*>(ks + key * P + d) = kv2[0];
      *reinterpret_cast<__nv_bfloat162*>(vs + key * P + d) = kv2[1];
    }
    __syncthreads();
    const int c0 = c * kTcChunk, c1 = c0 + kTcChunk - 1;
    bool reach[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) reach[h] = live[h] && first[h] <= c1 && pos[h] >= c0;
    if (!__any_sync(0xffffffffu, reach[0] || reach[1])) continue;  // no row of the warp
    // Scores: keys nt * 8 + 2q, + 1 of the chunk in s[nt][0..1] (row g) and
    // s[nt][2..3] (row g + 8).
    float s[8][4];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
      const __nv_bfloat16* kr = ks + (nt * 8 + g) * P + 2 * q;
#pragma unroll
      for (int k = 0; k < KS; ++k)
        MmaBf16(s[nt], qf[k], Load32(kr + 16 * k), Load32(kr + 16 * k + 8));
    }
    float cmax[2] = {-FLT_MAX, -FLT_MAX};
    uint32_t valid[2] = {0, 0};
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int h = e / 2, p = c0 + nt * 8 + 2 * q + (e & 1);
        const bool ok = reach[h] && p >= first[h] && p <= pos[h];
        float v = s[nt][e] * a.scale;
        if (a.softcap > 0) v = a.softcap * tanhf(v / a.softcap);
        s[nt][e] = v;
        if (ok) {
          cmax[h] = fmaxf(cmax[h], v);
          valid[h] |= 1u << (nt * 4 + e);
        }
      }
    }
    float corr[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      // The row's maximum over the quad's four lanes (the same row).
      cmax[h] = fmaxf(cmax[h], __shfl_xor_sync(0xffffffffu, cmax[h], 1));
      cmax[h] = fmaxf(cmax[h], __shfl_xor_sync(0xffffffffu, cmax[h], 2));
      int has = valid[h] != 0;
      has |= __shfl_xor_sync(0xffffffffu, has, 1);
      has |= __shfl_xor_sync(0xffffffffu, has, 2);
      reach[h] = has != 0;  // from here: the row has a key in this chunk
      const float m_new = !reach[h] ? m[h] : (any[h] ? fmaxf(m[h], cmax[h]) : cmax[h]);
      corr[h] = !reach[h] ? 1.0f : (any[h] ? expf(m[h] - m_new) : 0.0f);
      m[h] = m_new;
    }
    // Weights, rounded to bf16 (their sum of the rounded values), then the
    // row's sum over the quad in a fixed order.
    float sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int h = e / 2;
        const bool ok = (valid[h] >> (nt * 4 + e)) & 1;
        const float w = ok ? __bfloat162float(__float2bfloat16_rn(expf(s[nt][e] - m[h]))) : 0.0f;
        s[nt][e] = w;
        sum[h] += w;
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      sum[h] += __shfl_xor_sync(0xffffffffu, sum[h], 1);
      sum[h] += __shfl_xor_sync(0xffffffffu, sum[h], 2);
      if (reach[h]) {
        l[h] = l[h] * corr[h] + sum[h];
        any[h] = true;
      }
    }
#pragma unroll
    for (int t = 0; t < DT; ++t) {
      o[t][0] *= corr[0];
      o[t][1] *= corr[0];
      o[t][2] *= corr[1];
      o[t][3] *= corr[1];
    }
    // Weighted values: 16 keys a step (the weights of n-tiles 2 kk and
    // 2 kk + 1 are the A fragment as they lie).
#pragma unroll
    for (int kk = 0; kk < kTcChunk / 16; ++kk) {
      uint32_t pa[4];
      pa[0] = Pack(__float2bfloat16_rn(s[2 * kk][0]), __float2bfloat16_rn(s[2 * kk][1]));
      pa[1] = Pack(__float2bfloat16_rn(s[2 * kk][2]), __float2bfloat16_rn(s[2 * kk][3]));
      pa[2] = Pack(__float2bfloat16_rn(s[2 * kk + 1][0]), __float2bfloat16_rn(s[2 * kk + 1][1]));
      pa[3] = Pack(__float2bfloat16_rn(s[2 * kk + 1][2]), __float2bfloat16_rn(s[2 * kk + 1][3]));
      const __nv_bfloat16* v0 = vs + (16 * kk + 2 * q) * P + g;
#pragma unroll
      for (int t = 0; t < DT; ++t) {
        const __nv_bfloat16* v = v0 + 8 * t;
        const uint32_t b0 = Pack(v[0], v[P]);
        const uint32_t b1 = Pack(v[8 * P], v[9 * P]);
        MmaBf16(o[t], pa, b0, b1);
      }
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (!live[h]) continue;
    const int qi = r0 + warp * 16 + g + 8 * h;
    float* out = a.out + static_cast<int64_t>(qi / G) * a.ldo + static_cast<int64_t>(qi % G) * HD;
    const float inv = 1.0f / l[h];
#pragma unroll
    for (int t = 0; t < DT; ++t) {
      out[8 * t + 2 * q] = o[t][2 * h] * inv;
      out[8 * t + 2 * q + 1] = o[t][2 * h + 1] * inv;
    }
  }
}

template <int HD>
void LaunchTc(const AttentionProblem* problems, const int* first_block, int num_problems,
              int total_blocks, cudaStream_t s) {
  const size_t shared = AttentionTcSharedBytes(HD);
  static bool raised = false;
  if (!raised && shared > (48 << 10)) {
    FS_CUDA_CHECK(cudaFuncSetAttribute(
        AttendTcKernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared)));
  }
  raised = true;
  FS_LAUNCH(total_blocks, kTcWarps * 32, shared, s, AttendTcKernel<HD>)
  (problems, first_block, num_problems);
  FS_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void StoreKv(const AttentionProblem* problems, int num_problems, int max_tokens, cudaStream_t s) {
  if (num_problems <= 0 || max_tokens <= 0) return;
  dim3 grid(static_cast<unsigned>(num_problems),
            static_cast<unsigned>(max_tokens < 65535 ? max_tokens : 65535));
  FS_LAUNCH(grid, 128, 0, s, StoreKvKernel)(problems);
  FS_CUDA_CHECK(cudaGetLastError());
}

size_t AttentionSharedBytes(int head_dim) {
  return sizeof(float) * (2 * kChunk * (head_dim + 1) + kWarps * head_dim);
}

int AttentionBlocks(int num_tokens, int group_size) {
  return (num_tokens * group_size + kWarps - 1) / kWarps;
}

void Attend(const AttentionProblem* problems, const int* first_block, int num_problems,
            int total_blocks, int max_head_dim, bool segments, float* states, cudaStream_t s) {
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
  FS_LAUNCH(total_blocks, kWarps * 32, shared, s, AttendKernel)
  (problems, first_block, num_problems, segments ? kAttentionSegment : 0, states);
  FS_CUDA_CHECK(cudaGetLastError());
}

void AttendCombine(const AttentionProblem* problems, const int* first_query, int num_problems,
                   int total_queries, const float* states, cudaStream_t s) {
  if (total_queries <= 0) return;
  const int blocks = (total_queries + kCombineWarps - 1) / kCombineWarps;
  FS_LAUNCH(blocks, kCombineWarps * 32, 0, s, AttendCombineKernel)
  (problems, first_query, num_problems, total_queries, states);
  FS_CUDA_CHECK(cudaGetLastError());
}

bool AttentionTcSupported(int head_dim) {
  return head_dim > 0 && head_dim <= 128 && head_dim % 16 == 0;
}

size_t AttentionTcSharedBytes(int head_dim) {
  return sizeof(__nv_bfloat16) * TcPitch(head_dim) * (2 * kTcChunk + kTcRows);
}

int AttentionTcBlocks(int num_tokens, int group_size) {
  return (num_tokens * group_size + kTcRows - 1) / kTcRows;
}

void AttendTc(const AttentionProblem* problems, const int* first_block, int num_problems,
              int total_blocks, int head_dim, cudaStream_t s) {
  if (total_blocks <= 0) return;
  FS_CHECK_MSG(AttentionTcSupported(head_dim),
               "tensor-core attention takes head dims of 16 to 128 in steps of 16, not {}",
               head_dim);
  using Launch = void (*)(const AttentionProblem*, const int*, int, int, cudaStream_t);
  static constexpr Launch kLaunch[] = {LaunchTc<16>, LaunchTc<32>, LaunchTc<48>,  LaunchTc<64>,
                                       LaunchTc<80>, LaunchTc<96>, LaunchTc<112>, LaunchTc<128>};
  kLaunch[head_dim / 16 - 1](problems, first_block, num_problems, total_blocks, s);
}

}  // namespace failsafe::cuda
