// The CUDA backend's kernels that are not products or attention: gathers
// and scatters of rows, the exact fixed-point adds, RMS norm, RoPE, SiLU,
// MoE routing and activation rounding.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <atomic>
#include <cfloat>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"

namespace failsafe::cuda {
namespace {

constexpr int kThreads = 256;

int Blocks(int64_t n, int per_block = kThreads) {
  const int64_t b = (n + per_block - 1) / per_block;
  return static_cast<int>(b < 1 ? 1 : (b > (1 << 30) ? (1 << 30) : b));
}

// common/fixed_point.h, on the device.
__device__ __forceinline__ int64_t ToFixedDevice(float v) {
  if (!(v == v)) v = 0;
  v = v < -16777216.0f ? -16777216.0f : (v > 16777216.0f ? 16777216.0f : v);
  return static_cast<int64_t>(v * 4294967296.0f);
}
__device__ __forceinline__ float FromFixedDevice(int64_t s) {
  return static_cast<float>(static_cast<double>(s) / 4294967296.0);
}
__device__ __forceinline__ int64_t AddFixedDevice(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
}

__device__ __forceinline__ float Widen(const void* w, WType t, int64_t i) {
  switch (t) {
    case WType::kBF16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(w)[i]);
    case WType::kF16:
      return __half2float(static_cast<const __half*>(w)[i]);
    case WType::kF32:
      break;
  }
  return static_cast<const float*>(w)[i];
}

// dst[at] = v rounded to nearest even as `type` (bf16 or f16).
__device__ __forceinline__ void StoreRounded(void* dst, WType type, int64_t at, float v) {
  if (type == WType::kBF16) {
    static_cast<__nv_bfloat16*>(dst)[at] = __float2bfloat16_rn(v);
  } else {
    static_cast<__half*>(dst)[at] = __float2half_rn(v);
  }
}

__global__ void GatherWeightRowsKernel(const void* w, WType type, int cols, const int32_t* src_rows,
                                       const int32_t* dst_rows, int n, float* out, int64_t ldo) {
  FS_KERNEL_PROLOGUE();
  for (int i = blockIdx.y; i < n; i += gridDim.y) {
    const int64_t src = static_cast<int64_t>(src_rows[i]) * cols;
    float* o = out + static_cast<int64_t>(dst_rows[i]) * ldo;
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < cols; c += gridDim.x * blockDim.x)
      o[c] = Widen(w, type, src + c);
  }
}

__global__ void GatherRowsKernel(const float* src, int64_t lds, const int32_t* rows, int n,
                                 int cols, float* dst, int64_t ldd) {
  FS_KERNEL_PROLOGUE();
  for (int i = blockIdx.y; i < n; i += gridDim.y) {
    const float* s = src + static_cast<int64_t>(rows[i]) * lds;
    float* d = dst + static_cast<int64_t>(i) * ldd;
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < cols; c += gridDim.x * blockDim.x)
      d[c] = s[c];
  }
}

__global__ void ScatterAddFixedKernel(const int64_t* src, int64_t lds, const int32_t* rows, int n,
                                      int cols, int64_t* dst, int64_t ldd) {
  FS_KERNEL_PROLOGUE();
  for (int i = blockIdx.y; i < n; i += gridDim.y) {
    const int64_t* s = src + static_cast<int64_t>(i) * lds;
    int64_t* d = dst + static_cast<int64_t>(rows[i]) * ldd;
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < cols; c += gridDim.x * blockDim.x)
      d[c] = AddFixedDevice(d[c], s[c]);
  }
}

__global__ void AddFixedToKernel(const int64_t* acc, float* x, int64_t n) {
  FS_KERNEL_PROLOGUE();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] += FromFixedDevice(acc[i]);
}

// Up to kMaxSumSources pointers, passed by value as the kernel's argument.
template <typename T>
struct SumSources {
  const T* p[kMaxSumSources];
};

