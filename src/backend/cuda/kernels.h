// The CUDA backend's kernels, as host functions that launch them on a
// stream. Every pointer is device memory (index lists too: the backend
// uploads them first). Shapes as in backend/backend.h.
//
// Like the CPU backend's, every kernel is batch-invariant: a row's result
// depends only on that row (and, for attention, on its own sequence), never
// on how many rows a launch covers or where the row lies in it.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include <utility>

#include "backend/cuda/cuda_check.h"

// A launch, `FS_LAUNCH(grid, block, shared bytes, stream, kernel)(args)`,
// a kernel's dynamic shared memory, `FS_DYNAMIC_SHARED(type, name);`, and
// every kernel's first statement, `FS_KERNEL_PROLOGUE();`: CUDA's own, or
// the CPU emulation's (emulation/emulation.h) where the kernels are
// compiled as C++ for tests (which checks that every thread of every
// kernel starts with the prologue).
//
// The prologue is what programmatic dependent launch asks of a kernel
// (SetDependentLaunch; Hopper and later): a kernel launched with it may
// start while the work before it in its stream is still running, so it
// first waits for that work to finish and its writes to be seen
// (griddepcontrol.wait), and then lets the kernel after it start early in
// turn (griddepcontrol.launch_dependents). Launched without it, or
// compiled for an older GPU, the prologue does nothing.
#ifdef FAILSAFE_CUDA_EMULATION
#define FS_LAUNCH(grid, block, shared, stream, ...) \
  ::failsafe::cuda::emu::Launch(grid, block, shared, stream, __VA_ARGS__)
#define FS_DYNAMIC_SHARED(type, name) \
  type* name = reinterpret_cast<type*>(::failsafe::cuda::emu::DynamicShared())
#define FS_KERNEL_PROLOGUE() ::failsafe::cuda::emu::KernelPrologue()
#else
#define FS_LAUNCH(grid, block, shared, stream, ...) \
  ::failsafe::cuda::MakeLauncher(grid, block, shared, stream, __VA_ARGS__)
#define FS_DYNAMIC_SHARED(type, name) extern __shared__ __align__(16) type name[]
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define FS_KERNEL_PROLOGUE() \
  asm volatile("griddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;\n" ::: "memory")
#else
#define FS_KERNEL_PROLOGUE() \
  do {                       \
  } while (0)
#endif
#endif

