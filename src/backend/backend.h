// The kernel interface a device runs its share of the model with, and the
// memory it runs them on.
//
// A backend owns device memory (DeviceMemory): weights, KV pages and step
// activations live in buffers it allocates, and its kernels read and write
// only those. The model runner (worker/device_model.h) holds device
// pointers and issues calls; it never loops over device memory itself.
// Pointers are device memory unless a parameter says "host". For the CPU
// backend device memory is host memory.
//
// Matrices are row-major with explicit leading dimensions (ld*, in
// elements). A Backend is used by one thread at a time (the device's compute
// thread), except BackgroundCopyToHost; it may use more threads internally.
// Kernels run in the order they are issued; a call that returns data to the
// host (CopyToHost, MoeGate's outputs read back, Sample) waits for the
// kernels before it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "backend/cpu_features.h"
#include "common/clock.h"
#include "common/status.h"
#include "model/config.h"
#include "model/safetensors.h"

namespace failsafe {

// A weight matrix in device memory: elements of `dtype`, row-major or
// blocked, which the kernels read as it lies:
//  - LinearNT: items of `blocked_rows` rows (0: the whole matrix, n rows) one
//    after another, each in blocks of 16 rows stored k-major and a last block
//    of its remaining rows (Blocked16Index below).
//  - LinearNNFixed (column-blocked, where the backend takes it:
//    Backend::ColumnBlockedNN): each item of item_k rows as its transpose
//    [n, item_k], blocked the same way.
// bf16 and f16 weights stay 16-bit; the kernels widen them exactly in
// registers.
//  - LinearNNFixed (transposed, where the backend takes it:
//    Backend::TransposedNN): each item of item_k rows as its transpose
//    [n, item_k], row-major.
struct WeightsRef {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  bool blocked16 = false;
  int blocked_rows = 0;
  bool transposed = false;
  WeightsRef() = default;
  WeightsRef(const void* d, DType t, bool blocked = false, int item_rows = 0,
             bool transposed_items = false)
      : data(d),
        dtype(t),
        blocked16(blocked),
        blocked_rows(item_rows),
        transposed(transposed_items) {}
  WeightsRef(const float* f32) : data(f32) {}  // NOLINT: f32 weights convert implicitly
};

// Whether the blocked layout of `dtype` holds k-values in pairs: bf16, whose
// widening to f32 is then in-lane (see Blocked16Index).
inline bool Blocked16Pairs(DType dtype) { return dtype == DType::kBF16; }

// Where element (r, kk) of a [rows, k] matrix of `dtype` lies in the blocked
// layout (in elements from its start; rows * k elements in all, no padding):
// blocks of 16 rows one after another, 16 * k elements each, then the last
// rows % 16 rows (the tail) in a block of that width; every block k-major,
// `width` rows side by side per k-value:
//  - f32, f16: the block's values for one kk side by side ([k][width]).
//  - bf16: k-values in pairs, (kk, kk + 1) of a row side by side in one
//    32-bit lane, the block's pairs one after another ([k / 2][width][2]);
//    when k is odd, the last k-value's values follow as f32's do. The pair
//    of k-values kk, kk + 1 (kk even) starts at kk * width, as in the f32
//    layout; for a block of 16 one 64-byte vector holds both, and a shift
//    (even kk) and a mask (odd kk) widen them exactly without moving a value
//    across lanes.
inline int64_t Blocked16Index(int64_t r, int64_t kk, int64_t rows, int64_t k, DType dtype) {
  const int64_t full = rows / 16 * 16;  // rows in blocks of 16
  const bool tail = r >= full;
  const int64_t width = tail ? rows - full : 16;
  const int64_t block = (tail ? full : r / 16 * 16) * k, q = tail ? r - full : r % 16;
  if (!Blocked16Pairs(dtype) || (k % 2 == 1 && kk == k - 1)) return block + kk * width + q;
  return block + (kk & ~int64_t{1}) * width + q * 2 + (kk & 1);
}

struct AttentionArgs {
  // Device pointers, except `pages` (a host array of device addresses).
  // Queries of one head group for num_tokens consecutive positions of one
  // sequence: head j of token t at q + t * ldq + j * head_dim.
  const float* q = nullptr;
  int64_t ldq = 0;
  // Output, same layout as q.
  float* out = nullptr;
  int64_t ldo = 0;
  int num_tokens = 0;
  int start_pos = 0;   // position of the first query token; it attends to [0, start_pos + t]
  int group_size = 1;  // query heads sharing this KV head (0: new_kv stored, nothing attended)
  int head_dim = 0;
  // Paged KV of this (sequence, layer, KV head): page i holds positions
  // [i * block_size, (i + 1) * block_size) as K [block_size, head_dim] followed by
  // V [block_size, head_dim], elements of kv_dtype (a page's address is typed
  // float* whatever they are). Positions < start_pos + num_tokens must be
  // written, or be the tokens' own (new_kv).
  float* const* pages = nullptr;
  // kF32, or kBF16: keys and values stored rounded to bf16 (to nearest,
  // ties to even) and read back widened, exactly; attention then computes
  // as over f32 pages that held those values.
  DType kv_dtype = DType::kF32;
  // Optional, this step's keys and values, stored into the pages before
  // attending: token t's key at new_kv + t * ld_new_kv and its value
  // head_dim after it. Each problem stores its own, so a step's stores
  // share out over the threads with the problems.
  const float* new_kv = nullptr;
  int64_t ld_new_kv = 0;
  int block_size = 0;
  int sliding_window = 0;  // 0: full causal attention
  float scale = 1.0f;
  // > 0: each score s (times the scale) becomes softcap * tanh(s / softcap)
  // before the softmax (Gemma 2's attn_logit_softcapping).
  float softcap = 0.0f;
};

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy
  int top_k = 0;             // 0: off
  float top_p = 1.0f;        // 1: off
  uint64_t seed = 0;
  // Drops tokens whose probability (after temperature) is below min_p times
  // the most likely token's (0: off); applied after top-k, before top-p.
  float min_p = 0.0f;
};