// Fixed-point sums wrap (common/fixed_point.h: AddFixed); floats are added
// with each sum rounded, in the sources' order.
__device__ __forceinline__ int64_t AddSum(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<unsigned long long>(a) +
                              static_cast<unsigned long long>(b));
}
__device__ __forceinline__ float AddSum(float a, float b) { return __fadd_rn(a, b); }

template <typename T>
__global__ void SumArraysKernel(SumSources<T> src, int n, int64_t count, T* out) {
  FS_KERNEL_PROLOGUE();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    T acc = src.p[0][i];
    for (int m = 1; m < n; ++m) acc = AddSum(acc, src.p[m][i]);
    out[i] = acc;
  }
}

template <typename T>
void LaunchSumArrays(const T* const* srcs, int n, size_t count, T* out, cudaStream_t s) {
  if (count == 0 || n <= 0) return;
  FS_CHECK_MSG(n <= kMaxSumSources, "{} arrays to sum, at most {}", n, kMaxSumSources);
  SumSources<T> src{};
  for (int m = 0; m < n; ++m) src.p[m] = srcs[m];
  const int64_t c = static_cast<int64_t>(count);
  FS_LAUNCH(Blocks(c), kThreads, 0, s, SumArraysKernel<T>)(src, n, c, out);
  FS_CUDA_CHECK(cudaGetLastError());
}

__global__ void ScaleRowsKernel(float* x, int64_t ldx, const float* scale, int rows, int cols) {
  FS_KERNEL_PROLOGUE();
  for (int r = blockIdx.y; r < rows; r += gridDim.y) {
    float* a = x + static_cast<int64_t>(r) * ldx;
    const float f = scale[r];
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < cols; c += gridDim.x * blockDim.x)
      a[c] *= f;
  }
}

__global__ void SoftcapKernel(float* x, int64_t n, float cap) {
  FS_KERNEL_PROLOGUE();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] = cap * tanhf(x[i] / cap);
}

__global__ void AddBiasKernel(float* x, int64_t ldx, const float* bias, int rows, int cols) {
  FS_KERNEL_PROLOGUE();
  for (int r = blockIdx.y; r < rows; r += gridDim.y) {
    float* a = x + static_cast<int64_t>(r) * ldx;
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < cols; c += gridDim.x * blockDim.x)
      a[c] += bias[c];
  }
}

// One block per row: the sum of squares in a fixed tree (the same for every
// row whatever the launch), then y = x * inv * weight as the CPU backend.
// kAddFixed: first x += FromFixed(acc) and acc = 0, each thread on the
// elements it then reads (AddFixedTo's sums, so the same bits).
template <bool kAddFixed>
__global__ void RmsNormKernel(const float* x, int64_t ldx, const float* weight, float* y,
                              int64_t ldy, int dim, float eps, int64_t* acc, void* y16,
                              WType type16) {
  FS_KERNEL_PROLOGUE();
  const int r = blockIdx.x;
  const float* xr = x + static_cast<int64_t>(r) * ldx;
  float* yr = y + static_cast<int64_t>(r) * ldy;
  float s = 0;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    if constexpr (kAddFixed) {
      int64_t* ar = acc + static_cast<int64_t>(r) * dim;
      const float v = xr[i] + FromFixedDevice(ar[i]);
      const_cast<float*>(xr)[i] = v;  // x is the caller's to write (AddFixedToNorm)
      ar[i] = 0;
    }
    s = fmaf(xr[i], xr[i], s);
  }
  __shared__ float part[kThreads / 32];
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = s;
  __syncthreads();
  if (threadIdx.x < 32) {
    s = threadIdx.x < kThreads / 32 ? part[threadIdx.x] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (threadIdx.x == 0) part[0] = s;
  }
  __syncthreads();
  const float ms = part[0] / static_cast<float>(dim);
  const float inv = 1.0f / sqrtf(ms + eps);
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    const float v = xr[i] * inv * weight[i];
    yr[i] = v;
    if (y16) StoreRounded(y16, type16, static_cast<int64_t>(r) * dim + i, v);
  }
}

