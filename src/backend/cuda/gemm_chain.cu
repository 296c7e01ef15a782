// Products as the CPU backend's chains (kernels.h: ChainGemm): one thread
// per output column and up to kRows rows, each element one chain of fused
// multiply-adds over its k-values in increasing order. Which thread, block
// or launch computes an element changes nothing, so the results are the
// CPU backend's bit for bit, for any m and n.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"

namespace failsafe::cuda {
namespace {

constexpr int kRows = 4;      // rows per thread
constexpr int kThreads = 64;  // columns per block

__device__ __forceinline__ float WidenAt(const void* w, WType t, int64_t i) {
  switch (t) {
    case WType::kBF16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(w)[i]);
    case WType::kF16:
      return __half2float(static_cast<const __half*>(w)[i]);
    case WType::kF32:
      break;
  }
  return __ldg(static_cast<const float*>(w) + i);
}

// The bf16 chain's step: denormal inputs read as zero, denormal results
// flushed (the CPU's DAZ and FTZ).
__device__ __forceinline__ float FmaFtz(float a, float b, float c) {
#ifdef FAILSAFE_CUDA_EMULATION
  return emu::FmaFtz(a, b, c);
#else
  float d;
  asm("fma.rn.ftz.f32 %0, %1, %2, %3;" : "=f"(d) : "f"(a), "f"(b), "f"(c));
  return d;
#endif
}

__device__ __forceinline__ float RoundBf16(float v) {
  return __bfloat162float(__float2bfloat16_rn(v));
}

__device__ __forceinline__ int64_t ToFixedDevice(float v) {
  if (!(v == v)) v = 0;
  v = v < -16777216.0f ? -16777216.0f : (v > 16777216.0f ? 16777216.0f : v);
  return static_cast<int64_t>(v * 4294967296.0f);
}

template <bool kBf16Chain>
__global__ void ChainKernel(ChainGemm g) {
  FS_KERNEL_PROLOGUE();
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  const int r0 = blockIdx.y * kRows;
  if (c >= g.n) return;
  const int rows = g.m - r0 < kRows ? g.m - r0 : kRows;
  const bool fixed = g.acc != nullptr;
  int64_t sums[kRows] = {};
  for (int item = 0; item < g.items; ++item) {
    const int64_t wrow = item * g.item_stride + static_cast<int64_t>(c) * g.row_stride;
    const float* xr[kRows];
    float acc[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int rr = r < rows ? r0 + r : r0;  // rows past m repeat the first
      xr[r] = g.x + static_cast<int64_t>(rr) * g.ldx + static_cast<int64_t>(item) * g.item_k;
      acc[r] = !fixed && g.accumulate ? g.y[static_cast<int64_t>(rr) * g.ldy + c] : 0.0f;
    }
    const int k = g.item_k;
    if (kBf16Chain) {
      int kk = 0;
      for (; kk + 1 < k; kk += 2) {
        const float w0 = WidenAt(g.w, g.type, wrow + kk), w1 = WidenAt(g.w, g.type, wrow + kk + 1);
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          acc[r] = FmaFtz(RoundBf16(xr[r][kk + 1]), w1, acc[r]);
          acc[r] = FmaFtz(RoundBf16(xr[r][kk]), w0, acc[r]);
        }
      }
      if (kk < k) {  // a lone last k-value, paired with a zero
        const float w0 = WidenAt(g.w, g.type, wrow + kk);
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          acc[r] = FmaFtz(0.0f, 0.0f, acc[r]);
          acc[r] = FmaFtz(RoundBf16(xr[r][kk]), w0, acc[r]);
        }
      }
    } else {
#pragma unroll 4
      for (int kk = 0; kk < k; ++kk) {
        const float w0 = WidenAt(g.w, g.type, wrow + kk);
#pragma unroll
        for (int r = 0; r < kRows; ++r) acc[r] = fmaf(xr[r][kk], w0, acc[r]);
      }
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if (fixed) {
        sums[r] += ToFixedDevice(acc[r]);
      } else if (r < rows) {
        g.y[static_cast<int64_t>(r0 + r) * g.ldy + c] = acc[r];
      }
    }
  }
  if (!fixed) return;
  for (int r = 0; r < rows; ++r) {
    int64_t* d = g.acc + static_cast<int64_t>(r0 + r) * g.ldacc + c;
    *d = static_cast<int64_t>(static_cast<uint64_t>(*d) + static_cast<uint64_t>(sums[r]));
  }
}