// The memory a backend computes on. Allocation failures throw
// std::bad_alloc (a device out of memory is a configuration error the
// caller reports); copies are complete when they return.
class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  // Whether device memory is host memory: the host may read and write it
  // through its pointers (the CPU backend).
  virtual bool host_memory() const = 0;
  // `bytes` of device memory, aligned to at least 256 bytes, contents
  // undefined. Large host allocations are committed as they are touched.
  virtual void* Allocate(size_t bytes) = 0;
  virtual void Free(void* p, size_t bytes) = 0;
  // Host -> device; `src` may be reused on return, and kernels issued after
  // see the bytes.
  virtual void CopyToDevice(void* dst, const void* src, size_t bytes) = 0;
  // Staging for large copies in (weights as they load, and as a survivor
  // gains them in a recovery): host buffer `which` (0 or 1) of at least
  // `bytes`, which the device copies from at its full rate (page-locked),
  // free to write on return (Staging waits for the last copy from it), so
  // that one buffer is filled while the other's copy runs. nullptr where
  // the device has none (or cannot lock that much): stage in any host
  // memory and CopyToDevice. For one thread at a time.
  virtual void* Staging(int which, size_t bytes) { return nullptr; }
  // Copies the first `bytes` of Staging(which) to `dst`; kernels issued
  // after see them. May return before the copy is done. Only where Staging
  // gave a buffer.
  virtual void CopyFromStaging(int which, void* dst, size_t bytes) {}
  // Device -> host, after every kernel issued before.
  virtual void CopyToHost(void* dst, const void* src, size_t bytes) = 0;
  // `rows` rows of `width` bytes, `spitch` bytes apart in device memory,
  // `dpitch` bytes apart in host memory.
  virtual void CopyToHost2D(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                            size_t rows) = 0;
  virtual void CopyOnDevice(void* dst, const void* src, size_t bytes) = 0;
  virtual void SetZero(void* dst, size_t bytes) = 0;
  // Device -> host from a thread other than the compute thread (the KV
  // backup writer), concurrently with kernels: reads bytes that kernels
  // finished writing before the compute thread's last Synchronize or
  // copy to the host, and that no kernel writes meanwhile.
  virtual void BackgroundCopyToHost(void* dst, const void* src, size_t bytes) = 0;
  // Host -> device from a thread other than the compute thread (a
  // recovery's KV restore while the weights move), concurrently with the
  // compute thread's copies: complete on return, into memory no kernel
  // reads or writes meanwhile.
  virtual void BackgroundCopyToDevice(void* dst, const void* src, size_t bytes) = 0;
  // Several BackgroundCopyToDevice (BackgroundCopyToHost) at once, complete
  // on return (a backend whose copies queue on a device may wait once for
  // all of them).
  struct HostCopy {
    void* dst;
    const void* src;
    size_t bytes;
  };
  // Appends `c` to `batch`, as a longer last copy where it continues that
  // copy on both sides (a KV page's keys then values, consecutive pages that
  // lie side by side): fewer copies, each a round trip on some devices.
  static void AppendCopy(std::vector<HostCopy>& batch, const HostCopy& c) {
    if (c.bytes == 0) return;
    if (!batch.empty()) {
      HostCopy& last = batch.back();
      if (static_cast<char*>(last.dst) + last.bytes == c.dst &&
          static_cast<const char*>(last.src) + last.bytes == c.src) {
        last.bytes += c.bytes;
        return;
      }
    }
    batch.push_back(c);
  }
  virtual void BackgroundCopiesToDevice(const HostCopy* copies, size_t n) {
    for (size_t i = 0; i < n; ++i)
      BackgroundCopyToDevice(copies[i].dst, copies[i].src, copies[i].bytes);
  }
  virtual void BackgroundCopiesToHost(const HostCopy* copies, size_t n) {
    for (size_t i = 0; i < n; ++i)
      BackgroundCopyToHost(copies[i].dst, copies[i].src, copies[i].bytes);
  }
  // Host memory that copies to and from this device use often (the shared
  // regions a device process maps: logits, the KV backup): a backend whose
  // copies are faster from page-locked memory locks it, where the system
  // lets it, until the backend is destroyed; otherwise nothing. Copies work
  // either way.
  virtual void PinHostMemory(void* p, size_t bytes) {}
  // Waits until every kernel issued has finished.
  virtual void Synchronize() = 0;
  // Called, on the thread that issues the kernels, before the backend waits
  // for their stream (Synchronize, a copy to the host, timing a kernel the
  // first time it runs): it must leave nothing on that stream that may never
  // finish. A device group's operations started and not yet waited for
  // (DeviceGroup) are: their wait, under the group's deadline, ends them
  // where a member failed. Set while such operations may be in flight;
  // empty: none.
  virtual void SetBeforeWait(std::function<void()> f) {}

  // Device memory other device processes on the same device map (their
  // collectives read one another's buffers rather than staging through the
  // host): `bytes`, and a handle of at most kPeerHandleBytes that names it
  // to OpenPeerMemory in another process of this host. An error where the
  // backend cannot share its memory. Freed by FreePeerMemory. Whether a
  // peer may still read it after the owner died is the backend's: with the
  // CPU backend's and CUDA's virtual memory API's, yes (a mapping keeps it);
  // with CUDA IPC's (a fallback), undefined.
  static constexpr size_t kPeerHandleBytes = 120;
  struct PeerMemory {
    void* data = nullptr;
    std::string handle;
  };
  virtual Result<PeerMemory> AllocatePeerMemory(size_t bytes) {
    return Unavailable("this device cannot share its memory with other processes");
  }
  virtual void FreePeerMemory(void* p, size_t bytes) {}
  // Another process's AllocatePeerMemory(bytes), mapped here: an error
  // where it is on another host or device, or gone.
  virtual Result<void*> OpenPeerMemory(const std::string& handle, size_t bytes) {
    return Unavailable("this device cannot map other processes' memory");
  }
  virtual void ClosePeerMemory(void* p, size_t bytes) {}

  // Collectives by the device's own library among device processes on
  // distinct devices of one host (NCCL between GPUs), in device memory on
  // the compute stream: the group's members each join with the id one of
  // them made, then start the same operations in the same order. Nothing
  // here waits for a peer: each start returns at once, and Done() says
  // whether the operation started last (or the join) has finished, so that
  // the caller waits under its group's deadline and abort
  // (Communicator::Await). A dead or hung peer leaves an operation
  // unfinished until Abort.
  class DeviceGroup {
   public:
    // Aborts (never waits for a peer).
    virtual ~DeviceGroup() = default;
    // Whether the join, or every operation started, has finished; an
    // error where the library reported one (the group is then unusable).
    virtual Result<bool> Done() = 0;
    // Operations started since the join, numbered from 1 in start order;
    // whether those up to the n-th (n <= started()) have finished, as Done.
    virtual uint64_t started() const = 0;
    virtual Result<bool> Reached(uint64_t n) = 0;
    // Whether the operation started last is on the device's stream: the
    // work issued after it then runs after it. Until then, nothing may be
    // issued that reads what it writes, and no operation may start. An
    // error where the library reported one.
    virtual Result<bool> Enqueued() { return Done(); }
    // Operations start in the same order on every member, each once the one
    // before is enqueued (not finished): they run in that order on the
    // device's stream, among its other work.
    //
    // data[i] = the sum over the members of their data[i], i < count, as
    // integers (wrapping): exact in any order.
    virtual Status StartAllReduce(int64_t* data, size_t count) = 0;
    // recv[r * count + i] = member r's send[i], i < count.
    virtual Status StartAllGather(const float* send, size_t count, float* recv) = 0;
    // Ends the group's operations under way (their results undefined) and
    // lets go of its resources; every later call fails.
    virtual void Abort() = 0;
    // Ends the operations under way (their results undefined) but keeps
    // the group for a Shrink: true where the library can (NCCL's
    // ncclCommRevoke, 2.28 and later; Done() then says whether the group
    // has settled, and no operation may start on it), else it aborts and
    // says false: a library without the call, a group whose join did not
    // finish, or that reported an error. Again on a revoked group, true.
    virtual bool Revoke() {
      Abort();
      return false;
    }
    // Starts joining the group of this one's members but `excluded` (its
    // ranks, ascending, at least one, not this member's; the others keep
    // their order, ranked from 0) without a new id, by the library's own
    // shrink (ncclCommShrink), which every remaining member calls alike.
    // Only on a group revoked and settled, outside a graph's capture. Once started, the new group
    // carries this one (which every later call finds aborted) until its
    // join finishes, and aborts it then, or with itself. An error where
    // the library cannot, or the shrink did not start: this group is then
    // as it was.
    virtual Result<std::unique_ptr<DeviceGroup>> Shrink(const std::vector<int>& excluded) {
      return Unavailable("this library cannot shrink a group");
    }
  };
  // This device among the host's, for telling whether members are on
  // distinct devices (a GPU's PCI bus id); "" where the backend has no
  // library of collectives, or it is off or missing.
  virtual std::string CollectiveDevice() { return ""; }
  // A new group's id, made by one member and given to every other (at most
  // kDeviceGroupIdBytes).
  static constexpr size_t kDeviceGroupIdBytes = 128;
  virtual Result<std::string> NewDeviceGroupId() {
    return Unavailable("this device has no library of collectives");
  }
  // Starts joining the group `id` as member `rank` of `size`: finished when
  // Done() says so.
  virtual Result<std::unique_ptr<DeviceGroup>> JoinDeviceGroup(const std::string& id, int rank,
                                                               int size) {
    return Unavailable("this device has no library of collectives");
  }
};