// Block (t, j): token t of tensor j (x, then x2 where blockIdx.y is 1).
__global__ void RopeKernel(float* x, int64_t ldx, int64_t head_stride, int heads, float* x2,
                           int64_t ldx2, int64_t head_stride2, int heads2, const int32_t* positions,
                           int head_dim, const float* cos_sin) {
  FS_KERNEL_PROLOGUE();
  if (blockIdx.y == 1) {
    x = x2;
    ldx = ldx2;
    head_stride = head_stride2;
    heads = heads2;
  }
  const int t = blockIdx.x;
  const int half = head_dim / 2;
  const float* cs = cos_sin + static_cast<int64_t>(positions[t]) * head_dim;
  const float* sn = cs + half;
  for (int e = threadIdx.x; e < heads * half; e += blockDim.x) {
    const int h = e / half, i = e % half;
    float* v = x + static_cast<int64_t>(t) * ldx + static_cast<int64_t>(h) * head_stride;
    const float a = v[i], b = v[i + half];
    v[i] = a * cs[i] - b * sn[i];
    v[i + half] = b * cs[i] + a * sn[i];
  }
}

struct Silu {
  __device__ float operator()(float g) const { return g / (1.0f + expf(-g)); }
};
struct GeluTanh {  // gelu's tanh approximation, as PyTorch's
  __device__ float operator()(float g) const {
    return 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g)));
  }
};

// out[r, j * width + i] = act(gate) * up over each shard j's gate and up columns.
template <typename Act>
__global__ void GatedKernel(const float* gu, int64_t ld_in, float* out, int64_t ld_out, int rows,
                            int width, int shards) {
  FS_KERNEL_PROLOGUE();
  const int n = width * shards;
  const Act act;
  for (int r = blockIdx.y; r < rows; r += gridDim.y) {
    const float* in = gu + static_cast<int64_t>(r) * ld_in;
    float* o = out + static_cast<int64_t>(r) * ld_out;
    for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < n; e += gridDim.x * blockDim.x) {
      const int j = e / width, i = e % width;
      o[e] = act(in[2 * j * width + i]) * in[(2 * j + 1) * width + i];
    }
  }
}

// One thread per token: softmax over the experts, the k largest (lowest id
// on ties), renormalised or not, as the CPU backend.
__global__ void MoeGateKernel(const float* logits, int tokens, int experts, int k, bool renormalize,
                              int32_t* ids, float* weights) {
  FS_KERNEL_PROLOGUE();
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= tokens) return;
  const float* l = logits + static_cast<int64_t>(t) * experts;
  float mx = -FLT_MAX;
  for (int e = 0; e < experts; ++e) mx = fmaxf(mx, l[e]);
  float sum = 0;
  for (int e = 0; e < experts; ++e) sum += expf(l[e] - mx);
  // Selection by repeated maximum over probabilities (k is small:
  // kMoeMaxK at most, which MoeGate checks).
  constexpr int kMaxK = kMoeMaxK;
  int chosen[kMaxK];
  float p[kMaxK];
  float top = 0;
  for (int i = 0; i < k && i < kMaxK; ++i) {
    int best = -1;
    float bp = -1;
    for (int e = 0; e < experts; ++e) {
      bool taken = false;
      for (int j = 0; j < i; ++j) taken |= chosen[j] == e;
      if (taken) continue;
      const float pe = expf(l[e] - mx) / sum;
      // The first untaken expert always (a row of NaN logits still routes
      // to real experts: an id of -1 would index out of the weights).
      if (pe > bp || best < 0) {
        bp = pe;
        best = e;
      }
    }
    chosen[i] = best;
    p[i] = bp;
    top += bp;
  }
  for (int i = 0; i < k && i < kMaxK; ++i) {
    ids[static_cast<int64_t>(t) * k + i] = chosen[i];
    weights[static_cast<int64_t>(t) * k + i] = renormalize ? p[i] / top : p[i];
  }
}

