// The CUDA kernels' code run by the CPU emulation (emulation.h), against
// the CPU backend: what CudaBackend's own tests check on a GPU, checked here
// on every machine. Also the emulation itself: its barriers, warp
// operations, tensor-core fragments and the mistakes it stops.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/attention_cases.h"
#include "backend/cuda/attention_plan.h"
#include "backend/cuda/emulation/emulation.h"
#include "backend/cuda/kernels.h"

namespace failsafe::cuda {
namespace {

// --- the emulation itself ---

// A block's threads meet at __syncthreads: each reads what the others wrote
// before it.
__global__ void ReverseKernel(const int* in, int* out) {
  static int buf[256];
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
  if (threadIdx.x < 16) out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
  __syncthreads();
}
__global__ void ShuffleAfterReturnKernel(float* out) {
  if (threadIdx.x == 5) return;
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
}
__global__ void BigSharedKernel(float*) {}

TEST(CudaEmulationDeathTest, StopsWhatAGpuWouldNotRun) {
  std::vector<float> out(32);
  EXPECT_DEATH(FS_LAUNCH(1, 32, 0, nullptr, DivergentShuffleKernel)(out.data()), "never reach");
  EXPECT_DEATH(FS_LAUNCH(1, 32, 0, nullptr, ShuffleAfterReturnKernel)(out.data()), "have returned");
  EXPECT_DEATH(FS_LAUNCH(1, 32, 64 << 10, nullptr, BigSharedKernel)(out.data()),
               "over the kernel's limit");
}

// --- attention ---

// A step's problems through the backend's plan and the emulated kernels,
// host memory standing for the device's.
void RunEmulated(const std::vector<AttentionArgs>& problems, GpuAttention mode) {
  AttentionPlan plan;
  PlanAttention(problems, mode, false, &plan);
  for (size_t i = 0; i < problems.size(); ++i) {
    plan.problems[i].pages = plan.pages.data() + plan.page_offset[i];
  }
  std::vector<float> states(static_cast<size_t>(plan.state_floats));
  const int n = static_cast<int>(problems.size());
  StoreKv(plan.problems.data(), n, plan.max_tokens, nullptr);
  if (plan.tensor) {
    AttendTc(plan.problems.data(), plan.first_block.data(), n, plan.blocks, plan.max_head_dim,
             nullptr);
    return;
  }
  Attend(plan.problems.data(), plan.first_block.data(), n, plan.blocks, plan.max_head_dim,
         plan.segments, states.data(), nullptr);
  AttendCombine(plan.problems.data(), plan.first_query.data(), n, plan.split_queries, states.data(),
                nullptr);
}

// CudaBackend's attention test (cuda_backend_test.cc) on the emulated
// kernels: each query against the CPU backend, the stored keys and values
// its bits, and a chunk's last token computed again alone the same bits as
// in its chunk.
void CheckAttention(GpuAttention mode, const attention_cases::Shape& shape, DType kv, int window) {
  const attention_cases::Case c(shape, kv, window);
  SCOPED_TRACE(c.Name(mode));
  std::vector<float> cpu_pool = c.pool, gpu_pool = c.pool;
  const size_t n = c.seqs.size();
  std::vector<std::vector<float*>> cpu_tables(n), gpu_tables(n);
  std::vector<std::vector<float>> cpu_out(n), gpu_out(n);
  std::vector<AttentionArgs> cpu_p, gpu_p;
  for (size_t i = 0; i < n; ++i) {
    const auto& s = c.seqs[i];
    cpu_out[i].assign(s.q.size(), 0.0f);
    gpu_out[i].assign(s.q.size(), NAN);
    cpu_p.push_back(
        c.Args(i, cpu_pool.data(), s.q.data(), s.kv.data(), cpu_out[i].data(), &cpu_tables[i]));
    gpu_p.push_back(
        c.Args(i, gpu_pool.data(), s.q.data(), s.kv.data(), gpu_out[i].data(), &gpu_tables[i]));
  }
  MakeCpuBackend(1)->Attention(cpu_p);
  RunEmulated(gpu_p, mode);
  for (size_t i = 0; i < n; ++i) {
    EXPECT_LT(attention_cases::MaxRelError(gpu_out[i], cpu_out[i]),
              attention_cases::Tolerance(mode, shape))
        << "sequence " << i;
  }
  EXPECT_EQ(std::memcmp(gpu_pool.data(), cpu_pool.data(), cpu_pool.size() * 4), 0)
      << "the stored keys and values";
  const int width = shape.group * shape.hd;
  for (size_t i : attention_cases::Case::Chunks()) {
    AttentionArgs a = gpu_p[i];
    const int last = c.seqs[i].tokens - 1;
    std::vector<float> one(static_cast<size_t>(width), NAN);
    a.q += static_cast<int64_t>(last) * width;
    a.out = one.data();
    a.num_tokens = 1;
    a.start_pos += last;
    a.new_kv = nullptr;
    RunEmulated({a}, mode);
    EXPECT_EQ(std::memcmp(one.data(), gpu_out[i].data() + static_cast<size_t>(last) * width,
                          one.size() * 4),
              0)
        << "sequence " << i << "'s last token alone";
  }
}

// Every shape of the GPU test, on each kernel; f32 pages with full
// attention and a window of 300, bf16 pages with a window of 40 (all three
// on the GPU).
class EmulatedAttention : public testing::TestWithParam<std::tuple<GpuAttention, DType>> {};

TEST_P(EmulatedAttention, MatchesTheCpuBackend) {
  const auto [mode, kv] = GetParam();
  for (const auto& s : attention_cases::kShapes)
    for (int window : kv == DType::kF32 ? std::vector<int>{0, 300} : std::vector<int>{40}) {
      CheckAttention(mode, s, kv, window);
    }
}

INSTANTIATE_TEST_SUITE_P(Kernels, EmulatedAttention,
                         testing::Combine(testing::Values(GpuAttention::kCores,
                                                          GpuAttention::kSegments,
                                                          GpuAttention::kTensor),
                                          testing::Values(DType::kF32, DType::kBF16)),
                         [](const testing::TestParamInfo<EmulatedAttention::ParamType>& info) {
                           const GpuAttention mode = std::get<0>(info.param);
                           return std::string(mode == GpuAttention::kTensor     ? "TensorCores"
                                              : mode == GpuAttention::kSegments ? "Segments"
                                                                                : "CudaCores") +
                                  (std::get<1>(info.param) == DType::kF32 ? "F32" : "BF16");
                         });

}  // namespace
}  // namespace failsafe::cuda