template <bool kBf16Chain>
__global__ void ChainNNKernel(const float* x, int64_t ldx, const void* w, WType type, float* y,
                              int64_t ldy, int m, int n, int k, bool accumulate) {
  FS_KERNEL_PROLOGUE();
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  const int r0 = blockIdx.y * kRows;
  if (c >= n) return;
  const int rows = m - r0 < kRows ? m - r0 : kRows;
  float acc[kRows];
  const float* xr[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int rr = r < rows ? r0 + r : r0;
    xr[r] = x + static_cast<int64_t>(rr) * ldx;
    acc[r] = accumulate ? y[static_cast<int64_t>(rr) * ldy + c] : 0.0f;
  }
  if (kBf16Chain) {
    int kk = 0;
    for (; kk + 1 < k; kk += 2) {
      const float w0 = WidenAt(w, type, static_cast<int64_t>(kk) * n + c);
      const float w1 = WidenAt(w, type, static_cast<int64_t>(kk + 1) * n + c);
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        acc[r] = FmaFtz(RoundBf16(xr[r][kk + 1]), w1, acc[r]);
        acc[r] = FmaFtz(RoundBf16(xr[r][kk]), w0, acc[r]);
      }
    }
    if (kk < k) {
      const float w0 = WidenAt(w, type, static_cast<int64_t>(kk) * n + c);
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        acc[r] = FmaFtz(0.0f, 0.0f, acc[r]);
        acc[r] = FmaFtz(RoundBf16(xr[r][kk]), w0, acc[r]);
      }
    }
  } else {
    for (int kk = 0; kk < k; ++kk) {
      const float w0 = WidenAt(w, type, static_cast<int64_t>(kk) * n + c);
#pragma unroll
      for (int r = 0; r < kRows; ++r) acc[r] = fmaf(xr[r][kk], w0, acc[r]);
    }
  }
  for (int r = 0; r < rows; ++r) y[static_cast<int64_t>(r0 + r) * ldy + c] = acc[r];
}

// Few columns of f32 weights (a MoE router: 8 experts): a thread per
// column would leave the GPU idle, each waiting on its own loads. Here a
// block takes one column and up to kFewRows rows; all its threads stage
// chunks of the weight row and of the activations in shared memory, and one
// thread per row runs the row's chain from there.
constexpr int kFewRows = 32;
constexpr int kFewChunk = 256;

__global__ void ChainFewColumnsKernel(const float* x, int64_t ldx, const float* w, float* y,
                                      int64_t ldy, int m, int k, bool accumulate) {
  FS_KERNEL_PROLOGUE();
  __shared__ float ws[kFewChunk];
  __shared__ float xs[kFewRows][kFewChunk + 1];
  const int c = blockIdx.x, r0 = blockIdx.y * kFewRows;
  const int rows = m - r0 < kFewRows ? m - r0 : kFewRows;
  const int t = threadIdx.x;
  float acc = 0;
  if (t < rows && accumulate) acc = y[static_cast<int64_t>(r0 + t) * ldy + c];
  for (int k0 = 0; k0 < k; k0 += kFewChunk) {
    const int len = k - k0 < kFewChunk ? k - k0 : kFewChunk;
    __syncthreads();  // the previous chunk is read
    for (int e = t; e < len; e += blockDim.x) ws[e] = w[static_cast<int64_t>(c) * k + k0 + e];
    for (int e = t; e < rows * len; e += blockDim.x) {
      const int r = e / len, i = e % len;
      xs[r][i] = x[static_cast<int64_t>(r0 + r) * ldx + k0 + i];
    }
    __syncthreads();
    if (t < rows) {
#pragma unroll 8
      for (int i = 0; i < len; ++i) acc = fmaf(xs[t][i], ws[i], acc);
    }
  }
  if (t < rows) y[static_cast<int64_t>(r0 + t) * ldy + c] = acc;
}

dim3 Grid(int m, int n) {
  return dim3(static_cast<unsigned>((n + kThreads - 1) / kThreads),
              static_cast<unsigned>((m + kRows - 1) / kRows));
}

}  // namespace

void RunChainGemm(const ChainGemm& g, cudaStream_t s) {
  if (g.m <= 0 || g.n <= 0) return;
  if (g.type == WType::kF32 && g.items == 1 && !g.acc && g.n <= 32 && g.row_stride == g.item_k) {
    const dim3 grid(static_cast<unsigned>(g.n),
                    static_cast<unsigned>((g.m + kFewRows - 1) / kFewRows));
    FS_CHECK(grid.y <= 65535);
    FS_LAUNCH(grid, 128, 0, s, ChainFewColumnsKernel)
    (g.x, g.ldx, static_cast<const float*>(g.w), g.y, g.ldy, g.m, g.item_k, g.accumulate);
    FS_CUDA_CHECK(cudaGetLastError());
    return;
  }
  FS_CHECK((g.m + kRows - 1) / kRows <= 65535);
  if (g.type == WType::kBF16) {
    FS_LAUNCH(Grid(g.m, g.n), kThreads, 0, s, ChainKernel<true>)(g);
  } else {
    FS_LAUNCH(Grid(g.m, g.n), kThreads, 0, s, ChainKernel<false>)(g);
  }
  FS_CUDA_CHECK(cudaGetLastError());
}

void RunChainGemmNN(const float* x, int64_t ldx, const void* w, WType type, float* y, int64_t ldy,
                    int m, int n, int k, bool accumulate, cudaStream_t s) {
  if (m <= 0 || n <= 0) return;
  FS_CHECK((m + kRows - 1) / kRows <= 65535);
  if (type == WType::kBF16) {
    FS_LAUNCH(Grid(m, n), kThreads, 0, s, ChainNNKernel<true>)
    (x, ldx, w, type, y, ldy, m, n, k, accumulate);
  } else {
    FS_LAUNCH(Grid(m, n), kThreads, 0, s, ChainNNKernel<false>)
    (x, ldx, w, type, y, ldy, m, n, k, accumulate);
  }
  FS_CUDA_CHECK(cudaGetLastError());
}

}  // namespace failsafe::cuda