__global__ void RoundActivationsKernel(const float* x, int64_t ldx, int m, int k, WType type,
                                       void* dst) {
  FS_KERNEL_PROLOGUE();
  for (int r = blockIdx.y; r < m; r += gridDim.y) {
    const float* xr = x + static_cast<int64_t>(r) * ldx;
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < k; c += gridDim.x * blockDim.x) {
      StoreRounded(dst, type, static_cast<int64_t>(r) * k + c, xr[c]);
    }
  }
}

__global__ void AddItemsFixedKernel(const float* parts, int items, int64_t item_stride, int m,
                                    int n, int64_t* acc, int64_t ldacc) {
  FS_KERNEL_PROLOGUE();
  const int64_t total = static_cast<int64_t>(m) * n;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = e / n, c = e % n;
    int64_t s = 0;
    for (int i = 0; i < items; ++i)
      s = AddFixedDevice(s, ToFixedDevice(parts[i * item_stride + e]));
    int64_t* d = acc + r * ldacc + c;
    *d = AddFixedDevice(*d, s);
  }
}

// Blocks over a row's columns, rows over grid.y (kernels stride by
// gridDim.y past its limit).
__global__ void FillRandomKernel(void* dst, WType type, int64_t n, uint64_t seed) {
  FS_KERNEL_PROLOGUE();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint64_t z = seed + 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(i + 1);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    StoreRounded(dst, type, i, static_cast<float>(z >> 40) * (2.0f / 16777216.0f) - 1.0f);
  }
}

__global__ void CountMismatchesKernel(const float* a, const float* b, int rows, int n, int64_t ld,
                                      int batch, int64_t stride, int* mismatches) {
  FS_KERNEL_PROLOGUE();
  const int64_t per = static_cast<int64_t>(rows) * n, total = per * batch;
  int count = 0;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t bi = e / per, r = (e % per) / n, c = e % n;
    const int64_t at = bi * stride + r * ld + c;
    count += __float_as_uint(a[at]) != __float_as_uint(b[at]);
  }
  if (count) atomicAdd(mismatches, count);
}

dim3 RowGrid(int cols, int rows) {
  const int x = Blocks(cols) < 64 ? Blocks(cols) : 64;
  return dim3(static_cast<unsigned>(x), static_cast<unsigned>(rows < 65535 ? rows : 65535));
}

bool g_dependent_launch = false;
std::atomic<uint64_t> g_device_writes{0};

}  // namespace

void SetDependentLaunch(bool on) { g_dependent_launch = on; }
bool DependentLaunch() { return g_dependent_launch; }
int KernelsArchitecture() {
#ifdef FAILSAFE_CUDA_EMULATION
  return 90;  // the emulation's prologue is checked, not skipped
#else
  cudaFuncAttributes a{};
  if (cudaFuncGetAttributes(&a, reinterpret_cast<const void*>(AddFixedToKernel)) != cudaSuccess) {
    cudaGetLastError();  // not sticky
    return 0;
  }
  return a.binaryVersion < a.ptxVersion ? a.binaryVersion : a.ptxVersion;
#endif
}

void CountDeviceWrite() { g_device_writes.fetch_add(1, std::memory_order_relaxed); }
uint64_t DeviceWrites() { return g_device_writes.load(std::memory_order_relaxed); }

void GatherWeightRows(const void* w, WType type, int cols, const int32_t* src_rows,
                      const int32_t* dst_rows, int n, float* out, int64_t ldo, cudaStream_t s) {
  if (n <= 0) return;
  FS_LAUNCH(RowGrid(cols, n), kThreads, 0, s, GatherWeightRowsKernel)
  (w, type, cols, src_rows, dst_rows, n, out, ldo);
  FS_CUDA_CHECK(cudaGetLastError());
}

