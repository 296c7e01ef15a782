#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <vector>

#include "backend/cpu/gemm.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/unit_shares.h"
#include "backend/peer_memory.h"
#include "common/fixed_point.h"
#include "common/ordered_sums.h"

namespace failsafe {
namespace {

// gelu's tanh approximation, in float as PyTorch's gelu(approximate="tanh").
inline float GeluTanh(float g) {
  return 0.5f * g * (1.0f + std::tanh(0.7978845608028654f * (g + 0.044715f * g * g * g)));
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const CpuBackendOptions& o)
      : threads_(std::max(1, o.threads)), linear_{threads_, o.isa, o.dpbf16} {}

  std::string name() const override { return "cpu"; }
  int num_threads() const override { return threads_; }

  // Device memory is host memory.
  bool host_memory() const override { return true; }
  void* Allocate(size_t bytes) override { return HostMemory().Allocate(bytes); }
  void Free(void* p, size_t bytes) override { HostMemory().Free(p, bytes); }
  void CopyToDevice(void* dst, const void* src, size_t bytes) override {
    HostMemory().CopyToDevice(dst, src, bytes);
  }
  void CopyToHost(void* dst, const void* src, size_t bytes) override {
    HostMemory().CopyToHost(dst, src, bytes);
  }
  void CopyToHost2D(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                    size_t rows) override {
    HostMemory().CopyToHost2D(dst, dpitch, src, spitch, width, rows);
  }
  void CopyOnDevice(void* dst, const void* src, size_t bytes) override {
    HostMemory().CopyOnDevice(dst, src, bytes);
  }
  void SetZero(void* dst, size_t bytes) override { HostMemory().SetZero(dst, bytes); }
  void BackgroundCopyToHost(void* dst, const void* src, size_t bytes) override {
    HostMemory().BackgroundCopyToHost(dst, src, bytes);
  }
  void BackgroundCopyToDevice(void* dst, const void* src, size_t bytes) override {
    HostMemory().BackgroundCopyToDevice(dst, src, bytes);
  }
  void Synchronize() override {}

  // Peer memory is a memfd that the other device processes of this host
  // map (peer_memory.h).
  ~CpuBackend() override {
    for (auto& [p, m] : peer_) FreeHostPeerMemory(m);
  }
  Result<PeerMemory> AllocatePeerMemory(size_t bytes) override {
    FS_ASSIGN_OR_RETURN(HostPeerMemory m, AllocateHostPeerMemory(bytes));
    PeerMemory out{m.data, m.handle};
    peer_[m.data] = std::move(m);
    return out;
  }
  void FreePeerMemory(void* p, size_t) override {
    auto it = peer_.find(p);
    if (it == peer_.end()) return;
    FreeHostPeerMemory(it->second);
    peer_.erase(it);
  }
  Result<void*> OpenPeerMemory(const std::string& handle, size_t bytes) override {
    return OpenHostPeerMemory(handle, bytes);
  }
  void ClosePeerMemory(void* p, size_t bytes) override { CloseHostPeerMemory(p, bytes); }

  void LinearNT(const float* x, int64_t ldx, WeightsRef w, float* y, int64_t ldy, int m, int n,
                int k, bool accumulate) override {
    cpu::LinearNT(x, ldx, w, y, ldy, m, n, k, accumulate, linear_);
  }
  void LinearNN(const float* x, int64_t ldx, WeightsRef w, float* y, int64_t ldy, int m, int n,
                int k, bool accumulate) override {
    cpu::LinearNN(x, ldx, w, y, ldy, m, n, k, accumulate, linear_);
  }
  void LinearNNFixed(const float* x, int64_t ldx, WeightsRef w, int64_t* acc, int64_t ldacc, int m,
                     int n, int k, int item_k) override {
    cpu::LinearNNFixed(x, ldx, w, acc, ldacc, m, n, k, item_k, linear_);
  }
  // bf16 at every level: an item's 16 columns are a run of memory, read
  // four runs at a time, by vdpbf16ps or fused multiply-adds (measured in
  // docs/CPU_PERFORMANCE.md, "Zen 5, bf16 o and down column-blocked" and
  // "Zen 4, the avx2 level's bf16"). f32 where its rows stream slower
  // (cpu::F32ColumnBlocked).
  bool ColumnBlockedNN(DType dtype) const override {
    return dtype == DType::kBF16 || (dtype == DType::kF32 && cpu::F32ColumnBlocked());
  }

  bool BlockedNT(DType) const override { return true; }

