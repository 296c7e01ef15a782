// Sampling's device side: the greedy choice, and the logits sorted for a
// seeded draw (kernels.h).
#ifndef FAILSAFE_CUDA_EMULATION
#include <cub/device/device_radix_sort.cuh>
#endif

#include <cfloat>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"

namespace failsafe::cuda {
namespace {

constexpr int kThreads = 1024;

// backend/sampling.h's SampleKey: a NaN ranks as -inf.
__device__ __forceinline__ float SampleKeyDevice(float x) { return x == x ? x : -INFINITY; }

// One block: each thread the best of its stride, then a tree; the larger
// logit wins, the lower index on ties (the CPU backend's rule).
__global__ void ArgMaxKernel(const float* logits, int vocab, int* out) {
  FS_KERNEL_PROLOGUE();
  __shared__ float best_v[kThreads];
  __shared__ int best_i[kThreads];
  float v = -FLT_MAX;
  int idx = -1;
  for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
    const float x = SampleKeyDevice(logits[i]);
    if (idx < 0 || x > v) {
      v = x;
      idx = i;
    }
  }
  best_v[threadIdx.x] = v;
  best_i[threadIdx.x] = idx;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) {
      const float ov = best_v[threadIdx.x + s];
      const int oi = best_i[threadIdx.x + s];
      const int mi = best_i[threadIdx.x];
      if (oi >= 0 &&
          (mi < 0 || ov > best_v[threadIdx.x] || (ov == best_v[threadIdx.x] && oi < mi))) {
        best_v[threadIdx.x] = ov;
        best_i[threadIdx.x] = oi;
      }
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) *out = best_i[0];
}

// ids[i] = i and keys[i] = SampleKey(logits[i]), what the sort ranks by.
__global__ void KeysKernel(const float* logits, float* keys, int* ids, int n) {
  FS_KERNEL_PROLOGUE();
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    ids[i] = i;
    keys[i] = SampleKeyDevice(logits[i]);
  }
}

}  // namespace

void ArgMax(const float* logits, int vocab, int* out, cudaStream_t s) {
  FS_LAUNCH(1, kThreads, 0, s, ArgMaxKernel)(logits, vocab, out);
  FS_CUDA_CHECK(cudaGetLastError());
}

#ifdef FAILSAFE_CUDA_EMULATION
// The emulation sorts on the host as CUB's radix sort does: by the keys'
// bits ordered as numbers, -0 taken as +0 (equal keys keep their order),
// stable.
size_t SortScratchBytes(int vocab) { return 0; }

void SortDescending(const float* logits, int vocab, float* sorted, float* keys_scratch,
                    int* ids_scratch, int* ids, void* scratch, size_t scratch_bytes,
                    cudaStream_t s) {
  FS_LAUNCH((vocab + 255) / 256 < 1024 ? (vocab + 255) / 256 : 1024, 256, 0, s, KeysKernel)
  (logits, keys_scratch, ids_scratch, vocab);
  emu::SortPairsDescending(keys_scratch, sorted, ids_scratch, ids, vocab);
}
#else
size_t SortScratchBytes(int vocab) {
  size_t bytes = 0;
  FS_CUDA_CHECK(cub::DeviceRadixSort::SortPairsDescending(
      nullptr, bytes, static_cast<const float*>(nullptr), static_cast<float*>(nullptr),
      static_cast<const int*>(nullptr), static_cast<int*>(nullptr), vocab));
  return bytes;
}

void SortDescending(const float* logits, int vocab, float* sorted, float* keys_scratch,
                    int* ids_scratch, int* ids, void* scratch, size_t scratch_bytes,
                    cudaStream_t s) {
  FS_LAUNCH((vocab + 255) / 256 < 1024 ? (vocab + 255) / 256 : 1024, 256, 0, s, KeysKernel)
  (logits, keys_scratch, ids_scratch, vocab);
  FS_CUDA_CHECK(cudaGetLastError());
  // Radix sort is stable: equal logits keep ascending ids.
  FS_CUDA_CHECK(cub::DeviceRadixSort::SortPairsDescending(scratch, scratch_bytes, keys_scratch,
                                                          sorted, ids_scratch, ids, vocab, 0,
                                                          static_cast<int>(sizeof(float) * 8), s));
}
#endif

}  // namespace failsafe::cuda