void GatherRows(const float* src, int64_t lds, const int32_t* rows, int n, int cols, float* dst,
                int64_t ldd, cudaStream_t s) {
  if (n <= 0) return;
  FS_LAUNCH(RowGrid(cols, n), kThreads, 0, s, GatherRowsKernel)(src, lds, rows, n, cols, dst, ldd);
  FS_CUDA_CHECK(cudaGetLastError());
}

void ScatterAddFixed(const int64_t* src, int64_t lds, const int32_t* rows, int n, int cols,
                     int64_t* dst, int64_t ldd, cudaStream_t s) {
  if (n <= 0) return;
  FS_LAUNCH(RowGrid(cols, n), kThreads, 0, s, ScatterAddFixedKernel)
  (src, lds, rows, n, cols, dst, ldd);
  FS_CUDA_CHECK(cudaGetLastError());
}

void AddFixedTo(const int64_t* acc, float* x, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  FS_LAUNCH(Blocks(n), kThreads, 0, s, AddFixedToKernel)(acc, x, n);
  FS_CUDA_CHECK(cudaGetLastError());
}

void SumArrays(const float* const* srcs, int n, size_t count, float* out, cudaStream_t s) {
  LaunchSumArrays(srcs, n, count, out, s);
}
void SumArrays(const int64_t* const* srcs, int n, size_t count, int64_t* out, cudaStream_t s) {
  LaunchSumArrays(srcs, n, count, out, s);
}

void ScaleRows(float* x, int64_t ldx, const float* scale, int rows, int cols, cudaStream_t s) {
  if (rows <= 0) return;
  FS_LAUNCH(RowGrid(cols, rows), kThreads, 0, s, ScaleRowsKernel)(x, ldx, scale, rows, cols);
  FS_CUDA_CHECK(cudaGetLastError());
}

void Softcap(float* x, int64_t n, float cap, cudaStream_t s) {
  if (n <= 0) return;
  FS_LAUNCH(Blocks(n), kThreads, 0, s, SoftcapKernel)(x, n, cap);
  FS_CUDA_CHECK(cudaGetLastError());
}

void AddBias(float* x, int64_t ldx, const float* bias, int rows, int cols, cudaStream_t s) {
  if (rows <= 0 || cols <= 0) return;
  FS_LAUNCH(RowGrid(cols, rows), kThreads, 0, s, AddBiasKernel)(x, ldx, bias, rows, cols);
  FS_CUDA_CHECK(cudaGetLastError());
}

void RmsNorm(const float* x, int64_t ldx, const float* weight, float* y, int64_t ldy, int rows,
             int dim, float eps, void* y16, WType type16, cudaStream_t s) {
  if (rows <= 0) return;
  FS_CHECK(rows <= (1 << 30));
  FS_LAUNCH(rows, kThreads, 0, s, RmsNormKernel<false>)
  (x, ldx, weight, y, ldy, dim, eps, nullptr, y16, type16);
  FS_CUDA_CHECK(cudaGetLastError());
}

void AddFixedToNorm(int64_t* acc, float* x, const float* weight, float* y, int rows, int dim,
                    float eps, void* y16, WType type16, cudaStream_t s) {
  if (rows <= 0) return;
  FS_CHECK(rows <= (1 << 30));
  FS_LAUNCH(rows, kThreads, 0, s, RmsNormKernel<true>)
  (x, dim, weight, y, dim, dim, eps, acc, y16, type16);
  FS_CUDA_CHECK(cudaGetLastError());
}

void Rope(float* x, int64_t ldx, int64_t head_stride, const int32_t* positions, int tokens,
          int heads, int head_dim, const float* cos_sin, cudaStream_t s) {
  if (tokens <= 0 || heads <= 0) return;
  FS_CHECK(tokens <= (1 << 30));
  FS_LAUNCH(tokens, 128, 0, s, RopeKernel)
  (x, ldx, head_stride, heads, nullptr, 0, 0, 0, positions, head_dim, cos_sin);
  FS_CUDA_CHECK(cudaGetLastError());
}

