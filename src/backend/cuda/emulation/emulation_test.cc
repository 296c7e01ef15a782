// The CPU emulation of the CUDA execution model itself (emulation.h): its
// barriers, warp operations, tensor-core fragments and the mistakes it
// stops. (CudaBackend's own tests, cuda_backend_test.cc, run over it in the
// same program: the backend and its kernels against the CPU backend.)
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "backend/cuda/emulation/emulation.h"
#include "backend/cuda/kernels.h"

namespace failsafe::cuda {
namespace {

// --- the emulation itself ---

// A block's threads meet at __syncthreads: each reads what the others wrote
// before it.
__global__ void ReverseKernel(const int* in, int* out) {
  FS_KERNEL_PROLOGUE();
  __shared__ int buf[256];
  buf[threadIdx.x] = in[blockIdx.x * blockDim.x + threadIdx.x];
  __syncthreads();
  out[blockIdx.x * blockDim.x + threadIdx.x] = buf[blockDim.x - 1 - threadIdx.x];
}

TEST(CudaEmulation, ThreadsMeetAtSyncThreads) {
  std::vector<int> in(3 * 256), out(in.size());
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<int>(i);
  FS_LAUNCH(3, 256, 0, nullptr, ReverseKernel)(in.data(), out.data());
  for (int b = 0; b < 3; ++b)
    for (int t = 0; t < 256; ++t) EXPECT_EQ(out[b * 256 + t], b * 256 + 255 - t);
}

// A warp's butterfly sum: every lane ends with the warp's total.
__global__ void WarpSumKernel(const float* in, float* out) {
  FS_KERNEL_PROLOGUE();
  float v = in[threadIdx.x];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  out[threadIdx.x] = v;
  const int from = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) * 10, 3);
  if (threadIdx.x % 32 == 0) out[64 + threadIdx.x / 32] = static_cast<float>(from);
  if (__any_sync(0xffffffffu, threadIdx.x == 40)) out[70 + threadIdx.x / 32] = 1;
}

TEST(CudaEmulation, WarpShufflesExchangeWithinAWarp) {
  std::vector<float> in(64), out(80, 0.0f);
  for (int i = 0; i < 64; ++i) in[i] = static_cast<float>(i);
  FS_LAUNCH(1, 64, 0, nullptr, WarpSumKernel)(in.data(), out.data());
  for (int i = 0; i < 32; ++i) EXPECT_EQ(out[i], 31 * 32 / 2) << i;
  for (int i = 32; i < 64; ++i) EXPECT_EQ(out[i], (32 + 63) * 32 / 2) << i;
  EXPECT_EQ(out[64], 30);
  EXPECT_EQ(out[65], 350);  // lane 3 of the second warp: thread 35
  EXPECT_EQ(out[70], 0);
  EXPECT_EQ(out[71], 1);
}

// One warp's m16n8k16 product of bf16 values from their fragments.
__global__ void MmaKernel(const float* a, const float* b, float* d) {
  FS_KERNEL_PROLOGUE();
  const int lane = threadIdx.x, g = lane / 4, q = lane % 4;
  auto pack = [](float lo, float hi) {
    return static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(lo))) |
           (static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(hi))) << 16);
  };
  // A [16, 16] row-major, B [16, 8] (k, n) row-major.
  const uint32_t fa[4] = {pack(a[g * 16 + 2 * q], a[g * 16 + 2 * q + 1]),
                          pack(a[(g + 8) * 16 + 2 * q], a[(g + 8) * 16 + 2 * q + 1]),
                          pack(a[g * 16 + 8 + 2 * q], a[g * 16 + 9 + 2 * q]),
                          pack(a[(g + 8) * 16 + 8 + 2 * q], a[(g + 8) * 16 + 9 + 2 * q])};
  const uint32_t b0 = pack(b[(2 * q) * 8 + g], b[(2 * q + 1) * 8 + g]);
  const uint32_t b1 = pack(b[(8 + 2 * q) * 8 + g], b[(9 + 2 * q) * 8 + g]);
  float acc[4] = {1.0f, 1.0f, 1.0f, 1.0f};
  emu::Mma16816(__LINE__, acc, fa, b0, b1, true);
  d[g * 8 + 2 * q] = acc[0];
  d[g * 8 + 2 * q + 1] = acc[1];
  d[(g + 8) * 8 + 2 * q] = acc[2];
  d[(g + 8) * 8 + 2 * q + 1] = acc[3];
}

TEST(CudaEmulation, TensorCoreFragmentsMultiply) {
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> small(-4, 4);  // exact in bf16 and in the sums
  std::vector<float> a(256), b(128), d(128);
  for (float& v : a) v = static_cast<float>(small(rng));
  for (float& v : b) v = static_cast<float>(small(rng));
  FS_LAUNCH(1, 32, 0, nullptr, MmaKernel)(a.data(), b.data(), d.data());
  for (int r = 0; r < 16; ++r)
    for (int n = 0; n < 8; ++n) {
      float want = 1.0f;
      for (int k = 0; k < 16; ++k) want += a[r * 16 + k] * b[k * 8 + n];
      EXPECT_EQ(d[r * 8 + n], want) << r << ", " << n;
    }
}

__global__ void DivergentShuffleKernel(float* out) {
  FS_KERNEL_PROLOGUE();
  if (threadIdx.x < 16) out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
  __syncthreads();
}
__global__ void ShuffleAfterReturnKernel(float* out) {
  FS_KERNEL_PROLOGUE();
  if (threadIdx.x == 5) return;
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
}
__global__ void BigSharedKernel(float*) { FS_KERNEL_PROLOGUE(); }

__global__ void NoPrologueKernel(float* out) { out[threadIdx.x] = 1.0f; }
__global__ void LatePrologueKernel(float* out) {
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
  FS_KERNEL_PROLOGUE();
}

TEST(CudaEmulationDeathTest, StopsWhatAGpuWouldNotRun) {
  std::vector<float> out(32);
  EXPECT_DEATH(FS_LAUNCH(1, 32, 0, nullptr, DivergentShuffleKernel)(out.data()), "never reach");
  EXPECT_DEATH(FS_LAUNCH(1, 32, 0, nullptr, ShuffleAfterReturnKernel)(out.data()), "have returned");
  EXPECT_DEATH(FS_LAUNCH(1, 32, 64 << 10, nullptr, BigSharedKernel)(out.data()),
               "over the kernel's limit");
  // Without the prologue first, a dependent launch could read its inputs
  // before the kernel before it wrote them.
  EXPECT_DEATH(FS_LAUNCH(1, 32, 0, nullptr, NoPrologueKernel)(out.data()),
               "did not start with FS_KERNEL_PROLOGUE");
  EXPECT_DEATH(FS_LAUNCH(1, 32, 0, nullptr, LatePrologueKernel)(out.data()),
               "not a kernel's first statement");
}

}  // namespace
}  // namespace failsafe::cuda
