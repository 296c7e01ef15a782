// The CUDA execution model on the CPU, enough to run the engine's own
// kernels' code (src/backend/cuda/*.cu) in tests on machines without a GPU:
// CI compiles every kernel with nvcc but can run none. With the emulated
// runtime (runtime.cc) the CUDA backend itself runs over them, and its GPU
// tests (cuda_backend_test.cc) check its logic (indexing, masking, the
// online softmax, block and warp cooperation, tensor-core fragments, the
// uploads, graphs) against the CPU backend on every change.
//
// Each kernel file is compiled as C++ with this header first and
// FAILSAFE_CUDA_EMULATION defined (src/backend/CMakeLists.txt). A launch
// (FS_LAUNCH, kernels.h) runs the grid's blocks one after another; a
// block's threads are fibers of one OS thread, run a warp at a time until
// each waits at a barrier: __syncthreads (every thread of the block not yet
// returned) or a warp-wide operation (__shfl_*_sync, __any_sync, mma.sync,
// ldmatrix: every lane of the warp, at the same operation). Each is
// checked: a warp operation some of whose lanes have returned or wait
// elsewhere, or more dynamic shared memory than a launch may take (48 KiB,
// or what cudaFuncSetAttribute raised the kernel's limit to; 227 KiB at
// most), stops the test with a message. Dynamic shared memory starts as
// NaNs each block, as uninitialised memory would not be zeros.
//
// What it does not model: timing, the memory model across blocks (blocks
// run in turn, so a race between blocks goes unseen), and the GPU's own
// roundings where they differ from the host's (expf and tanhf differ in the
// last bits; an mma sums its products in k order in f32 here). It checks
// logic, not speed.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <type_traits>

namespace failsafe::cuda::emu {

// The calling thread's coordinates (threadIdx and the rest).
struct Coordinates {
  uint3 thread{0, 0, 0};
  uint3 block{0, 0, 0};
  dim3 block_dim{1, 1, 1};
  dim3 grid_dim{1, 1, 1};
};
const Coordinates& Self();

// __syncthreads.
void SyncThreads();

// The calling thread's lane in its warp.
int Lane();

// Every lane of the calling warp gives `bytes` at `mine` (at the same
// operation, `site`); `all` receives the 32 lanes' in lane order (a lane
// past the block's last thread: zeros).
void WarpGather(int site, const void* mine, size_t bytes, void* all);
// The same, receiving only lane `from`'s (0 to 31) into `out`.
void WarpExchange(int site, const void* mine, size_t bytes, int from, void* out);

// The block's dynamic shared memory (extern __shared__).
unsigned char* DynamicShared();

// A block's dynamic shared memory at most, as on Hopper (the device's
// cudaDevAttrMaxSharedMemoryPerBlockOptin).
inline constexpr size_t kMaxSharedBytes = 227 << 10;

// FS_KERNEL_PROLOGUE (kernels.h): every thread of a kernel must start with
// it (Run checks after each block).
void KernelPrologue();

}  // namespace failsafe::cuda::emu
namespace failsafe::cuda {
void CountDeviceWrite();  // kernels.h
}  // namespace failsafe::cuda
namespace failsafe::cuda::emu {

// Runs `body` as every thread of every block of the grid.
void Run(const void* kernel, dim3 grid, dim3 block, size_t shared,
         const std::function<void()>& body);

// Runs `launch` now, or records it where `s` is being captured into a
// graph (runtime.cc).
void IssueLaunch(cudaStream_t s, std::function<void()> launch);

// The emulated GPUs (runtime.cc): device ordinals 0 to kGpus - 1.
inline constexpr int kGpus = 8;

// Work on a stream that finishes only when other processes take part (an
// emulated NCCL operation). Advance does what it can: with `block`, until
// the work is finished (or can never be: its group aborted); returns
// whether it is. Called again once finished, it returns true at once.
class Pending {
 public:
  virtual ~Pending() = default;
  virtual bool Advance(bool block) = 0;
};
// Issues `op` on `s` after the stream's work before it (runtime.cc): it is
// advanced once the stream reaches it (at once where nothing is ahead of
// it), and the work issued after it waits on the stream until it has
// finished. False while `s` is captured (not supported).
bool IssuePending(cudaStream_t s, std::shared_ptr<Pending> op);

template <typename Kernel>
struct Launcher {
  Kernel kernel;
  dim3 grid, block;
  size_t shared;
  cudaStream_t stream;
  // The arguments by value: a captured launch runs when its graph does.
  template <typename... Args>
  void operator()(Args... args) const {
    const Kernel k = kernel;
    const dim3 g = grid, b = block;
    const size_t bytes = shared;
    CountDeviceWrite();
    IssueLaunch(stream,
                [=] { Run(reinterpret_cast<const void*>(k), g, b, bytes, [&] { k(args...); }); });
  }
};
template <typename Kernel>
Launcher<Kernel> Launch(dim3 grid, dim3 block, size_t shared, cudaStream_t stream, Kernel kernel) {
  return Launcher<Kernel>{kernel, grid, block, shared, stream};
}

// Lane `src` of the calling warp's `v`.
template <typename T>
T ShuffleFromLane(int site, T v, int src) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 16);
  T out;
  WarpExchange(site, &v, sizeof(T), src & 31, &out);
  return out;
}

// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32 of the
// calling warp: d += a b, with the fragments of the PTX ISA.
void Mma16816(int site, float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1, bool bf16);

// fma.rn.ftz.f32: denormal inputs read as zeros, a denormal result
// flushed to a zero of its sign.
inline float FmaFtz(float a, float b, float c) {
  auto flush = [](float v) {
    return std::fpclassify(v) == FP_SUBNORMAL ? std::copysign(0.0f, v) : v;
  };
  return flush(std::fma(flush(a), flush(b), flush(c)));
}

// cp.async of 16 bytes (zeros where !valid), made at once.
void CopyAsync16(void* dst, const void* src, bool valid);

// ldmatrix.sync.aligned.m8n8.x4.shared.b16 of the calling warp: lanes 8 i
// to 8 i + 7 give the rows of matrix i; each lane receives in r[i] matrix
// i's row lane / 4, columns 2 (lane % 4) and the next.
void LoadMatrixX4(int site, uint32_t (&r)[4], const void* row);

// CUB's DeviceRadixSort::SortPairsDescending of floats: stable, by the
// keys' bits ordered as numbers, with -0 as +0 (CUB's
// ProcessFloatMinusZero: the two compare equal).
void SortPairsDescending(const float* keys_in, float* keys_out, const int* values_in,
                         int* values_out, int n);

}  // namespace failsafe::cuda::emu

// --- what the kernels call ---

// cudaFuncSetAttribute of a kernel (the runtime's C++ form, which host
// compilers do not see).
template <typename T>
inline cudaError_t cudaFuncSetAttribute(T* entry, cudaFuncAttribute attr, int value) {
  return ::cudaFuncSetAttribute(reinterpret_cast<const void*>(entry), attr, value);
}

// cudaOccupancyMaxActiveBlocksPerMultiprocessor of a kernel (the same).
template <typename T>
inline cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, T* entry, int threads,
                                                                 size_t shared) {
  return ::cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      blocks, reinterpret_cast<const void*>(entry), threads, shared);
}

#undef __shared__
#define __shared__ static
#undef __launch_bounds__
#define __launch_bounds__(...)
#define threadIdx (::failsafe::cuda::emu::Self().thread)
#define blockIdx (::failsafe::cuda::emu::Self().block)
#define blockDim (::failsafe::cuda::emu::Self().block_dim)
#define gridDim (::failsafe::cuda::emu::Self().grid_dim)

inline void __syncthreads() { ::failsafe::cuda::emu::SyncThreads(); }

#define __shfl_xor_sync(mask, v, lane_mask)                                            \
  ::failsafe::cuda::emu::ShuffleFromLane(__LINE__ + (static_cast<void>(mask), 0), (v), \
                                         ::failsafe::cuda::emu::Lane() ^ (lane_mask))
#define __shfl_sync(mask, v, src) \
  ::failsafe::cuda::emu::ShuffleFromLane(__LINE__ + (static_cast<void>(mask), 0), (v), (src))

inline bool EmulatedAny(int site, bool p) {
  bool all[32];
  ::failsafe::cuda::emu::WarpGather(site, &p, 1, all);
  for (bool b : all) {
    if (b) return true;
  }
  return false;
}
#define __any_sync(mask, p) EmulatedAny(__LINE__ + (static_cast<void>(mask), 0), (p))

inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline unsigned __float_as_uint(float f) {
  unsigned u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float __uint_as_float(unsigned u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
template <typename T>
inline T __ldg(const T* p) {
  return *p;
}
// Blocks run one at a time on one OS thread: a plain add is atomic.
template <typename T>
inline T atomicAdd(T* p, T v) {
  const T old = *p;
  *p = old + v;
  return old;
}

inline int max(int a, int b) { return a > b ? a : b; }
inline int min(int a, int b) { return a < b ? a : b; }
inline int64_t max(int64_t a, int64_t b) { return a > b ? a : b; }
inline int64_t min(int64_t a, int64_t b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