namespace failsafe::cuda {

// Whether this process's kernels are launched with programmatic dependent
// launch (off by default; one setting for the process).
void SetDependentLaunch(bool on);
bool DependentLaunch();
// The architecture the kernels run as on this process's GPU (major * 10 +
// minor; the lower of the code's and the virtual architecture it was
// compiled for): 90 or more where FS_KERNEL_PROLOGUE waits.
int KernelsArchitecture();

// A count of what may have written device memory: every launch of the
// engine's kernels (FS_LAUNCH) and every copy or set a backend's compute
// thread issues adds one (background copies, which write KV pages only,
// do not). Whatever was derived from activations at one count holds while
// the count is unchanged (the backend's rounded activations).
void CountDeviceWrite();
uint64_t DeviceWrites();

#ifndef FAILSAFE_CUDA_EMULATION
// FS_LAUNCH's: the launch configured, then its arguments.
template <typename... Params>
struct Launcher {
  dim3 grid, block;
  size_t shared;
  cudaStream_t stream;
  void (*kernel)(Params...);
  template <typename... Args>
  void operator()(Args&&... args) const {
    cudaLaunchConfig_t config{};
    config.gridDim = grid;
    config.blockDim = block;
    config.dynamicSmemBytes = shared;
    config.stream = stream;
    cudaLaunchAttribute attribute[1];
    attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute[0].val.programmaticStreamSerializationAllowed = 1;
    config.attrs = attribute;
    config.numAttrs = DependentLaunch() ? 1 : 0;
    CountDeviceWrite();
    FS_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
  }
};
template <typename... Params>
Launcher<Params...> MakeLauncher(dim3 grid, dim3 block, size_t shared, cudaStream_t stream,
                                 void (*kernel)(Params...)) {
  return Launcher<Params...>{grid, block, shared, stream, kernel};
}
#endif

// Element types of weights.
enum class WType : int { kF32 = 0, kBF16 = 1, kF16 = 2 };

// --- elementwise.cu ---
// out[dst_rows[i], :cols] = row src_rows[i] of the row-major [*, cols]
// weight w, widened to f32.
void GatherWeightRows(const void* w, WType type, int cols, const int32_t* src_rows,
                      const int32_t* dst_rows, int n, float* out, int64_t ldo, cudaStream_t s);
void GatherRows(const float* src, int64_t lds, const int32_t* rows, int n, int cols, float* dst,
                int64_t ldd, cudaStream_t s);
void ScatterAddFixed(const int64_t* src, int64_t lds, const int32_t* rows, int n, int cols,
                     int64_t* dst, int64_t ldd, cudaStream_t s);
void AddFixedTo(const int64_t* acc, float* x, int64_t n, cudaStream_t s);
// Backend::AddFixedToNorm: AddFixedTo, RmsNorm of the sums, acc cleared.
void AddFixedToNorm(int64_t* acc, float* x, const float* weight, float* y, int rows, int dim,
                    float eps, void* y16, WType type16, cudaStream_t s);
// out[i] = srcs[0][i] + ... + srcs[n - 1][i] in that order (Backend::SumArrays);
// srcs: a host array of n <= kMaxSumSources device pointers.
constexpr int kMaxSumSources = 64;
void SumArrays(const float* const* srcs, int n, size_t count, float* out, cudaStream_t s);
void SumArrays(const int64_t* const* srcs, int n, size_t count, int64_t* out, cudaStream_t s);
void ScaleRows(float* x, int64_t ldx, const float* scale, int rows, int cols, cudaStream_t s);
void Softcap(float* x, int64_t n, float cap, cudaStream_t s);
void AddBias(float* x, int64_t ldx, const float* bias, int rows, int cols, cudaStream_t s);
// y16 (or nullptr): y rounded to nearest even as `type16` too, contiguous
// [rows, dim] (what RoundActivations would make of y).
void RmsNorm(const float* x, int64_t ldx, const float* weight, float* y, int64_t ldy, int rows,
             int dim, float eps, void* y16, WType type16, cudaStream_t s);
void Rope(float* x, int64_t ldx, int64_t head_stride, const int32_t* positions, int tokens,
          int heads, int head_dim, const float* cos_sin, cudaStream_t s);
// Rope of q's heads and k's (blocks of each), one launch.
void RopeQK(float* q, int64_t ldq, int64_t q_stride, int q_heads, float* k, int64_t ldk,
            int64_t k_stride, int k_heads, const int32_t* positions, int tokens, int head_dim,
            const float* cos_sin, cudaStream_t s);
void SiluMul(const float* gu, int64_t ld_in, float* out, int64_t ld_out, int rows, int width,
             int shards, cudaStream_t s);
void GeluTanhMul(const float* gu, int64_t ld_in, float* out, int64_t ld_out, int rows, int width,
                 int shards, cudaStream_t s);
// Each token's k experts of the highest softmax probability (k up to
// kMoeMaxK).
inline constexpr int kMoeMaxK = 16;
void MoeGate(const float* logits, int tokens, int experts, int k, bool renormalize, int32_t* ids,
             float* weights, cudaStream_t s);
// dst[r, :k] = x[r, :k] rounded to nearest even as `type` (bf16 or f16),
// contiguous [m, k].
void RoundActivations(const float* x, int64_t ldx, int m, int k, WType type, void* dst,
                      cudaStream_t s);
// acc[r, c] += sum over i < items of ToFixed(parts[i * item_stride + r * n
// + c]): the exact sum of items' products.
void AddItemsFixed(const float* parts, int items, int64_t item_stride, int m, int n, int64_t* acc,
                   int64_t ldacc, cudaStream_t s);

// n elements of `type` (bf16 or f16) drawn from [-1, 1) by a hash of
// (seed, index): probes and checks.
void FillRandom(void* dst, WType type, int64_t n, uint64_t seed, cudaStream_t s);
// *mismatches += the elements (b, r, c), r < rows, c < n, whose bits differ
// between a and b (at b * stride + r * ld + c).
void CountMismatches(const float* a, const float* b, int rows, int n, int64_t ld, int batch,
                     int64_t stride, int* mismatches, cudaStream_t s);

// --- gemm_chain.cu ---
// Products as the CPU backend's chains (backend/cpu/gemm.h): every output
// element one chain of fused multiply-adds over its k-values in increasing
// order; bf16 weights take the bf16 chain (activations rounded to bf16,
// pairs odd before even, denormals flushed). Bit for bit the CPU backend's
// products, whatever m, n or the launch's shape.
//
// Items: the weight is `items` matrices [n, item_k] (row `c` of item i at
// w + (i * item_stride + c * row_stride) elements), multiplying
// x[:, i * item_k .. (i + 1) * item_k).
struct ChainGemm {
  const float* x = nullptr;
  int64_t ldx = 0;
  const void* w = nullptr;
  WType type = WType::kF32;
  int64_t item_stride = 0;  // elements between items
  int64_t row_stride = 0;   // elements between rows of an item (its k-values contiguous)
  int items = 1;
  int item_k = 0;
  int m = 0, n = 0;
  // Out: y = product (accumulate: y += product), or, with acc, acc +=
  // ToFixed(each item's product).
  float* y = nullptr;
  int64_t ldy = 0;
  bool accumulate = false;
  int64_t* acc = nullptr;
  int64_t ldacc = 0;
};
void RunChainGemm(const ChainGemm& g, cudaStream_t s);
// y[m, n] (+)= x[m, k] w[k, n] (w row-major [k, n]), the f32 or bf16 chain.
void RunChainGemmNN(const float* x, int64_t ldx, const void* w, WType type, float* y, int64_t ldy,
                    int m, int n, int k, bool accumulate, cudaStream_t s);

// --- gemm_fixed.cu ---
// acc[m, n] += sum over items i of ToFixed(A[:, i * item_k, + item_k) B_i^T)
// on tensor cores: A row-major [m, items * item_k] (lda), B items of
// [n, item_k] one after another, both bf16 (or f16) bits. Each item's
// product is one chain of m16n8k16 products over its k-values from zero,
// the same bits whatever m, the tiles or how the items are split over
// blocks (their fixed-point sums are added as integers).
struct FixedItems {
  const uint16_t* a = nullptr;
  const float* a32 = nullptr;  // or A as f32, rounded in the kernel (variants that take it)
  int64_t lda = 0;
  const uint16_t* b = nullptr;
  bool bf16 = true;
  int64_t* acc = nullptr;
  int64_t ldacc = 0;
  int m = 0, n = 0, item_k = 0, items = 0;
};
// Whether FixedItemsGemm takes these: item_k a multiple of 16 up to 256,
// rows and operands 16-byte aligned (a32: A is f32).
bool FixedItemsSupported(int item_k, int64_t lda, const void* a, const void* b, bool a32 = false);
// The ways to launch it (tiles, pipeline depth, blocks per multiprocessor,
// A as 16-bit values or as f32 rounded in the kernel), numbered from 0:
// every one gives the same bits, each is faster on some shapes
// (fixed_gemm.h times them). A variant's name, the dynamic shared memory it
// takes for items of item_k, whether it takes A as f32 (FixedItems::a32,
// else FixedItems::a), and the default for m rows (which fits every item
// size on Hopper).
int FixedItemsVariants();
const char* FixedItemsVariantName(int variant);
size_t FixedItemsShared(int variant, int item_k);
bool FixedItemsTakesF32(int variant);
int FixedItemsDefault(int m, bool a32);
// `sms`: the GPU's multiprocessors (blocks are sized to fill them).
void FixedItemsGemm(const FixedItems& g, int variant, int sms, cudaStream_t s);

// --- attention.cu ---
// One attention problem as the kernels read it (AttentionArgs, with the
// page list in device memory).
struct AttentionProblem {
  const float* q;
  float* out;
  const float* new_kv;
  const float* const* pages;  // device array of device pages
  int64_t ldq, ldo, ld_new_kv;
  int num_tokens, start_pos, group_size, head_dim, block_size, sliding_window;
  float scale, softcap;
  int kv_bf16;  // pages hold bf16 (stored rounded to nearest even), else f32
  // With segments (Attend's `segments`): the number of segments this
  // problem's keys are split into over its blocks (its blocks: split for a
  // problem of one block of queries; 0: not split), the first of them
  // (position / kAttentionSegment), and where its queries' states start in
  // `states`, in floats (query q's state of segment s at state0 + (q split +
  // s) (head_dim + 2): weighted values, maximum, sum).
  int split;
  int seg_first;
  int64_t state0;
};
// Keys of an attention segment (GpuAttention::kSegments).
constexpr int kAttentionSegment = 512;
// Stores every problem's new keys and values into its pages (before any
// problem attends: another problem of the step may read them).
void StoreKv(const AttentionProblem* problems, int num_problems, int max_tokens, cudaStream_t s);
// Blocks of one problem, and the shared memory of a block.
int AttentionBlocks(int num_tokens, int group_size);
size_t AttentionSharedBytes(int head_dim);
// Computes each problem's (token, query head) outputs; problem i takes
// blocks [first_block[i], first_block[i + 1]) (AttentionBlocks each, times
// its `split` where it has one). `segments`: keys in segments of
// kAttentionSegment merged in order; split problems leave their states in
// `states` for AttendCombine, which writes their outputs.
void Attend(const AttentionProblem* problems, const int* first_block, int num_problems,
            int total_blocks, int max_head_dim, bool segments, float* states, cudaStream_t s);
// The outputs of the split problems' queries from their segments' states:
// problem i's queries are [first_query[i], first_query[i + 1]) of
// total_queries (none for a problem not split).
void AttendCombine(const AttentionProblem* problems, const int* first_query, int num_problems,
                   int total_queries, const float* states, cudaStream_t s);
// The same on tensor cores (GpuAttention::kTensor), every problem of one
// head dim, one AttentionTcSupported takes; problem i takes blocks
// [first_block[i], first_block[i + 1]) (AttentionTcBlocks each).
bool AttentionTcSupported(int head_dim);
int AttentionTcBlocks(int num_tokens, int group_size);
size_t AttentionTcSharedBytes(int head_dim);
void AttendTc(const AttentionProblem* problems, const int* first_block, int num_problems,
              int total_blocks, int head_dim, cudaStream_t s);

// --- sampling.cu ---
// Greedy: the index of the largest logit (a NaN as -inf), lowest on ties,
// into *out.
void ArgMax(const float* logits, int vocab, int* out, cudaStream_t s);
// Logits sorted descending with their ids (ascending among equal logits),
// each ranked and returned as backend/sampling.h's SampleKey (a NaN as
// -inf); `scratch` of SortScratchBytes(vocab), keys_scratch and
// ids_scratch [vocab].
size_t SortScratchBytes(int vocab);
void SortDescending(const float* logits, int vocab, float* sorted, float* keys_scratch,
                    int* ids_scratch, int* ids, void* scratch, size_t scratch_bytes,
                    cudaStream_t s);

}  // namespace failsafe::cuda