// Device memory owned by one object: freed with it. Grows by Reserve.
template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  DeviceArray(DeviceMemory* mem, size_t n) : mem_(mem) { Reserve(n); }
  ~DeviceArray() { Release(); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  DeviceArray(DeviceArray&& o) noexcept { *this = std::move(o); }
  DeviceArray& operator=(DeviceArray&& o) noexcept {
    if (this != &o) {
      Release();
      mem_ = o.mem_;
      data_ = o.data_;
      size_ = o.size_;
      o.data_ = nullptr;
      o.size_ = 0;
    }
    return *this;
  }
  void set_memory(DeviceMemory* mem) {
    Release();
    mem_ = mem;
  }
  // At least n elements (contents lost when it grows); returns data().
  T* Reserve(size_t n) {
    if (n > size_) {
      Release();
      // Grow by half again, so a slowly growing step size reallocates rarely.
      const size_t grown = std::max(n, size_ + size_ / 2);
      data_ = static_cast<T*>(mem_->Allocate(grown * sizeof(T)));
      size_ = grown;
    }
    return data_;
  }
  T* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  void Release() {
    if (data_) mem_->Free(data_, size_ * sizeof(T));
    data_ = nullptr;
    size_ = 0;
  }
  DeviceMemory* mem_ = nullptr;
  T* data_ = nullptr;
  size_t size_ = 0;
};