void RopeQK(float* q, int64_t ldq, int64_t q_stride, int q_heads, float* k, int64_t ldk,
            int64_t k_stride, int k_heads, const int32_t* positions, int tokens, int head_dim,
            const float* cos_sin, cudaStream_t s) {
  if (tokens <= 0) return;
  FS_CHECK(tokens <= (1 << 30));
  FS_LAUNCH(dim3(static_cast<unsigned>(tokens), 2), 128, 0, s, RopeKernel)
  (q, ldq, q_stride, q_heads, k, ldk, k_stride, k_heads, positions, head_dim, cos_sin);
  FS_CUDA_CHECK(cudaGetLastError());
}

void SiluMul(const float* gu, int64_t ld_in, float* out, int64_t ld_out, int rows, int width,
             int shards, cudaStream_t s) {
  if (rows <= 0) return;
  FS_LAUNCH(RowGrid(width * shards, rows), kThreads, 0, s, GatedKernel<Silu>)
  (gu, ld_in, out, ld_out, rows, width, shards);
  FS_CUDA_CHECK(cudaGetLastError());
}

void GeluTanhMul(const float* gu, int64_t ld_in, float* out, int64_t ld_out, int rows, int width,
                 int shards, cudaStream_t s) {
  if (rows <= 0) return;
  FS_LAUNCH(RowGrid(width * shards, rows), kThreads, 0, s, GatedKernel<GeluTanh>)
  (gu, ld_in, out, ld_out, rows, width, shards);
  FS_CUDA_CHECK(cudaGetLastError());
}

void MoeGate(const float* logits, int tokens, int experts, int k, bool renormalize, int32_t* ids,
             float* weights, cudaStream_t s) {
  if (tokens <= 0) return;
  FS_CHECK_MSG(k >= 1 && k <= kMoeMaxK && k <= experts,
               "the GPU's MoE gate takes 1 to {} experts a token (of {}), not {}", kMoeMaxK,
               experts, k);
  FS_LAUNCH(Blocks(tokens, 64), 64, 0, s, MoeGateKernel)
  (logits, tokens, experts, k, renormalize, ids, weights);
  FS_CUDA_CHECK(cudaGetLastError());
}

void RoundActivations(const float* x, int64_t ldx, int m, int k, WType type, void* dst,
                      cudaStream_t s) {
  if (m <= 0) return;
  FS_LAUNCH(RowGrid(k, m), kThreads, 0, s, RoundActivationsKernel)(x, ldx, m, k, type, dst);
  FS_CUDA_CHECK(cudaGetLastError());
}

void FillRandom(void* dst, WType type, int64_t n, uint64_t seed, cudaStream_t s) {
  if (n <= 0) return;
  FS_LAUNCH(Blocks(n) < 4096 ? Blocks(n) : 4096, kThreads, 0, s, FillRandomKernel)
  (dst, type, n, seed);
  FS_CUDA_CHECK(cudaGetLastError());
}

void CountMismatches(const float* a, const float* b, int rows, int n, int64_t ld, int batch,
                     int64_t stride, int* mismatches, cudaStream_t s) {
  const int64_t total = static_cast<int64_t>(rows) * n * batch;
  if (total <= 0) return;
  FS_LAUNCH(Blocks(total) < 4096 ? Blocks(total) : 4096, kThreads, 0, s, CountMismatchesKernel)
  (a, b, rows, n, ld, batch, stride, mismatches);
  FS_CUDA_CHECK(cudaGetLastError());
}

void AddItemsFixed(const float* parts, int items, int64_t item_stride, int m, int n, int64_t* acc,
                   int64_t ldacc, cudaStream_t s) {
  if (m <= 0 || n <= 0) return;
  FS_LAUNCH(Blocks(static_cast<int64_t>(m) * n), kThreads, 0, s, AddItemsFixedKernel)
  (parts, items, item_stride, m, n, acc, ldacc);
  FS_CUDA_CHECK(cudaGetLastError());
}

}  // namespace failsafe::cuda
