// The CUDA backend: device memory by cudaMalloc, every kernel on one
// stream, small per-call arguments (index lists, attention problems and
// page tables) uploaded through a pinned ring.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/gemm_lt.h"
#include "backend/cuda/kernels.h"
#include "backend/sampling.h"

namespace failsafe {
namespace {

using cuda::WType;

WType TypeOf(DType t) {
  switch (t) {
    case DType::kBF16:
      return WType::kBF16;
    case DType::kF16:
      return WType::kF16;
    case DType::kF32:
      break;
  }
  return WType::kF32;
}

// Rows of a fixed-point product taken at once: its items' f32 products
// wait in a buffer of items x this x n.
constexpr int kFixedRows = 128;
constexpr size_t kRingBytes = 16u << 20;

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const CudaBackendOptions& o) : gpu_(o.gpu), gemm_(o.gemm) {}

  Status Init() {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) return FailedPrecondition("no CUDA device: {}", cudaGetErrorString(e));
    if (gpu_ < 0 || gpu_ >= count)
      return InvalidArgument("GPU {} does not exist ({} CUDA devices)", gpu_, count);
    e = cudaSetDevice(gpu_);
    if (e != cudaSuccess) return FailedPrecondition("GPU {}: {}", gpu_, cudaGetErrorString(e));
    FS_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    FS_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
    FS_CUDA_CHECK(cudaMallocHost(&result_, 64));
    GrowRing(kRingBytes);
    lt_ = std::make_unique<cuda::LtGemm>(stream_);
    return Status::Ok();
  }

  ~CudaBackend() override {
    if (!stream_) return;
    cudaStreamSynchronize(stream_);
    x16_ = DeviceArray<uint16_t>();
    parts_ = DeviceArray<float>();
    sort_ = DeviceArray<float>();
    sort_ids_ = DeviceArray<int>();
    sort_scratch_ = DeviceArray<unsigned char>();
    lt_.reset();
    if (ring_) cudaFree(ring_);
    if (pinned_) cudaFreeHost(pinned_);
    if (result_) cudaFreeHost(result_);
    cudaStreamDestroy(copy_stream_);
    cudaStreamDestroy(stream_);
  }

  std::string name() const override { return "cuda"; }
  int num_threads() const override { return 1; }

  // --- DeviceMemory ---
  bool host_memory() const override { return false; }
  void* Allocate(size_t bytes) override {
    void* p = nullptr;
    if (cudaMalloc(&p, std::max<size_t>(bytes, 1)) != cudaSuccess) {
      (void)cudaGetLastError();  // not sticky: the device is usable
      throw std::bad_alloc();
    }
    return p;
  }
  void Free(void* p, size_t) override {
    if (!p) return;
    const cudaError_t e = cudaFree(p);
    // At exit the runtime may be gone before the last buffers.
    FS_CHECK_MSG(e == cudaSuccess || e == cudaErrorCudartUnloading, "cudaFree: {}",
                 cudaGetErrorString(e));
  }
  void CopyToDevice(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    // From pageable memory the call returns once the bytes are staged.
    FS_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
  }
  void CopyToHost(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    FS_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
    Synchronize();
  }
  void CopyToHost2D(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                    size_t rows) override {
    if (rows == 0 || width == 0) return;
    FS_CUDA_CHECK(
        cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, cudaMemcpyDeviceToHost, stream_));
    Synchronize();
  }
  void CopyOnDevice(void* dst, const void* src, size_t bytes) override {
    if (bytes) FS_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
  }
  void SetZero(void* dst, size_t bytes) override {
    if (bytes) FS_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, stream_));
  }
  void BackgroundCopyToHost(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    std::lock_guard<std::mutex> lock(copy_mu_);
    FS_CUDA_CHECK(cudaSetDevice(gpu_));  // this thread's device
    FS_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, copy_stream_));
    FS_CUDA_CHECK(cudaStreamSynchronize(copy_stream_));
  }
  void Synchronize() override {
    FS_CUDA_CHECK(cudaStreamSynchronize(stream_));
    ring_used_ = 0;  // every upload was read
  }

  // --- products ---
  bool TransposedNN(DType) const override { return true; }

  void LinearNT(const float* x, int64_t ldx, WeightsRef w, float* y, int64_t ldy, int m, int n,
                int k, bool accumulate) override {
    FS_CHECK_MSG(!w.blocked16 && !w.transposed, "the CUDA backend reads [n, k] weights row-major");
    if (m <= 0 || n <= 0) return;
    if (Chains(w.dtype)) {
      cuda::ChainGemm g;
      g.x = x;
      g.ldx = ldx;
      g.w = w.data;
      g.type = TypeOf(w.dtype);
      g.row_stride = k;
      g.item_k = k;
      g.m = m;
      g.n = n;
      g.y = y;
      g.ldy = ldy;
      g.accumulate = accumulate;
      cuda::RunChainGemm(g, stream_);
      return;
    }
    const void* x16 = Round(x, ldx, m, k, w.dtype);
    cuda::LtProblem p;
    p.type = w.dtype == DType::kBF16 ? CUDA_R_16BF : CUDA_R_16F;
    p.x = x16;
    p.ldx = k;
    p.w = w.data;
    p.ldw = k;
    p.d = y;
    p.ldd = ldy;
    p.m = m;
    p.n = n;
    p.k = k;
    p.accumulate = accumulate;
    lt_->Run(p);
  }

  void LinearNN(const float* x, int64_t ldx, WeightsRef w, float* y, int64_t ldy, int m, int n,
                int k, bool accumulate) override {
    FS_CHECK_MSG(!w.blocked16 && !w.transposed, "the CUDA backend reads [k, n] weights row-major");
    cuda::RunChainGemmNN(x, ldx, w.data, TypeOf(w.dtype), y, ldy, m, n, k, accumulate, stream_);
  }

  void LinearNNFixed(const float* x, int64_t ldx, WeightsRef w, int64_t* acc, int64_t ldacc, int m,
                     int n, int k, int item_k) override {
    FS_CHECK_MSG(w.transposed, "the CUDA backend takes fixed-point items transposed");
    if (m <= 0 || n <= 0 || k <= 0) return;
    FS_CHECK(item_k > 0 && k % item_k == 0);
    const int items = k / item_k;
    if (Chains(w.dtype)) {
      cuda::ChainGemm g;
      g.x = x;
      g.ldx = ldx;
      g.w = w.data;
      g.type = TypeOf(w.dtype);
      g.item_stride = static_cast<int64_t>(n) * item_k;
      g.row_stride = item_k;
      g.items = items;
      g.item_k = item_k;
      g.m = m;
      g.n = n;
      g.acc = acc;
      g.ldacc = ldacc;
      cuda::RunChainGemm(g, stream_);
      return;
    }
    // Each item's product by cuBLASLt (one batch entry per item), then
    // their exact fixed-point sum.
    const auto* x16 = static_cast<const uint16_t*>(Round(x, ldx, m, k, w.dtype));
    const int64_t item_stride = static_cast<int64_t>(kFixedRows) * n;
    float* parts = parts_.Reserve(static_cast<size_t>(items) * item_stride);
    for (int r0 = 0; r0 < m; r0 += kFixedRows) {
      const int rows = std::min(kFixedRows, m - r0);
      cuda::LtProblem p;
      p.type = w.dtype == DType::kBF16 ? CUDA_R_16BF : CUDA_R_16F;
      p.x = x16 + static_cast<int64_t>(r0) * k;
      p.ldx = k;
      p.w = w.data;
      p.ldw = item_k;
      p.d = parts;
      p.ldd = n;
      p.m = rows;
      p.n = n;
      p.k = item_k;
      p.batch = items;
      p.stride_x = item_k;
      p.stride_w = static_cast<int64_t>(n) * item_k;
      p.stride_d = item_stride;
      lt_->Run(p);
      cuda::AddItemsFixed(parts, items, item_stride, rows, n,
                          acc + static_cast<int64_t>(r0) * ldacc, ldacc, stream_);
    }
  }

  // --- data movement ---
  void GatherWeightRows(WeightsRef w, int w_rows, int cols, const int32_t* src_rows,
                        const int32_t* dst_rows, int n, float* out, int64_t ldo) override {
    FS_CHECK_MSG(!w.blocked16 && !w.transposed, "the CUDA backend reads weights row-major");
    if (n <= 0) return;
    const auto* src = Upload<int32_t>(src_rows, n);
    const auto* dst = Upload<int32_t>(dst_rows, n);
    cuda::GatherWeightRows(w.data, TypeOf(w.dtype), cols, src, dst, n, out, ldo, stream_);
  }
  void GatherRows(const float* src, int64_t lds, const int32_t* rows, int n, int cols, float* dst,
                  int64_t ldd) override {
    if (n <= 0) return;
    cuda::GatherRows(src, lds, Upload<int32_t>(rows, n), n, cols, dst, ldd, stream_);
  }
  void ScatterAddFixed(const int64_t* src, int64_t lds, const int32_t* rows, int n, int cols,
                       int64_t* dst, int64_t ldd) override {
    if (n <= 0) return;
    cuda::ScatterAddFixed(src, lds, Upload<int32_t>(rows, n), n, cols, dst, ldd, stream_);
  }
  void AddFixedTo(const int64_t* acc, float* x, int64_t n) override {
    cuda::AddFixedTo(acc, x, n, stream_);
  }
  void ScaleRows(float* x, int64_t ldx, const float* scale, int rows, int cols) override {
    if (rows <= 0) return;
    cuda::ScaleRows(x, ldx, Upload<float>(scale, rows), rows, cols, stream_);
  }

  // --- the rest of the layer ---
  void RmsNorm(const float* x, int64_t ldx, const float* weight, float* y, int64_t ldy, int rows,
               int dim, float eps) override {
    cuda::RmsNorm(x, ldx, weight, y, ldy, rows, dim, eps, stream_);
  }
  void Rope(float* x, int64_t ldx, const int32_t* positions, int tokens, int heads, int head_dim,
            const float* cos_sin) override {
    cuda::Rope(x, ldx, positions, tokens, heads, head_dim, cos_sin, stream_);
  }
  void SiluMul(const float* gu, int64_t ld_in, float* out, int64_t ld_out, int rows, int width,
               int shards) override {
    cuda::SiluMul(gu, ld_in, out, ld_out, rows, width, shards, stream_);
  }
  void MoeGate(const float* logits, int tokens, int experts, int k, int32_t* ids,
               float* weights) override {
    FS_CHECK_MSG(k <= 16, "top-{} routing is over the CUDA backend's 16", k);
    cuda::MoeGate(logits, tokens, experts, k, ids, weights, stream_);
  }

  void Attention(const std::vector<AttentionArgs>& problems) override {
    if (problems.empty()) return;
    // Every problem's page table, one after another, then the problems
    // pointing into it.
    host_pages_.clear();
    std::vector<size_t> page_offset(problems.size());
    int max_tokens = 0, max_hd = 0;
    for (size_t i = 0; i < problems.size(); ++i) {
      const AttentionArgs& a = problems[i];
      const int positions = a.start_pos + a.num_tokens;
      const int pages = (positions + a.block_size - 1) / a.block_size;
      page_offset[i] = host_pages_.size();
      host_pages_.insert(host_pages_.end(), a.pages, a.pages + pages);
      max_tokens = std::max(max_tokens, a.num_tokens);
      max_hd = std::max(max_hd, a.head_dim);
    }
    const float* const* pages = Upload<const float*>(
        reinterpret_cast<const float* const*>(host_pages_.data()), host_pages_.size());
    host_problems_.resize(problems.size());
    host_first_block_.resize(problems.size() + 1);
    int blocks = 0;
    for (size_t i = 0; i < problems.size(); ++i) {
      const AttentionArgs& a = problems[i];
      cuda::AttentionProblem& p = host_problems_[i];
      p.q = a.q;
      p.out = a.out;
      p.new_kv = a.new_kv;
      p.pages = pages + page_offset[i];
      p.ldq = a.ldq;
      p.ldo = a.ldo;
      p.ld_new_kv = a.ld_new_kv;
      p.num_tokens = a.num_tokens;
      p.start_pos = a.start_pos;
      p.group_size = a.group_size;
      p.head_dim = a.head_dim;
      p.block_size = a.block_size;
      p.sliding_window = a.sliding_window;
      p.scale = a.scale;
      host_first_block_[i] = blocks;
      blocks += a.group_size > 0 ? cuda::AttentionBlocks(a.num_tokens, a.group_size) : 0;
    }
    host_first_block_[problems.size()] = blocks;
    const auto* dev = Upload<cuda::AttentionProblem>(host_problems_.data(), host_problems_.size());
    const int* first = Upload<int>(host_first_block_.data(), host_first_block_.size());
    cuda::StoreKv(dev, static_cast<int>(problems.size()), max_tokens, stream_);
    cuda::Attend(dev, first, static_cast<int>(problems.size()), blocks, max_hd, stream_);
  }

  int Sample(const float* logits, int vocab, const SamplingParams& p, uint64_t counter) override {
    if (vocab <= 0) return -1;
    if (p.temperature <= 0.0f || p.top_k == 1) {
      cuda::ArgMax(logits, vocab, result_, stream_);
      Synchronize();
      return *result_;
    }
    // Sorted on the device; the draw's sums in the CPU backend's order.
    const size_t scratch = cuda::SortScratchBytes(vocab);
    float* sorted = sort_.Reserve(vocab);
    int* ids = sort_ids_.Reserve(2 * static_cast<size_t>(vocab));
    cuda::SortDescending(logits, vocab, sorted, ids + vocab, ids, sort_scratch_.Reserve(scratch),
                         scratch, stream_);
    const int keep = p.top_k > 0 && p.top_k < vocab ? p.top_k : vocab;
    host_sorted_.resize(keep);
    host_ids_.resize(keep);
    FS_CUDA_CHECK(cudaMemcpyAsync(host_sorted_.data(), sorted, sizeof(float) * keep,
                                  cudaMemcpyDeviceToHost, stream_));
    FS_CUDA_CHECK(cudaMemcpyAsync(host_ids_.data(), ids, sizeof(int) * keep, cudaMemcpyDeviceToHost,
                                  stream_));
    Synchronize();
    return DrawSorted(host_sorted_.data(), host_ids_.data(), keep, p, counter);
  }

 private:
  bool Chains(DType t) const { return t == DType::kF32 || gemm_ == GpuGemm::kChain; }

  // x [m, k] rounded to the weights' 16-bit type, contiguous.
  const void* Round(const float* x, int64_t ldx, int m, int k, DType t) {
    uint16_t* dst = x16_.Reserve(static_cast<size_t>(m) * k);
    cuda::RoundActivations(x, ldx, m, k, TypeOf(t), dst, stream_);
    return dst;
  }

  void GrowRing(size_t bytes) {
    if (ring_) {
      Synchronize();
      FS_CUDA_CHECK(cudaFree(ring_));
      FS_CUDA_CHECK(cudaFreeHost(pinned_));
    }
    ring_bytes_ = bytes;
    FS_CUDA_CHECK(cudaMalloc(&ring_, ring_bytes_));
    FS_CUDA_CHECK(cudaMallocHost(&pinned_, ring_bytes_));
    ring_used_ = 0;
  }

  // n elements from host memory into the ring; valid for kernels issued
  // before the next Synchronize.
  template <typename T>
  const T* Upload(const T* src, size_t n) {
    const size_t bytes = sizeof(T) * n, padded = (bytes + 255) / 256 * 256;
    if (padded > ring_bytes_) GrowRing(std::max(2 * ring_bytes_, padded));
    if (ring_used_ + padded > ring_bytes_) Synchronize();  // every slot was read
    char* host = static_cast<char*>(pinned_) + ring_used_;
    char* dev = static_cast<char*>(ring_) + ring_used_;
    std::memcpy(host, src, bytes);
    FS_CUDA_CHECK(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, stream_));
    ring_used_ += padded;
    return reinterpret_cast<const T*>(dev);
  }

  const int gpu_;
  const GpuGemm gemm_;
  cudaStream_t stream_ = nullptr;       // every kernel and copy of the compute thread
  cudaStream_t copy_stream_ = nullptr;  // BackgroundCopyToHost
  std::mutex copy_mu_;
  std::unique_ptr<cuda::LtGemm> lt_;
  void* ring_ = nullptr;    // device side of the upload ring
  void* pinned_ = nullptr;  // its host side
  size_t ring_bytes_ = 0, ring_used_ = 0;
  int* result_ = nullptr;  // pinned: ArgMax's answer
  DeviceArray<uint16_t> x16_{this, 0};
  DeviceArray<float> parts_{this, 0};
  DeviceArray<float> sort_{this, 0};
  DeviceArray<int> sort_ids_{this, 0};
  DeviceArray<unsigned char> sort_scratch_{this, 0};
  std::vector<const float*> host_pages_;
  std::vector<cuda::AttentionProblem> host_problems_;
  std::vector<int> host_first_block_;
  std::vector<float> host_sorted_;
  std::vector<int> host_ids_;
};

}  // namespace

Result<std::unique_ptr<Backend>> MakeCudaBackend(const CudaBackendOptions& options) {
  auto b = std::make_unique<CudaBackend>(options);
  FS_RETURN_IF_ERROR(b->Init());
  return std::unique_ptr<Backend>(std::move(b));
}

bool CudaBackendBuilt() { return true; }

}  // namespace failsafe