class Backend : public DeviceMemory {
 public:
  ~Backend() override = default;
  virtual std::string name() const = 0;
  virtual int num_threads() const = 0;

  // Linear layers are batch-invariant: every output element is computed by
  // the same operations whatever the number of rows, the other rows and the
  // threads (one chain of fused multiply-adds over k in increasing order), so
  // a row's result depends only on that row and the weights.
  //
  // y[m, n] (+)= x[m, k] * w[n, k]^T   (w in Hugging Face Linear layout)
  virtual void LinearNT(const float* x, int64_t ldx, WeightsRef w, float* y, int64_t ldy, int m,
                        int n, int k, bool accumulate) = 0;
  // y[m, n] (+)= x[m, k] * w[k, n]     (transposed-stored projections)
  virtual void LinearNN(const float* x, int64_t ldx, WeightsRef w, float* y, int64_t ldy, int m,
                        int n, int k, bool accumulate) = 0;
  // Partial sums of items, exactly: k is cut into items of item_k rows of w
  // (head groups, FFN shards); each item's product x[:, item] * w[item, :] is
  // added to acc in fixed point (common/fixed_point.h), so the sum over
  // items is the same whatever their grouping or order.
  // acc[m, n] += sum over items of ToFixed(x[m, item] * w[item, n])
  virtual void LinearNNFixed(const float* x, int64_t ldx, WeightsRef w, int64_t* acc, int64_t ldacc,
                             int m, int n, int k, int item_k) = 0;
  // Whether LinearNNFixed reads weights of `dtype` fastest column-blocked
  // (WeightsRef); it takes row-major ones either way, with the same results.
  virtual bool ColumnBlockedNN(DType dtype) const { return false; }
  // Whether LinearNNFixed takes its items transposed (WeightsRef), and only
  // so.
  virtual bool TransposedNN(DType dtype) const { return false; }
  // Whether LinearNT (and GatherWeightRows) read [n, k] weights blocked
  // (WeightsRef: blocks of 16 rows k-major); else row-major.
  virtual bool BlockedNT(DType dtype) const { return false; }
  // y[r] = x[r] / rms(x[r]) * weight, rows of `dim`.
  virtual void RmsNorm(const float* x, int64_t ldx, const float* weight, float* y, int64_t ldy,
                       int rows, int dim, float eps) = 0;
  // Rotates `heads` heads of each token in place (rotate-half convention).
  // x: head h of token t at x + t * ldx + h * head_stride. cos_sin: a RoPE
  // table (ExtendRopeTable) with rows for every position given.
  virtual void Rope(float* x, int64_t ldx, int64_t head_stride, const int32_t* positions,
                    int tokens, int heads, int head_dim, const float* cos_sin) = 0;
  // The query heads and the keys of the same tokens rotated in one call:
  // Rope(q, ...) then Rope(k, ...), which this default makes.
  virtual void RopeQK(float* q, int64_t ldq, int64_t q_stride, int q_heads, float* k, int64_t ldk,
                      int64_t k_stride, int k_heads, const int32_t* positions, int tokens,
                      int head_dim, const float* cos_sin) {
    Rope(q, ldq, q_stride, positions, tokens, q_heads, head_dim, cos_sin);
    Rope(k, ldk, k_stride, positions, tokens, k_heads, head_dim, cos_sin);
  }
  // FFN shards side by side, each its gate then its up columns: for shard
  // j < shards and i < width,
  //   out[r, j * width + i] = silu(gu[r, 2 j width + i]) * gu[r, (2 j + 1) width + i].
  virtual void SiluMul(const float* gu, int64_t ld_in, float* out, int64_t ld_out, int rows,
                       int width, int shards) = 0;
  // The same with gelu's tanh approximation (GeGLU, Gemma's
  // gelu_pytorch_tanh): gelu(g) = g / 2 (1 + tanh(sqrt(2 / pi) (g + 0.044715 g^3))).
  virtual void GeluTanhMul(const float* gu, int64_t ld_in, float* out, int64_t ld_out, int rows,
                           int width, int shards) = 0;
  // MoE routing: softmax over experts, the top k (the lowest id on ties),
  // their probabilities divided by their sum if `renormalize` (Mixtral,
  // Qwen3-MoE) or as they are (Qwen2-MoE).
  // logits [tokens, experts] -> ids/weights [tokens, k], all device memory.
  virtual void MoeGate(const float* logits, int tokens, int experts, int k, bool renormalize,
                       int32_t* ids, float* weights) = 0;
  // Runs independent attention problems (sequences x head groups); the
  // backend may run them in parallel. Batch-invariant too: a query token's
  // output is the same whatever the chunk it is computed in.
  virtual void Attention(const std::vector<AttentionArgs>& problems) = 0;
  // Data movement between a step's buffers. Index lists are host arrays.
  //
  // out[dst_rows[i], :cols] = row src_rows[i] of the [w_rows, cols] weight w
  // (as it lies: WeightsRef), widened to f32 exactly; i < n.
  virtual void GatherWeightRows(WeightsRef w, int w_rows, int cols, const int32_t* src_rows,
                                const int32_t* dst_rows, int n, float* out, int64_t ldo) = 0;
  // dst[i, :cols] = src[rows[i], :cols], i < n.
  virtual void GatherRows(const float* src, int64_t lds, const int32_t* rows, int n, int cols,
                          float* dst, int64_t ldd) = 0;
  // dst[rows[i], :cols] = AddFixed(dst[rows[i], :cols], src[i, :cols]),
  // i < n; the rows distinct.
  virtual void ScatterAddFixed(const int64_t* src, int64_t lds, const int32_t* rows, int n,
                               int cols, int64_t* dst, int64_t ldd) = 0;
  // x[i] += FromFixed(acc[i]), i < n: the residual stream takes a layer's
  // exact partial sums.
  virtual void AddFixedTo(const int64_t* acc, float* x, int64_t n) = 0;
  // The residual stream takes a layer's sums and the next norm reads it:
  // x += FromFixed(acc), then y = RmsNorm(x) (rows of dim, contiguous), and
  // acc = 0 for the next sums. The same bits as those three calls, which
  // this default makes; a backend may make them one pass.
  virtual void AddFixedToNorm(int64_t* acc, float* x, const float* weight, float* y, int rows,
                              int dim, float eps) {
    const int64_t n = static_cast<int64_t>(rows) * dim;
    AddFixedTo(acc, x, n);
    RmsNorm(x, dim, weight, y, dim, rows, dim, eps);
    SetZero(acc, sizeof(int64_t) * static_cast<size_t>(n));
  }
  // out[i] = srcs[0][i] + srcs[1][i] + ... + srcs[n - 1][i], i < count, added
  // in that order (common/ordered_sums.h: float, each addition rounded;
  // int64_t, fixed-point sums wrapping). srcs: a host array of n device
  // pointers, this backend's memory or peers' (OpenPeerMemory); `out` is
  // none of them.
  virtual void SumArrays(const float* const* srcs, int n, size_t count, float* out) = 0;
  virtual void SumArrays(const int64_t* const* srcs, int n, size_t count, int64_t* out) = 0;
  // x[r, :cols] *= scale[r] (scale: host), r < rows.
  virtual void ScaleRows(float* x, int64_t ldx, const float* scale, int rows, int cols) = 0;
  // x[r, c] += bias[c] (bias: device), r < rows, c < cols: a projection's
  // bias (Qwen2's q, k and v).
  virtual void AddBias(float* x, int64_t ldx, const float* bias, int rows, int cols) = 0;
  // x[i] = cap * tanh(x[i] / cap), i < n: soft-capped logits (Gemma 2's
  // final_logit_softcapping).
  virtual void Softcap(float* x, int64_t n, float cap) = 0;