  void GatherWeightRows(WeightsRef w, int w_rows, int cols, const int32_t* src_rows,
                        const int32_t* dst_rows, int n, float* out, int64_t ldo) override {
    const int item_rows = w.blocked16 && w.blocked_rows > 0 ? w.blocked_rows : w_rows;
    for (int i = 0; i < n; ++i) {
      float* o = out + static_cast<int64_t>(dst_rows[i]) * ldo;
      const int64_t r = src_rows[i];
      if (!w.blocked16) {
        const int64_t base = r * cols;
        for (int c = 0; c < cols; ++c) o[c] = cpu::WeightAt(w, base + c);
        continue;
      }
      // Items of item_rows rows one after another, each blocked on its own.
      const int64_t item = r / item_rows, in_item = r % item_rows;
      const int64_t base = item * item_rows * cols;
      for (int c = 0; c < cols; ++c)
        o[c] = cpu::WeightAt(w, base + Blocked16Index(in_item, c, item_rows, cols, w.dtype));
    }
  }
  void GatherRows(const float* src, int64_t lds, const int32_t* rows, int n, int cols, float* dst,
                  int64_t ldd) override {
    for (int i = 0; i < n; ++i) {
      std::memcpy(dst + i * ldd, src + static_cast<int64_t>(rows[i]) * lds,
                  sizeof(float) * static_cast<size_t>(cols));
    }
  }
  void ScatterAddFixed(const int64_t* src, int64_t lds, const int32_t* rows, int n, int cols,
                       int64_t* dst, int64_t ldd) override {
    for (int i = 0; i < n; ++i) {
      int64_t* d = dst + static_cast<int64_t>(rows[i]) * ldd;
      const int64_t* s = src + i * lds;
      for (int j = 0; j < cols; ++j) d[j] = AddFixed(d[j], s[j]);
    }
  }
  void AddFixedTo(const int64_t* acc, float* x, int64_t n) override {
    for (int64_t i = 0; i < n; ++i) x[i] += FromFixed(acc[i]);
  }
  void SumArrays(const float* const* srcs, int n, size_t count, float* out) override {
    SumInOrder(srcs, n, 0, count, out);
  }
  void SumArrays(const int64_t* const* srcs, int n, size_t count, int64_t* out) override {
    SumInOrder(srcs, n, 0, count, out);
  }
  void ScaleRows(float* x, int64_t ldx, const float* scale, int rows, int cols) override {
    for (int r = 0; r < rows; ++r) {
      float* a = x + r * ldx;
      for (int j = 0; j < cols; ++j) a[j] *= scale[r];
    }
  }

  void AddBias(float* x, int64_t ldx, const float* bias, int rows, int cols) override {
    for (int r = 0; r < rows; ++r) {
      float* a = x + r * ldx;
      for (int j = 0; j < cols; ++j) a[j] += bias[j];
    }
  }
  void Softcap(float* x, int64_t n, float cap) override {
    for (int64_t i = 0; i < n; ++i) x[i] = cap * std::tanh(x[i] / cap);
  }

  void RmsNorm(const float* x, int64_t ldx, const float* weight, float* y, int64_t ldy, int rows,
               int dim, float eps) override {
    // Rows are independent: a prefill's share out over the threads.
    const bool split = threads_ > 1 && static_cast<int64_t>(rows) * dim >= (1 << 16);
#pragma omp parallel for num_threads(threads_) schedule(static) if (split)
    for (int r = 0; r < rows; ++r) {
      const float* xr = x + r * ldx;
      float* yr = y + r * ldy;
      float ms = cpu::Dot(xr, xr, dim) / static_cast<float>(dim);
      float inv = 1.0f / std::sqrt(ms + eps);
      for (int i = 0; i < dim; ++i) yr[i] = xr[i] * inv * weight[i];
    }
  }

  void Rope(float* x, int64_t ldx, int64_t head_stride, const int32_t* positions, int tokens,
            int heads, int head_dim, const float* cos_sin) override {
    const int half = head_dim / 2;
    const bool split = threads_ > 1 && static_cast<int64_t>(tokens) * heads * head_dim >= (1 << 16);
#pragma omp parallel for num_threads(threads_) schedule(static) if (split)
    for (int t = 0; t < tokens; ++t) {
      const float* cs = cos_sin + static_cast<int64_t>(positions[t]) * head_dim;
      const float* sn = cs + half;
      for (int h = 0; h < heads; ++h) {
        float* v = x + t * ldx + h * head_stride;
        for (int i = 0; i < half; ++i) {
          float a = v[i], b = v[i + half];
          v[i] = a * cs[i] - b * sn[i];
          v[i + half] = b * cs[i] + a * sn[i];
        }
      }
    }
  }

