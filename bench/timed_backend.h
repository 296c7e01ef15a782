// A backend that forwards every call to another and times it, for a
// benchmark's breakdown of a step. Two ways:
// - kMarks (the default): a device timestamp (Backend::Mark) before and
//   after each call, nothing waited for until Collect(): a call's time is
//   the device's from reaching its first kernel to finishing its last (or,
//   where the host issues calls more slowly than the device runs them, the
//   host's issuing too), and the time between calls is reported apart
//   ("between calls"), so the parts add up to the step.
// - kWaits: each call waits for the device before and after (Synchronize),
//   so the time is the call's own, launch included, serialised; the sum
//   exceeds an unprofiled step by the waits.
// Products are told apart by their shape's role (rows, columns).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "common/check.h"
#include "common/clock.h"

namespace failsafe::bench {

class TimedBackend final : public Backend {
 public:
  explicit TimedBackend(std::unique_ptr<Backend> inner) : b_(std::move(inner)) {}

  struct Entry {
    int64_t calls = 0;
    int64_t ns = 0;
  };
  enum class Way { kMarks, kWaits };
  // Per kind of call since the last Reset; with marks, as of the last
  // Collect().
  const std::map<std::string, Entry>& entries() const { return entries_; }
  void Reset() {
    entries_.clear();
    pending_.clear();
    b_->TakeMarks();
  }
  // Waits for the device and adds the marked calls since the last Collect
  // to entries().
  void Collect() {
    const std::vector<double> t = b_->TakeMarks();
    FS_CHECK_MSG(t.size() == 2 * pending_.size(), "{} marks for {} calls", t.size(),
                 pending_.size());
    for (size_t i = 0; i < pending_.size(); ++i) {
      Entry& e = entries_[pending_[i]];
      e.calls++;
      e.ns += static_cast<int64_t>((t[2 * i + 1] - t[2 * i]) * 1e9);
      if (i > 0) {
        Entry& gap = entries_["between calls"];
        gap.calls++;
        gap.ns += static_cast<int64_t>((t[2 * i] - t[2 * i - 1]) * 1e9);
      }
    }
    pending_.clear();
  }
  bool enabled = false;
  Way way = Way::kMarks;

  bool host_memory() const override { return b_->host_memory(); }
  void* Allocate(size_t bytes) override { return b_->Allocate(bytes); }
  void Free(void* p, size_t bytes) override { b_->Free(p, bytes); }
  void CopyToDevice(void* d, const void* s, size_t n) override {
    Time("copy to device", [&] { b_->CopyToDevice(d, s, n); });
  }
  void CopyToHost(void* d, const void* s, size_t n) override {
    Time("copy to host", [&] { b_->CopyToHost(d, s, n); });
  }
  void CopyToHost2D(void* d, size_t dp, const void* s, size_t sp, size_t w, size_t r) override {
    Time("copy to host", [&] { b_->CopyToHost2D(d, dp, s, sp, w, r); });
  }
  void CopyOnDevice(void* d, const void* s, size_t n) override {
    Time("copy on device", [&] { b_->CopyOnDevice(d, s, n); });
  }
  void SetZero(void* d, size_t n) override {
    Time("set zero", [&] { b_->SetZero(d, n); });
  }
  void BackgroundCopyToHost(void* d, const void* s, size_t n) override {
    b_->BackgroundCopyToHost(d, s, n);
  }
  void BackgroundCopyToDevice(void* d, const void* s, size_t n) override {
    b_->BackgroundCopyToDevice(d, s, n);
  }
  void BackgroundCopiesToHost(const HostCopy* c, size_t n) override {
    b_->BackgroundCopiesToHost(c, n);
  }
  void BackgroundCopiesToDevice(const HostCopy* c, size_t n) override {
    b_->BackgroundCopiesToDevice(c, n);
  }
  void PinHostMemory(void* p, size_t bytes) override { b_->PinHostMemory(p, bytes); }
  void Synchronize() override { b_->Synchronize(); }
  Result<PeerMemory> AllocatePeerMemory(size_t bytes) override {
    return b_->AllocatePeerMemory(bytes);
  }
  void FreePeerMemory(void* p, size_t bytes) override { b_->FreePeerMemory(p, bytes); }
  Result<void*> OpenPeerMemory(const std::string& handle, size_t bytes) override {
    return b_->OpenPeerMemory(handle, bytes);
  }
  void ClosePeerMemory(void* p, size_t bytes) override { b_->ClosePeerMemory(p, bytes); }
  std::string name() const override { return b_->name(); }
  int num_threads() const override { return b_->num_threads(); }