  // A step's calls as one graph, for steps that repeat with the same
  // shapes (CUDA graphs: one launch instead of hundreds). The model runner
  // brackets a step's device work with BeginGraph(key, argument_bytes) and
  // EndGraph(), `key` naming everything that shapes the calls in between
  // (their order, sizes and buffers; argument_bytes: about how much they
  // upload). The first step of a key runs as usual; the second is recorded
  // and run as a graph; later ones replay it: the calls then only stage
  // their arguments, in the same order and sizes, and launch nothing.
  // Between the two no call may return data to the host, allocate or free.
  // Returns whether the step is bracketed; false: run it as usual (no
  // EndGraph). Freeing device memory forgets every graph (they may name it).
  virtual bool BeginGraph(uint64_t key, size_t argument_bytes) { return false; }
  virtual void EndGraph() {}

  // How the backend chose its kernels for the shapes it has run, one line
  // each (a benchmark prints them); none where nothing is chosen.
  virtual std::vector<std::string> KernelChoices() const { return {}; }

  // Timestamps in the device's queue, for a benchmark's breakdown of a
  // step without waiting between calls: Mark() records one when the device
  // reaches it (after every kernel issued before), TakeMarks() waits for
  // the device and returns the marks since the last TakeMarks, in seconds
  // from the first of them. This default stamps the host clock, which is
  // the device's for a backend whose calls finish before they return (the
  // CPU's).
  virtual void Mark() { marks_.push_back(MonotonicNanos() * 1e-9); }
  virtual std::vector<double> TakeMarks() {
    std::vector<double> out;
    out.swap(marks_);
    for (size_t i = out.size(); i-- > 0;) out[i] -= out[0];
    return out;
  }