  void SiluMul(const float* gu, int64_t ld_in, float* out, int64_t ld_out, int rows, int width,
               int shards) override {
    GatedRows(gu, ld_in, out, ld_out, rows, width, shards,
              [&](const float* g, const float* u, float* o) {
                cpu::SiluMulRow(g, u, o, width, linear_.isa);
              });
  }

  void GeluTanhMul(const float* gu, int64_t ld_in, float* out, int64_t ld_out, int rows, int width,
                   int shards) override {
    GatedRows(gu, ld_in, out, ld_out, rows, width, shards,
              [&](const float* g, const float* u, float* o) {
                for (int i = 0; i < width; ++i) o[i] = GeluTanh(g[i]) * u[i];
              });
  }

  // out[r, j * width + i] = act(gate) * up for each shard j's gate and up
  // columns, row_fn(gate, up, out) doing one shard of one row. Rows are
  // independent: a prefill's share out over the threads, each row in one
  // pass.
  template <typename RowFn>
  void GatedRows(const float* gu, int64_t ld_in, float* out, int64_t ld_out, int rows, int width,
                 int shards, const RowFn& row_fn) {
    const bool split = threads_ > 1 && static_cast<int64_t>(rows) * width * shards >= (1 << 14);
#pragma omp parallel for num_threads(threads_) schedule(static) if (split)
    for (int r = 0; r < rows; ++r) {
      const float* in = gu + r * ld_in;
      float* o = out + r * ld_out;
      for (int j = 0; j < shards; ++j)
        row_fn(in + 2 * j * width, in + (2 * j + 1) * width, o + j * width);
    }
  }

  void MoeGate(const float* logits, int tokens, int experts, int k, bool renormalize, int32_t* ids,
               float* weights) override {
    std::vector<float> p(experts);
    std::vector<int> order(experts);
    for (int t = 0; t < tokens; ++t) {
      const float* l = logits + t * experts;
      float mx = *std::max_element(l, l + experts);
      float sum = 0;
      for (int e = 0; e < experts; ++e) sum += p[e] = std::exp(l[e] - mx);
      for (int e = 0; e < experts; ++e) {
        p[e] /= sum;
        order[e] = e;
      }
      std::partial_sort(order.begin(), order.begin() + k, order.end(),
                        [&](int a, int b) { return p[a] != p[b] ? p[a] > p[b] : a < b; });
      float top = 0;
      for (int i = 0; i < k; ++i) top += p[order[i]];
      for (int i = 0; i < k; ++i) {
        ids[t * k + i] = order[i];
        weights[t * k + i] = renormalize ? p[order[i]] / top : p[order[i]];
      }
    }
  }

  void Attention(const std::vector<AttentionArgs>& problems) override {
    // Problems are independent, each computed by one thread. Each thread
    // starts on its own run of them and takes them one by one, then takes
    // over the others' tails (UnitShares: no shared counter bounces between
    // the cores per problem); while it computes one it asks for the next
    // one's first keys and values (a batched decode step's problems read
    // tens of positions each; docs/CPU_PERFORMANCE.md).
    const int n = static_cast<int>(problems.size());
    auto run = [&](int i0, int i1) {
      for (int i = i0; i < i1; ++i) {
        if (i + 1 < n) cpu::PrefetchAttentionStart(problems[i + 1]);
        cpu::Attention(problems[i], linear_.isa);
      }
    };
    cpu::ShareOut(n, threads_, run, cpu::kUnitShareTakes, /*max_chunk=*/1);
  }

  int Sample(const float* logits, int vocab, const SamplingParams& params,
             uint64_t counter) override {
    return cpu::Sample(logits, vocab, params, counter);
  }

 private:
  const int threads_;
  const cpu::LinearOptions linear_;
  std::map<void*, HostPeerMemory> peer_;  // AllocatePeerMemory's, by their data
};

}  // namespace

std::unique_ptr<Backend> MakeCpuBackend(const CpuBackendOptions& options) {
  return std::make_unique<CpuBackend>(options);
}

std::unique_ptr<Backend> MakeCpuBackend(int num_threads) {
  CpuBackendOptions o;
  o.threads = num_threads;
  return MakeCpuBackend(o);
}

}  // namespace failsafe