  void LinearNT(const float* x, int64_t ldx, WeightsRef w, float* y, int64_t ldy, int m, int n,
                int k, bool acc) override {
    Time("linear nt n=" + std::to_string(n) + " k=" + std::to_string(k),
         [&] { b_->LinearNT(x, ldx, w, y, ldy, m, n, k, acc); });
  }
  void LinearNN(const float* x, int64_t ldx, WeightsRef w, float* y, int64_t ldy, int m, int n,
                int k, bool acc) override {
    Time("linear nn", [&] { b_->LinearNN(x, ldx, w, y, ldy, m, n, k, acc); });
  }
  void LinearNNFixed(const float* x, int64_t ldx, WeightsRef w, int64_t* a, int64_t lda, int m,
                     int n, int k, int item_k) override {
    Time("fixed items k=" + std::to_string(k) + " item_k=" + std::to_string(item_k),
         [&] { b_->LinearNNFixed(x, ldx, w, a, lda, m, n, k, item_k); });
  }
  bool ColumnBlockedNN(DType t) const override { return b_->ColumnBlockedNN(t); }
  bool TransposedNN(DType t) const override { return b_->TransposedNN(t); }
  bool BlockedNT(DType t) const override { return b_->BlockedNT(t); }
  void RmsNorm(const float* x, int64_t ldx, const float* w, float* y, int64_t ldy, int rows,
               int dim, float eps) override {
    Time("rms norm", [&] { b_->RmsNorm(x, ldx, w, y, ldy, rows, dim, eps); });
  }
  void Rope(float* x, int64_t ldx, int64_t hs, const int32_t* pos, int tokens, int heads, int hd,
            const float* cs) override {
    Time("rope", [&] { b_->Rope(x, ldx, hs, pos, tokens, heads, hd, cs); });
  }
  void RopeQK(float* q, int64_t ldq, int64_t qs, int qh, float* k, int64_t ldk, int64_t ks, int kh,
              const int32_t* pos, int tokens, int hd, const float* cs) override {
    Time("rope q k", [&] { b_->RopeQK(q, ldq, qs, qh, k, ldk, ks, kh, pos, tokens, hd, cs); });
  }
  void SiluMul(const float* gu, int64_t li, float* out, int64_t lo, int rows, int width,
               int shards) override {
    Time("silu mul", [&] { b_->SiluMul(gu, li, out, lo, rows, width, shards); });
  }
  void GeluTanhMul(const float* gu, int64_t li, float* out, int64_t lo, int rows, int width,
                   int shards) override {
    Time("gelu mul", [&] { b_->GeluTanhMul(gu, li, out, lo, rows, width, shards); });
  }
  void MoeGate(const float* l, int tokens, int experts, int k, bool renormalize, int32_t* ids,
               float* w) override {
    Time("moe gate", [&] { b_->MoeGate(l, tokens, experts, k, renormalize, ids, w); });
  }
  void Attention(const std::vector<AttentionArgs>& p) override {
    Time("attention", [&] { b_->Attention(p); });
  }
  void GatherWeightRows(WeightsRef w, int wr, int cols, const int32_t* s, const int32_t* d, int n,
                        float* out, int64_t ldo) override {
    Time("gather", [&] { b_->GatherWeightRows(w, wr, cols, s, d, n, out, ldo); });
  }
  void GatherRows(const float* s, int64_t lds, const int32_t* rows, int n, int cols, float* d,
                  int64_t ldd) override {
    Time("gather", [&] { b_->GatherRows(s, lds, rows, n, cols, d, ldd); });
  }
  void ScatterAddFixed(const int64_t* s, int64_t lds, const int32_t* rows, int n, int cols,
                       int64_t* d, int64_t ldd) override {
    Time("scatter", [&] { b_->ScatterAddFixed(s, lds, rows, n, cols, d, ldd); });
  }
  void AddFixedTo(const int64_t* a, float* x, int64_t n) override {
    Time("add fixed", [&] { b_->AddFixedTo(a, x, n); });
  }
  void AddFixedToNorm(int64_t* a, float* x, const float* w, float* y, int rows, int dim,
                      float eps) override {
    Time("add fixed + rms norm", [&] { b_->AddFixedToNorm(a, x, w, y, rows, dim, eps); });
  }
  void SumArrays(const float* const* srcs, int n, size_t count, float* out) override {
    Time("peer sums", [&] { b_->SumArrays(srcs, n, count, out); });
  }
  void SumArrays(const int64_t* const* srcs, int n, size_t count, int64_t* out) override {
    Time("peer sums", [&] { b_->SumArrays(srcs, n, count, out); });
  }
  void ScaleRows(float* x, int64_t ldx, const float* s, int rows, int cols) override {
    Time("scale rows", [&] { b_->ScaleRows(x, ldx, s, rows, cols); });
  }
  void AddBias(float* x, int64_t ldx, const float* bias, int rows, int cols) override {
    Time("add bias", [&] { b_->AddBias(x, ldx, bias, rows, cols); });
  }
  void Softcap(float* x, int64_t n, float cap) override {
    Time("softcap", [&] { b_->Softcap(x, n, cap); });
  }
  // Graphs only while calls are not timed (timing waits inside the step).
  bool BeginGraph(uint64_t key, size_t bytes) override {
    return !enabled && b_->BeginGraph(key, bytes);
  }
  void EndGraph() override { b_->EndGraph(); }
  std::vector<std::string> KernelChoices() const override { return b_->KernelChoices(); }
  int Sample(const float* l, int vocab, const SamplingParams& p, uint64_t c) override {
    return b_->Sample(l, vocab, p, c);
  }

 private:
  template <typename F>
  void Time(const std::string& kind, F&& f) {
    if (!enabled) {
      f();
      return;
    }
    if (way == Way::kMarks) {
      b_->Mark();
      f();
      b_->Mark();
      pending_.push_back(kind);
      return;
    }
    b_->Synchronize();
    const int64_t t0 = MonotonicNanos();
    f();
    b_->Synchronize();
    Entry& e = entries_[kind];
    e.calls++;
    e.ns += MonotonicNanos() - t0;
  }

  std::unique_ptr<Backend> b_;
  std::map<std::string, Entry> entries_;
  std::vector<std::string> pending_;  // kMarks: the calls marked since Collect()
};

}  // namespace failsafe::bench