  // Picks a token from logits [vocab]. `counter` makes each draw of a seeded
  // request distinct and reproducible (use the token's position).
  virtual int Sample(const float* logits, int vocab, const SamplingParams& params,
                     uint64_t counter) = 0;

 private:
  std::vector<double> marks_;
};

struct CpuBackendOptions {
  int threads = 1;
  // The instruction-set level of the GEMM kernels. Unset: the best the CPU
  // supports (HostCpuFeatures()); a level the CPU lacks is lowered to the
  // best it has. Every level computes the same results (backend/cpu/gemm.h).
  std::optional<CpuIsa> isa;
  // bf16 weights: whether the avx512 level takes products by vdpbf16ps where
  // the CPU has it and it computes the bf16 chain (true), by fused
  // multiply-adds (false), or unset: by vdpbf16ps where it pays on this CPU
  // (cpu::Gemm's default, measured at start-up). The same results either
  // way (backend/cpu/gemm.h).
  std::optional<bool> dpbf16;
};

// The CPU backend: hand-written batch-invariant kernels (register-tiled GEMM
// built per instruction-set level, paged attention), OpenMP threads.
std::unique_ptr<Backend> MakeCpuBackend(const CpuBackendOptions& options);
std::unique_ptr<Backend> MakeCpuBackend(int num_threads);

// Host memory as device memory: what the CPU backend allocates and copies
// with (one instance, any thread). Allocations of 2 MiB and more are
// mapped lazily with transparent huge pages.
DeviceMemory& HostMemory();

// How the CUDA backend multiplies by 16-bit weights:
//  - kLt: cuBLASLt's tensor cores (a fixed algorithm per shape, checked to
//    keep a row's bits whatever the batch), fixed-point items as a batched
//    product whose f32 items are then summed exactly;
//  - kFused: cuBLASLt for [n, k] products, and the engine's own
//    tensor-core kernel for fixed-point items, converting each item's chain
//    in registers (no f32 product per item in memory);
//  - kChain: the CPU backend's chains (its products bit for bit, on CUDA
//    cores).
// f32 weights always take the chains.
enum class GpuGemm { kLt = 0, kChain = 1, kFused = 2 };

// How the CUDA backend attends:
//  - kCores: f32 on CUDA cores, blocks of 16 queries sharing chunks of 32
//    keys;
//  - kTensor: on tensor cores (mma.sync m16n8k16), blocks of 64 queries
//    sharing chunks of 64 keys, queries, keys, values and the softmax's
//    weights rounded to bf16, scores and sums in f32; head dims that are
//    multiples of 16 up to 128 (others on CUDA cores);
//  - kSegments: as kCores, each query's keys in segments of 512 at fixed
//    positions whose softmax states are merged in order, so that a decode
//    step over a long context splits its keys over one block a segment
//    (kCores walks them in one block).
// Each is batch- and chunk-invariant: a query's result depends only on its
// own keys, taken in chunks at fixed positions.
enum class GpuAttention { kCores = 0, kTensor = 1, kSegments = 2 };

struct CudaBackendOptions {
  int gpu = 0;  // CUDA device ordinal
  GpuGemm gemm = GpuGemm::kLt;
  bool graphs = false;  // steps that repeat their shapes as CUDA graphs (BeginGraph)
  GpuAttention attention = GpuAttention::kCores;
  // Kernels launched with programmatic dependent launch (kernels.h:
  // SetDependentLaunch): each may start while the one before it finishes.
  bool dependent_launch = false;
  // Called now and then while the backend does long work of its own inside
  // a call (checking and timing the algorithms of a product it meets first):
  // a sign of life for whoever watches the device for hangs, since such a
  // call may run far longer than a step's kernels. Unset: nobody is told.
  std::function<void()> busy;
  // The ring a call's index lists and tables are uploaded through (pinned
  // host memory and device memory of this size each), and the size it
  // grows to, doubling, when a step's uploads pass its end (beyond which
  // they wrap: the step waits there for the device to read them all).
  // With graphs it starts at 48 MiB at least.
  size_t upload_ring_bytes = size_t{16} << 20;
  size_t max_upload_ring_bytes = size_t{128} << 20;
};

// The CUDA backend (backend/cuda): bf16, f16 and f32 weights, cuBLASLt
// GEMMs with one algorithm per shape, the engine's own kernels for the rest;
// batch-invariant like the CPU backend. An error where the program was
// built without CUDA, or the GPU cannot be used.
Result<std::unique_ptr<Backend>> MakeCudaBackend(const CudaBackendOptions& options);
// Whether this build has the CUDA backend.
bool CudaBackendBuilt();

// RoPE inverse frequencies [head_dim / 2] with Llama-3 or linear scaling if
// configured; `local`: a sliding layer's, from rope_local_theta unscaled
// (Gemma 3).
std::vector<float> RopeInvFreq(const ModelConfig& config, bool local = false);

// Extends a RoPE table to at least `positions` rows: row p, head_dim floats,
// holds cos(p * inv_freq[i]) for i < head_dim / 2, then sin of the same
// (each in double, times `scale` (LongRoPE's attention factor), then
// rounded). Every layer's rotation of a step reads the same rows.
void ExtendRopeTable(const std::vector<float>& inv_freq, int positions, std::vector<float>* table,
                     double scale = 1.0);

}  // namespace failsafe
