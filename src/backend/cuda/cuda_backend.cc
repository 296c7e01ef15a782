// The CUDA backend: device memory by cudaMalloc, every kernel on one
// stream, small per-call arguments (index lists, attention problems and
// page tables) uploaded through a pinned ring.
#include <cuda.h>
#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <new>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/attention_plan.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/fixed_gemm.h"
#include "backend/cuda/gemm_lt.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/nccl_group.h"
#include "backend/peer_memory.h"
#include "backend/sampling.h"
#include "common/fd_share.h"
#include "common/log.h"

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
// Rows of a fused fixed-point product up to which the kernel takes its
// activations as f32.
constexpr int kFixedF32Rows = 16;
// With graphs: a graphed step's arguments must fit without wrapping.
constexpr size_t kGraphRingBytes = 48u << 20;
constexpr size_t kMaxGraphs = 64;

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const CudaBackendOptions& o)
      : gpu_(o.gpu),
        gemm_(o.gemm),
        graphs_enabled_(o.graphs),
        attention_(o.attention),
        dependent_launch_(o.dependent_launch),
        busy_(o.busy) {
    first_ring_bytes_ = std::max<size_t>(o.upload_ring_bytes, 256);
    max_ring_bytes_ = std::max(o.max_upload_ring_bytes, first_ring_bytes_);
  }

  Status Init() {
    cuda::PrepareNcclEnvironment();  // before CUDA's own threads may read the environment
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) return FailedPrecondition("no CUDA device: {}", cudaGetErrorString(e));
    if (gpu_ < 0 || gpu_ >= count)
      return InvalidArgument("GPU {} does not exist ({} CUDA devices)", gpu_, count);
    e = cudaSetDevice(gpu_);
    if (e != cudaSuccess) return FailedPrecondition("GPU {}: {}", gpu_, cudaGetErrorString(e));
    // A thread waiting for the device yields its core rather than spin on
    // it: device processes share a host's cores (8 to a GPU in the failure
    // tests), and each has its step's thread and copy threads waiting. On
    // an idle core a yield returns at once, as a spin would.
    e = cudaSetDeviceFlags(cudaDeviceScheduleYield);
    if (e != cudaSuccess) {
      cudaGetLastError();  // not sticky
      FS_LOG_WARN("GPU {}: waits spin as the runtime chooses ({})", gpu_, cudaGetErrorString(e));
    }
    FS_CUDA_CHECK(cudaDeviceGetAttribute(&sms_, cudaDevAttrMultiProcessorCount, gpu_));
    int pools = 0;
    FS_CUDA_CHECK(cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, gpu_));
    allocator_ = pools ? AllocatorFromEnvironment() : Allocator::kSync;
    if (allocator_ == Allocator::kPool)
      FS_CUDA_CHECK(cudaStreamCreateWithFlags(&alloc_stream_, cudaStreamNonBlocking));
#ifndef FAILSAFE_CUDA_EMULATION
    // The kernels wait for the work before them only where compiled for
    // Hopper or later and running on such a GPU: elsewhere a dependent
    // launch could let a kernel read its inputs before they are written.
    if (dependent_launch_) {
      int major = 0;
      FS_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, gpu_));
      const int built = cuda::KernelsArchitecture();
      if (major < 9 || built < 90) {
        FS_LOG_WARN(
            "GPU {}: dependent launch off (needs a GPU of compute capability 9.0 or later and "
            "kernels built for it; this GPU's is {}.x, the kernels' {})",
            gpu_, major, built);
        dependent_launch_ = false;
      }
    }
#endif
    cuda::SetDependentLaunch(dependent_launch_);
    FS_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    FS_CUDA_CHECK(cudaMallocHost(&result_, 64));
    GrowRing(graphs_enabled_ ? std::max(kGraphRingBytes, first_ring_bytes_) : first_ring_bytes_);
    lt_ = std::make_unique<cuda::LtGemm>(stream_, allocator_ == Allocator::kPool, busy_,
                                         [this] { BeforeWait(); });
    int shared_limit = 0;
    FS_CUDA_CHECK(
        cudaDeviceGetAttribute(&shared_limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, gpu_));
#ifdef FAILSAFE_CUDA_EMULATION
    constexpr int kTuneRows = 0;  // emulated kernels: drawn, not timed
#else
    constexpr int kTuneRows = INT_MAX;
#endif
    fixed_ = std::make_unique<cuda::FixedGemm>(sms_, static_cast<size_t>(shared_limit), stream_,
                                               kTuneRows, allocator_ == Allocator::kPool, busy_,
                                               [this] { BeforeWait(); });
    return Status::Ok();
  }

  ~CudaBackend() override {
    if (!stream_) return;
    cudaStreamSynchronize(stream_);
    for (auto& [p, m] : vmm_opened_) VmmUnmap(p, m);
    for (auto& [p, m] : vmm_owned_) {
      m.second.reset();
      VmmUnmap(p, m.first);
    }
    ForgetGraphs();
    for (cudaEvent_t e : marks_) cudaEventDestroy(e);
    for (StagingBuffer& b : staging_) {
      if (b.data) cudaFreeHost(b.data);
      if (b.done) cudaEventDestroy(b.done);
    }
    pin_stop_.store(true);
    for (std::thread& t : pinners_) t.join();
    for (const auto& region : pinned_host_) cudaHostUnregister(region.first);
    x16_ = DeviceArray<uint16_t>();
    parts_ = DeviceArray<float>();
    sort_ = DeviceArray<float>();
    sort_ids_ = DeviceArray<int>();
    sort_scratch_ = DeviceArray<unsigned char>();
    states_ = DeviceArray<float>();
    lt_.reset();
    fixed_.reset();
    if (ring_) cudaFree(ring_);
    if (pinned_) cudaFreeHost(pinned_);
    if (result_) cudaFreeHost(result_);
    for (cudaStream_t stream : copy_streams_) cudaStreamDestroy(stream);
    cudaStreamDestroy(stream_);
    stream_ = nullptr;
    if (alloc_stream_) cudaStreamDestroy(alloc_stream_);
  }

  std::string name() const override { return "cuda"; }
  int num_threads() const override { return 1; }

  // --- DeviceMemory ---
  bool host_memory() const override { return false; }
  // Device memory comes from the device's stream-ordered pool where it has
  // one (FAILSAFE_CUDA_ALLOCATOR=sync: cudaMalloc and cudaFree): cudaFree
  // waits for the whole device, every stream, so a recovery's weights,
  // which free the segments they replace, would wait for the KV restore's
  // copies running beside them, and a step buffer that grows for the
  // backup writer's copies. A free is ordered on the compute stream (the
  // memory's last user: the background copies' KV pages are freed only
  // once nothing copies). An allocation is made on a stream of its own,
  // otherwise idle, and waited for, so that any stream may use the memory
  // at once, as cudaMalloc's; it waits for the compute stream only where
  // the pool gives it memory freed there that the stream has not yet
  // reached.
  enum class Allocator { kPool, kSync };
  static Allocator AllocatorFromEnvironment() {
    const char* v = std::getenv("FAILSAFE_CUDA_ALLOCATOR");
    if (v && std::strcmp(v, "sync") == 0) return Allocator::kSync;
    if (v && *v && std::strcmp(v, "pool") != 0)
      FS_LOG_WARN("FAILSAFE_CUDA_ALLOCATOR={}: neither pool nor sync; as if unset", v);
    return Allocator::kPool;
  }
  // Out of memory is std::bad_alloc (backend.h); any other failure (a
  // device that faulted: its error is sticky) stops the process, as every
  // other call's does.
  void* Allocate(size_t bytes) override {
    FS_CHECK_MSG(graph_ == Graph::kOff, "device memory allocated inside a graphed step");
    void* p = nullptr;
    const size_t n = std::max<size_t>(bytes, 1);
    const cudaError_t e =
        allocator_ == Allocator::kPool ? cudaMallocAsync(&p, n, alloc_stream_) : cudaMalloc(&p, n);
    if (cuda::OutOfDeviceMemory(e)) throw std::bad_alloc();
    if (allocator_ == Allocator::kPool) {
      // (Memory the compute stream freed may come back behind its work.)
      BeforeWait();
      FS_CUDA_CHECK(cudaStreamSynchronize(alloc_stream_));
    }
    return p;
  }
  void Free(void* p, size_t) override {
    if (!p) return;
    FS_CHECK_MSG(graph_ == Graph::kOff, "device memory freed inside a graphed step");
    ForgetGraphs();  // a graph may name this memory
    const bool ordered = allocator_ == Allocator::kPool && stream_;
    if (!ordered) BeforeWait();  // cudaFree waits for the whole device
    const cudaError_t e = ordered ? cudaFreeAsync(p, stream_) : cudaFree(p);
    // At exit the runtime may be gone before the last buffers.
    FS_CHECK_MSG(e == cudaSuccess || e == cudaErrorCudartUnloading, "cudaFree: {}",
                 cudaGetErrorString(e));
  }
  void CopyToDevice(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    if (graph_ != Graph::kOff) {  // staged in the ring, which the graph copies from
      const void* staged = Upload(static_cast<const unsigned char*>(src), bytes);
      CopyUploads();
      cuda::CountDeviceWrite();
      if (Launching())
        FS_CUDA_CHECK(cudaMemcpyAsync(dst, staged, bytes, cudaMemcpyDeviceToDevice, stream_));
      return;
    }
    // From pageable memory the call returns once the bytes are staged; from
    // page-locked memory the device reads them later, and the source may be
    // reused on return (backend.h), so that copy is waited for. (A large
    // one from pageable memory may wait for the stream in the driver.)
    if (bytes > kPageableStagedBytes && !PinnedHere(src)) BeforeWait();
    cuda::CountDeviceWrite();
    bool pinned = false;
    ForEachPart(src, bytes, [&](size_t at, size_t part) {
      const char* from = static_cast<const char*>(src) + at;
      FS_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(dst) + at, from, part,
                                    cudaMemcpyHostToDevice, stream_));
      pinned = pinned || PinnedHere(from);
    });
    if (pinned) {
      BeforeWait();
      FS_CUDA_CHECK(cudaStreamSynchronize(stream_));
    }
  }
  // Two page-locked buffers, kept once made (a recovery's weights go
  // through them: making them then would cost tens of milliseconds).
  void* Staging(int which, size_t bytes) override {
    FS_CHECK(which == 0 || which == 1);
    StagingBuffer& b = staging_[which];
    if (b.pending) {
      FS_CUDA_CHECK(cudaEventSynchronize(b.done));
      b.pending = false;
    }
    if (b.bytes < bytes) {
      if (b.data) FS_CUDA_CHECK(cudaFreeHost(b.data));
      b.data = nullptr;
      b.bytes = 0;
      if (cudaMallocHost(&b.data, bytes) != cudaSuccess) {
        cudaGetLastError();  // not sticky
        b.data = nullptr;
        FS_LOG_WARN("GPU {}: no page-locked staging of {} bytes; copies in from pageable memory",
                    gpu_, bytes);
        return nullptr;
      }
      b.bytes = bytes;
      if (!b.done) FS_CUDA_CHECK(cudaEventCreateWithFlags(&b.done, cudaEventDisableTiming));
    }
    return b.data;
  }
  void CopyFromStaging(int which, void* dst, size_t bytes) override {
    FS_CHECK(which == 0 || which == 1);
    StagingBuffer& b = staging_[which];
    FS_CHECK_MSG(b.data && bytes <= b.bytes && !b.pending, "a copy from staging not had");
    FS_CHECK_MSG(graph_ == Graph::kOff, "a copy from staging inside a graphed step");
    if (bytes == 0) return;
    cuda::CountDeviceWrite();
    FS_CUDA_CHECK(cudaMemcpyAsync(dst, b.data, bytes, cudaMemcpyHostToDevice, stream_));
    FS_CUDA_CHECK(cudaEventRecord(b.done, stream_));
    b.pending = true;
  }

  // Whether p lies in host memory page-locked for CUDA (by PinHostMemory or
  // anyone else in this process).
  static bool PinnedHere(const void* p) {
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
      cudaGetLastError();  // not sticky
      return false;
    }
    return a.type == cudaMemoryTypeHost;
  }
  // Cut where the host side crosses a seam of a region locked piece by
  // piece (ForEachPart), as every copy to or from the host is.
  void CopyToHost(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    FS_CHECK_MSG(graph_ == Graph::kOff, "a copy to the host inside a graphed step");
    BeforeWait();  // (one to pageable memory waits for the stream)
    ForEachPart(dst, bytes, [&](size_t at, size_t part) {
      FS_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(dst) + at,
                                    static_cast<const char*>(src) + at, part,
                                    cudaMemcpyDeviceToHost, stream_));
    });
    Synchronize();
  }
  void CopyToHost2D(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                    size_t rows) override {
    if (rows == 0 || width == 0) return;
    FS_CHECK_MSG(graph_ == Graph::kOff, "a copy to the host inside a graphed step");
    BeforeWait();  // (one to pageable memory waits for the stream)
    int parts = 0;
    ForEachPart(dst, (rows - 1) * dpitch + width, [&](size_t, size_t) { ++parts; });
    if (parts == 1) {
      FS_CUDA_CHECK(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, cudaMemcpyDeviceToHost,
                                      stream_));
    } else {  // across a seam: row by row, each cut there
      for (size_t r = 0; r < rows; ++r) CopyRowToHost(dst, dpitch, src, spitch, width, r);
    }
    Synchronize();
  }
  void CopyRowToHost(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                     size_t r) {
    char* to = static_cast<char*>(dst) + r * dpitch;
    const char* from = static_cast<const char*>(src) + r * spitch;
    ForEachPart(to, width, [&](size_t at, size_t part) {
      FS_CUDA_CHECK(cudaMemcpyAsync(to + at, from + at, part, cudaMemcpyDeviceToHost, stream_));
    });
  }
  void CopyOnDevice(void* dst, const void* src, size_t bytes) override {
    cuda::CountDeviceWrite();
    if (bytes && Launching())
      FS_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
  }
  void SetZero(void* dst, size_t bytes) override {
    cuda::CountDeviceWrite();
    if (bytes && Launching()) FS_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, stream_));
  }
  void BackgroundCopyToHost(void* dst, const void* src, size_t bytes) override {
    BackgroundCopy(dst, src, bytes, cudaMemcpyDeviceToHost);
  }
  void BackgroundCopyToDevice(void* dst, const void* src, size_t bytes) override {
    BackgroundCopy(dst, src, bytes, cudaMemcpyHostToDevice);
  }
  void BackgroundCopiesToHost(const HostCopy* copies, size_t n) override {
    BackgroundCopies(copies, n, cudaMemcpyDeviceToHost);
  }
  void BackgroundCopiesToDevice(const HostCopy* copies, size_t n) override {
    BackgroundCopies(copies, n, cudaMemcpyHostToDevice);
  }
  // On a copy stream of the call's own, one wait for them all: the backup
  // writer, a background restore and the compute thread's host-tier hits
  // never queue behind one another's jobs. The stream goes back to the pool
  // idle (waited for), so there are as many as calls ever ran at once, not
  // one per thread that ever copied (a restore thread per recovery).
  void BackgroundCopies(const HostCopy* copies, size_t n, cudaMemcpyKind kind) {
    FS_CUDA_CHECK(cudaSetDevice(gpu_));  // this thread's device
    const cudaStream_t stream = TakeCopyStream();
    size_t issued = 0;
    for (size_t i = 0; i < n; ++i) {
      const HostCopy& c = copies[i];
      ForEachPart(kind == cudaMemcpyDeviceToHost ? c.dst : c.src, c.bytes,
                  [&](size_t at, size_t part) {
                    FS_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(c.dst) + at,
                                                  static_cast<const char*>(c.src) + at, part, kind,
                                                  stream));
                    ++issued;
                  });
    }
    if (issued > 0) FS_CUDA_CHECK(cudaStreamSynchronize(stream));
    std::lock_guard<std::mutex> lock(copy_mu_);
    idle_copy_streams_.push_back(stream);
  }
  cudaStream_t TakeCopyStream() {
    std::lock_guard<std::mutex> lock(copy_mu_);
    if (!idle_copy_streams_.empty()) {
      const cudaStream_t s = idle_copy_streams_.back();
      idle_copy_streams_.pop_back();
      return s;
    }
    cudaStream_t s = nullptr;
    FS_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    copy_streams_.push_back(s);
    return s;
  }
  // f(offset, bytes) for the parts of a copy of `bytes` whose host side
  // starts at `host`: the whole, except where it crosses a seam between
  // the pieces of a region locked piece by piece (PinHostMemory), which
  // cut it, so that each part lies in one registration or in none (a
  // piece locked and the next not yet, or two registrations).
  template <typename F>
  void ForEachPart(const void* host, size_t bytes, F&& f) {
    const char* h = static_cast<const char*>(host);
    for (size_t done = 0; done < bytes;) {
      size_t part = bytes - done;
      {
        std::lock_guard<std::mutex> lock(copy_mu_);
        for (const auto& [base, size] : pieced_regions_) {
          if (h + done < base || h + done >= base + size) continue;
          const size_t into = static_cast<size_t>(h + done - base) % kPinPieceBytes;
          part = std::min(part, kPinPieceBytes - into);
        }
      }
      f(done, part);
      done += part;
    }
  }
  // A region up to kPinAtOnceBytes is locked before this returns; a larger
  // one (the KV backup, tens of GiB that every device process maps) in
  // pieces by a thread of its own, so that a device process (a replacement
  // too) starts without waiting for it. A copy from a piece not yet locked
  // goes as from pageable memory: slower, and as correct.
  static constexpr size_t kPinAtOnceBytes = size_t{1} << 30;
  static constexpr size_t kPinPieceBytes = size_t{256} << 20;
  void PinHostMemory(void* p, size_t bytes) override {
    if (!p || bytes == 0) return;
    if (bytes <= kPinAtOnceBytes) {
      PinPiece(p, bytes);
      return;
    }
    {
      std::lock_guard<std::mutex> lock(copy_mu_);
      pieced_regions_.emplace_back(static_cast<const char*>(p), bytes);
    }
    pinners_.emplace_back([this, p, bytes] {
      if (cudaSetDevice(gpu_) != cudaSuccess) {
        cudaGetLastError();
        return;
      }
      const auto start = std::chrono::steady_clock::now();
      size_t done = 0;
      while (done < bytes && !pin_stop_.load()) {
        const size_t piece = std::min(kPinPieceBytes, bytes - done);
        if (!PinPiece(static_cast<char*>(p) + done, piece)) break;
        done += piece;
      }
      const double s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      FS_LOG_INFO("page-locked {:.2f} of {:.2f} GiB of host memory in {:.2f} s",
                  done / 1073741824.0, bytes / 1073741824.0, s);
    });
  }
  bool PinPiece(void* p, size_t bytes) {
    const cudaError_t e = cudaHostRegister(p, bytes, cudaHostRegisterPortable);
    if (e != cudaSuccess) {
      cudaGetLastError();  // not sticky: clear it
      FS_LOG_WARN("host memory of {} bytes stays pageable (copies slower): {}", bytes,
                  cudaGetErrorString(e));
      return false;
    }
    std::lock_guard<std::mutex> lock(copy_mu_);
    pinned_host_.push_back({p, bytes});
    return true;
  }
  // On the copy stream, from any thread, complete on return.
  void BackgroundCopy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
    const HostCopy c{dst, src, bytes};
    BackgroundCopies(&c, 1, kind);
  }
  void SetBeforeWait(std::function<void()> f) override {
    // (Other threads read the thread, and so never the hook.)
    before_wait_thread_.store(std::thread::id(), std::memory_order_release);
    before_wait_ = std::move(f);
    if (before_wait_)
      before_wait_thread_.store(std::this_thread::get_id(), std::memory_order_release);
  }
  void Synchronize() override {
    FS_CHECK_MSG(graph_ == Graph::kOff, "a synchronization inside a graphed step");
    BeforeWait();
    FS_CHECK_MSG(ring_copied_ == ring_used_, "an upload never copied to the device");
    FS_CUDA_CHECK(cudaStreamSynchronize(stream_));
    ring_used_ = ring_copied_ = 0;  // every upload was read
  }

  // --- peer memory: processes of this host map one another's memory ---
  // Two kinds (FAILSAFE_PEER_MEMORY=vmm|ipc picks one; by default VMM
  // where the GPU supports it):
  // - VMM: CUDA's virtual memory API. cuMemCreate's memory, exported as a
  //   file descriptor that this process serves (common/fd_share.h); a peer
  //   imports the descriptor and maps the memory. It lives while any
  //   process holds a handle to it, so a peer that reads it when its owner
  //   dies (a device killed with -9 mid-collective) reads it still.
  // - IPC: cudaMalloc's memory by cudaIpcGetMemHandle. Reading it after its
  //   owner freed it (as a killed process does) is undefined by CUDA's
  //   documentation.
  // Either handle carries this host's boot id and the allocation's size. A
  // peer on another GPU maps it where the two GPUs reach each other (peer
  // access), else its open fails and the group stages through the host.
  enum class PeerKind { kAuto, kVmm, kIpc };
  static PeerKind PeerKindFromEnvironment() {
    const char* v = std::getenv("FAILSAFE_PEER_MEMORY");
    if (v && std::strcmp(v, "ipc") == 0) return PeerKind::kIpc;
    if (v && std::strcmp(v, "vmm") == 0) return PeerKind::kVmm;
    if (v && *v) FS_LOG_WARN("FAILSAFE_PEER_MEMORY={}: neither vmm nor ipc; as if unset", v);
    return PeerKind::kAuto;
  }
  struct IpcHandle {
    PeerHandleHead head;
    cudaIpcMemHandle_t ipc;
  };
  static_assert(sizeof(IpcHandle) <= kPeerHandleBytes);
  static constexpr uint32_t kIpcMagic = 0x49434653;  // "FSCI"
  struct VmmHandle {
    PeerHandleHead head;                 // bytes: granularity rounded
    char share[FdShare::kMaxNameChars];  // the owner's FdShare
  };
  static_assert(sizeof(VmmHandle) <= kPeerHandleBytes);
  static constexpr uint32_t kVmmMagic = 0x56434653;                    // "FSCV"
  using VmmMapping = std::pair<CUmemGenericAllocationHandle, size_t>;  // handle, bytes
  // The driver's virtual memory calls, by the runtime's entry points (no
  // link to the driver library).
  struct Vmm {
    decltype(&cuMemCreate) create = nullptr;
    decltype(&cuMemRelease) release = nullptr;
    decltype(&cuMemAddressReserve) reserve = nullptr;
    decltype(&cuMemAddressFree) address_free = nullptr;
    decltype(&cuMemMap) map = nullptr;
    decltype(&cuMemUnmap) unmap = nullptr;
    decltype(&cuMemSetAccess) set_access = nullptr;
    decltype(&cuMemExportToShareableHandle) export_fd = nullptr;
    decltype(&cuMemImportFromShareableHandle) import_fd = nullptr;
    decltype(&cuMemGetAllocationGranularity) granularity = nullptr;
    decltype(&cuDeviceGetAttribute) attribute = nullptr;
  };
  // The calls, where the driver has them and this GPU exports its memory
  // as file descriptors; otherwise why not.
  Status LoadVmm() {
    if (vmm_loaded_) return vmm_status_;
    vmm_loaded_ = true;
    auto load = [](const char* name, auto& fn) {
      void* p = nullptr;
      cudaDriverEntryPointQueryResult q{};
      if (cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
          q != cudaDriverEntryPointSuccess || !p) {
        cudaGetLastError();
        return false;
      }
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
      return true;
    };
    Vmm& v = vmm_;
    const bool all = load("cuMemCreate", v.create) && load("cuMemRelease", v.release) &&
                     load("cuMemAddressReserve", v.reserve) &&
                     load("cuMemAddressFree", v.address_free) && load("cuMemMap", v.map) &&
                     load("cuMemUnmap", v.unmap) && load("cuMemSetAccess", v.set_access) &&
                     load("cuMemExportToShareableHandle", v.export_fd) &&
                     load("cuMemImportFromShareableHandle", v.import_fd) &&
                     load("cuMemGetAllocationGranularity", v.granularity) &&
                     load("cuDeviceGetAttribute", v.attribute);
    int vmm = 0, fd = 0;
    if (!all) {
      vmm_status_ = Unavailable("the driver lacks the virtual memory calls");
    } else if (v.attribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, gpu_) !=
                   CUDA_SUCCESS ||
               v.attribute(&fd, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                           gpu_) != CUDA_SUCCESS ||
               !vmm || !fd) {
      vmm_status_ = Unavailable("GPU {} does not export memory as file descriptors", gpu_);
    }
    return vmm_status_;
  }
  CUmemAllocationProp VmmProperties() const {
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = gpu_;
    return prop;
  }
  // `handle`'s memory (`bytes`) mapped read-write for this GPU at a new
  // address; nothing held where it fails.
  Result<void*> VmmMap(CUmemGenericAllocationHandle handle, size_t bytes) {
    CUdeviceptr p = 0;
    CUresult r = vmm_.reserve(&p, bytes, 0, 0, 0);
    if (r != CUDA_SUCCESS) return Unavailable("cuMemAddressReserve: CUDA driver error {}", r);
    r = vmm_.map(p, bytes, 0, handle, 0);
    if (r != CUDA_SUCCESS) {
      vmm_.address_free(p, bytes);
      return Unavailable("cuMemMap: CUDA driver error {}", r);
    }
    CUmemAccessDesc access{};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = gpu_;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    r = vmm_.set_access(p, bytes, &access, 1);
    if (r != CUDA_SUCCESS) {
      vmm_.unmap(p, bytes);
      vmm_.address_free(p, bytes);
      return Unavailable("cuMemSetAccess (GPU {}): CUDA driver error {}", gpu_, r);
    }
    return reinterpret_cast<void*>(p);
  }
  void VmmUnmap(void* p, const VmmMapping& m) {
    const auto d = reinterpret_cast<CUdeviceptr>(p);
    vmm_.unmap(d, m.second);
    vmm_.address_free(d, m.second);
    vmm_.release(m.first);
  }

  // Collectives by NCCL between GPUs (nccl_group.h), on the compute stream.
  std::string CollectiveDevice() override {
    std::string why;
    if (!cuda::NcclLoaded(&why)) {
      FS_LOG_DEBUG("GPU {}: no NCCL ({})", gpu_, why);
      return "";
    }
    char bus[64] = {};
    if (cudaDeviceGetPCIBusId(bus, sizeof(bus), gpu_) != cudaSuccess) {
      cudaGetLastError();  // not sticky
      return "";
    }
    if (cuda::NcclApart()) return fmt::format("{}/{}", bus, getpid());
    return bus;
  }
  Result<std::string> NewDeviceGroupId() override { return cuda::NewNcclGroupId(); }
  Result<std::unique_ptr<DeviceGroup>> JoinDeviceGroup(const std::string& id, int rank,
                                                       int size) override {
    FS_CHECK_MSG(graph_ == Graph::kOff, "a device group joined inside a graphed step");
    FS_CUDA_CHECK(cudaSetDevice(gpu_));  // NCCL binds the group to this thread's device
    return cuda::JoinNcclGroup(id, rank, size, stream_, gpu_);
  }

  Result<PeerMemory> AllocatePeerMemory(size_t bytes) override {
    FS_CHECK_MSG(graph_ == Graph::kOff, "peer memory allocated inside a graphed step");
    if (peer_kind_ != PeerKind::kIpc) {
      auto vmm = AllocateVmmPeerMemory(bytes);
      if (vmm.ok() || peer_kind_ == PeerKind::kVmm) return vmm;
      // IPC memory is freed with its owner: a survivor reading a killed
      // owner's may fault, which ends its context too.
      FS_LOG_WARN(
          "peer memory by CUDA IPC (a device killed mid-collective may take its readers "
          "with it): {}",
          vmm.status().message());
    }
    FS_ASSIGN_OR_RETURN(const PeerHandleHead head, MakePeerHandleHead(kIpcMagic, bytes));
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, std::max<size_t>(bytes, 1));
    if (e != cudaSuccess) {
      cudaGetLastError();
      return Unavailable("{} bytes of peer memory: {}", bytes, cudaGetErrorString(e));
    }
    IpcHandle h{};
    h.head = head;
    e = cudaIpcGetMemHandle(&h.ipc, p);
    if (e != cudaSuccess) {
      cudaGetLastError();
      cudaFree(p);
      return Unavailable("cudaIpcGetMemHandle: {}", cudaGetErrorString(e));
    }
    return PeerMemory{p, std::string(reinterpret_cast<const char*>(&h), sizeof(h))};
  }
  Result<PeerMemory> AllocateVmmPeerMemory(size_t bytes) {
    FS_RETURN_IF_ERROR(LoadVmm());
    VmmHandle h{};
    FS_ASSIGN_OR_RETURN(h.head, MakePeerHandleHead(kVmmMagic, 0));  // bytes once rounded
    const CUmemAllocationProp prop = VmmProperties();
    size_t grain = 0;
    if (vmm_.granularity(&grain, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS || !grain)
      return Unavailable("cuMemGetAllocationGranularity failed");
    const size_t size = (std::max<size_t>(bytes, 1) + grain - 1) / grain * grain;
    CUmemGenericAllocationHandle handle = 0;
    CUresult r = vmm_.create(&handle, size, &prop, 0);
    if (r != CUDA_SUCCESS)
      return Unavailable("cuMemCreate of {} bytes: CUDA driver error {}", size, r);
    int fd = -1;
    r = vmm_.export_fd(&fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    if (r != CUDA_SUCCESS) {
      vmm_.release(handle);
      return Unavailable("cuMemExportToShareableHandle: CUDA driver error {}", r);
    }
    auto share = FdShare::Serve(fd);
    ::close(fd);  // the share holds its own
    if (!share.ok()) {
      vmm_.release(handle);
      return share.status();
    }
    auto p = VmmMap(handle, size);
    if (!p.ok()) {
      vmm_.release(handle);
      return p.status();
    }
    h.head.bytes = size;
    SetShareName(h.share, (*share)->name());
    vmm_owned_.emplace(*p, std::make_pair(VmmMapping{handle, size}, std::move(*share)));
    return PeerMemory{*p, std::string(reinterpret_cast<const char*>(&h), sizeof(h))};
  }
  void FreePeerMemory(void* p, size_t) override {
    auto it = vmm_owned_.find(p);
    if (it == vmm_owned_.end()) {  // CUDA IPC's: cudaMalloc's, not the pool's
      FS_CHECK_MSG(graph_ == Graph::kOff, "peer memory freed inside a graphed step");
      ForgetGraphs();
      const cudaError_t e = cudaFree(p);
      FS_CHECK_MSG(e == cudaSuccess || e == cudaErrorCudartUnloading, "cudaFree: {}",
                   cudaGetErrorString(e));
      return;
    }
    Synchronize();                  // no kernel of this process reads it any more
    ForgetGraphs();                 // as Free: a graph may name this memory
    it->second.second.reset();      // no new peer fetches it
    VmmUnmap(p, it->second.first);  // peers that mapped it keep it
    vmm_owned_.erase(it);
  }
  Result<void*> OpenPeerMemory(const std::string& handle, size_t bytes) override {
    uint32_t magic = 0;
    if (handle.size() >= sizeof(magic)) std::memcpy(&magic, handle.data(), sizeof(magic));
    if (magic == kVmmMagic && handle.size() == sizeof(VmmHandle)) {
      VmmHandle h;
      std::memcpy(&h, handle.data(), sizeof(h));
      return OpenVmmPeerMemory(h, bytes);
    }
    IpcHandle h;
    if (handle.size() != sizeof(h) || magic != kIpcMagic)
      return InvalidArgument("not a CUDA peer-memory handle");
    std::memcpy(&h, handle.data(), sizeof(h));
    FS_RETURN_IF_ERROR(CheckPeerHandleHead(h.head, bytes));
    void* p = nullptr;
    const cudaError_t e = cudaIpcOpenMemHandle(&p, h.ipc, cudaIpcMemLazyEnablePeerAccess);
    if (e != cudaSuccess) {
      cudaGetLastError();
      return Unavailable("cudaIpcOpenMemHandle: {}", cudaGetErrorString(e));
    }
    return p;
  }
  Result<void*> OpenVmmPeerMemory(const VmmHandle& h, size_t bytes) {
    FS_RETURN_IF_ERROR(CheckPeerHandleHead(h.head, bytes));
    FS_RETURN_IF_ERROR(LoadVmm());
    FS_ASSIGN_OR_RETURN(const int fd, FetchSharedFd(ShareName(h.share)));
    CUmemGenericAllocationHandle handle = 0;
    const CUresult r = vmm_.import_fd(&handle, reinterpret_cast<void*>(static_cast<uintptr_t>(fd)),
                                      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    ::close(fd);  // the imported handle holds the memory
    if (r != CUDA_SUCCESS)
      return Unavailable("cuMemImportFromShareableHandle: CUDA driver error {}", r);
    auto p = VmmMap(handle, h.head.bytes);
    if (!p.ok()) {
      vmm_.release(handle);
      return p.status();
    }
    vmm_opened_[*p] = {handle, h.head.bytes};
    return *p;
  }
  void ClosePeerMemory(void* p, size_t) override {
    if (!p) return;
    auto it = vmm_opened_.find(p);
    if (it != vmm_opened_.end()) {
      VmmUnmap(p, it->second);
      vmm_opened_.erase(it);
      return;
    }
    if (cudaIpcCloseMemHandle(p) != cudaSuccess) cudaGetLastError();
  }

  std::vector<std::string> KernelChoices() const override {
    std::vector<std::string> out;
    for (std::string& line : lt_->Report()) out.push_back("cuBLASLt " + std::move(line));
    for (std::string& line : fixed_->Report()) out.push_back(std::move(line));
    return out;
  }

  // --- marks: events in the compute stream ---
  void Mark() override {
    FS_CHECK_MSG(graph_ == Graph::kOff, "a mark inside a graphed step");
    if (marks_used_ == marks_.size()) {
      cudaEvent_t e = nullptr;
      FS_CUDA_CHECK(cudaEventCreate(&e));
      marks_.push_back(e);
    }
    FS_CUDA_CHECK(cudaEventRecord(marks_[marks_used_++], stream_));
  }
  std::vector<double> TakeMarks() override {
    FS_CHECK_MSG(graph_ == Graph::kOff, "marks taken inside a graphed step");
    std::vector<double> out(marks_used_, 0.0);
    BeforeWait();
    if (marks_used_ > 0) FS_CUDA_CHECK(cudaEventSynchronize(marks_[marks_used_ - 1]));
    for (size_t i = 1; i < marks_used_; ++i) {
      float ms = 0;
      FS_CUDA_CHECK(cudaEventElapsedTime(&ms, marks_[0], marks_[i]));
      out[i] = ms * 1e-3;
    }
    marks_used_ = 0;
    return out;
  }

  // --- graphs ---
  bool BeginGraph(uint64_t key, size_t argument_bytes) override {
    FS_CHECK(graph_ == Graph::kOff);
    if (!graphs_enabled_ || argument_bytes > ring_bytes_ / 2) return false;
    auto it = graphs_.find(key);
    if (it == graphs_.end() && seen_.insert(key).second) return false;  // first: as usual
    Synchronize();         // every slot of the ring is free: the uploads start at 0
    rounded_ = Rounded();  // a replay writes without counting; a capture rounds afresh
    graph_key_ = key;
    if (it != graphs_.end()) {
      graph_ = Graph::kReplay;
      replay_ = &it->second;
      replay_->last_use = ++graph_clock_;
      upload_index_ = 0;
      return true;
    }
    graph_ = Graph::kCapture;
    capture_uploads_.clear();
    FS_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    return true;
  }

  void EndGraph() override {
    if (graph_ == Graph::kReplay) {
      FS_CHECK_MSG(upload_index_ == replay_->uploads.size(),
                   "a replayed step uploaded {} arguments, its graph {}", upload_index_,
                   replay_->uploads.size());
      graph_ = Graph::kOff;
      cuda::CountDeviceWrite();
      FS_CUDA_CHECK(cudaGraphLaunch(replay_->exec, stream_));
      return;
    }
    FS_CHECK(graph_ == Graph::kCapture);
    cudaGraph_t graph = nullptr;
    FS_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
    graph_ = Graph::kOff;
    cudaGraphExec_t exec = nullptr;
    FS_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    FS_CUDA_CHECK(cudaGraphDestroy(graph));
    if (graphs_.size() >= kMaxGraphs) {  // the least recently used goes
      auto oldest = graphs_.begin();
      for (auto i = graphs_.begin(); i != graphs_.end(); ++i) {
        if (i->second.last_use < oldest->second.last_use) oldest = i;
      }
      FS_CUDA_CHECK(cudaGraphExecDestroy(oldest->second.exec));
      graphs_.erase(oldest);
    }
    StepGraph& g = graphs_[graph_key_];
    g.exec = exec;
    g.uploads = std::move(capture_uploads_);
    g.last_use = ++graph_clock_;
    // Recorded, not run: run it now.
    cuda::CountDeviceWrite();
    FS_CUDA_CHECK(cudaGraphLaunch(exec, stream_));
  }

  // --- products ---
  bool TransposedNN(DType) const override { return true; }

  void LinearNT(const float* x, int64_t ldx, WeightsRef w, float* y, int64_t ldy, int m, int n,
                int k, bool accumulate) override {
    if (!Launching()) return;  // the graph has it
    FS_CHECK_MSG(!w.blocked16 && !w.transposed, "the CUDA backend reads [n, k] weights row-major");
    if (m <= 0 || n <= 0) return;
    ProductWrites writes(this, y, sizeof(float) * ((m - 1) * ldy + n));
    if (Chains(w.dtype)) {
      RunChains(x, ldx, w, y, ldy, m, n, k, accumulate);
      return;
    }
    const void* x16 = Round(x, ldx, m, k, w.dtype);
    writes.Mark();
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
    if (!lt_->Run(p)) RunChains(x, ldx, w, y, ldy, m, n, k, accumulate);
  }

  void LinearNN(const float* x, int64_t ldx, WeightsRef w, float* y, int64_t ldy, int m, int n,
                int k, bool accumulate) override {
    if (!Launching()) return;  // the graph has it
    FS_CHECK_MSG(!w.blocked16 && !w.transposed, "the CUDA backend reads [k, n] weights row-major");
    cuda::RunChainGemmNN(x, ldx, w.data, TypeOf(w.dtype), y, ldy, m, n, k, accumulate, stream_);
  }

  void LinearNNFixed(const float* x, int64_t ldx, WeightsRef w, int64_t* acc, int64_t ldacc, int m,
                     int n, int k, int item_k) override {
    if (!Launching()) return;  // the graph has it
    FS_CHECK_MSG(w.transposed, "the CUDA backend takes fixed-point items transposed");
    if (m <= 0 || n <= 0 || k <= 0) return;
    FS_CHECK(item_k > 0 && k % item_k == 0);
    const int items = k / item_k;
    ProductWrites writes(this, acc, sizeof(int64_t) * ((m - 1) * ldacc + n));
    if (Chains(w.dtype)) {
      RunFixedChains(x, ldx, w, acc, ldacc, m, n, k, item_k);
      return;
    }
    cuda::FixedItems g;
    g.b = static_cast<const uint16_t*>(w.data);
    g.bf16 = w.dtype == DType::kBF16;
    g.acc = acc;
    g.ldacc = ldacc;
    g.m = m;
    g.n = n;
    g.item_k = item_k;
    g.items = items;
    // Decode's few rows are rounded as the kernel reads them, not by a
    // launch of their own (the same bits).
    if (gemm_ == GpuGemm::kFused && m <= kFixedF32Rows &&
        cuda::FixedItemsSupported(item_k, ldx, x, w.data, true)) {
      g.a32 = x;
      g.lda = ldx;
      fixed_->Run(g, graph_ != Graph::kCapture);
      return;
    }
    const auto* x16 = static_cast<const uint16_t*>(Round(x, ldx, m, k, w.dtype));
    writes.Mark();
    if (gemm_ == GpuGemm::kFused && cuda::FixedItemsSupported(item_k, k, x16, w.data)) {
      g.a = x16;
      g.lda = k;
      fixed_->Run(g, graph_ != Graph::kCapture);
      return;
    }
    // Each item's product by cuBLASLt (one batch entry per item), then
    // their exact fixed-point sum.
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
      if (!lt_->Run(p)) {  // not cuBLASLt's family (checked once, for any m)
        FS_CHECK(r0 == 0);
        RunFixedChains(x, ldx, w, acc, ldacc, m, n, k, item_k);
        return;
      }
      cuda::AddItemsFixed(parts, items, item_stride, rows, n,
                          acc + static_cast<int64_t>(r0) * ldacc, ldacc, stream_);
    }
  }

  // --- data movement ---
  void GatherWeightRows(WeightsRef w, int w_rows, int cols, const int32_t* src_rows,
                        const int32_t* dst_rows, int n, float* out, int64_t ldo) override {
    FS_CHECK_MSG(!w.blocked16 && !w.transposed, "the CUDA backend reads weights row-major");
    if (n <= 0) return;
    ReserveUploads({sizeof(int32_t) * n, sizeof(int32_t) * n});
    const auto* src = Upload<int32_t>(src_rows, n);
    const auto* dst = Upload<int32_t>(dst_rows, n);
    CopyUploads();
    if (!Launching()) return;
    cuda::GatherWeightRows(w.data, TypeOf(w.dtype), cols, src, dst, n, out, ldo, stream_);
  }
  void GatherRows(const float* src, int64_t lds, const int32_t* rows, int n, int cols, float* dst,
                  int64_t ldd) override {
    if (n <= 0) return;
    const int32_t* r = Upload<int32_t>(rows, n);
    CopyUploads();
    if (Launching()) cuda::GatherRows(src, lds, r, n, cols, dst, ldd, stream_);
  }
  void ScatterAddFixed(const int64_t* src, int64_t lds, const int32_t* rows, int n, int cols,
                       int64_t* dst, int64_t ldd) override {
    if (n <= 0) return;
    const int32_t* r = Upload<int32_t>(rows, n);
    CopyUploads();
    if (Launching()) cuda::ScatterAddFixed(src, lds, r, n, cols, dst, ldd, stream_);
  }
  void AddFixedTo(const int64_t* acc, float* x, int64_t n) override {
    if (!Launching()) return;  // the graph has it
    cuda::AddFixedTo(acc, x, n, stream_);
  }
  void AddFixedToNorm(int64_t* acc, float* x, const float* weight, float* y, int rows, int dim,
                      float eps) override {
    if (!Launching()) return;  // the graph has it
    void* y16 = NormRounding(rows, dim);
    cuda::AddFixedToNorm(acc, x, weight, y, rows, dim, eps, y16, TypeOf(round_type_), stream_);
    NormRounded(y16, y, dim, rows, dim);
  }
  // Never in a graph: a replay would sum without the group's barriers.
  void SumArrays(const float* const* srcs, int n, size_t count, float* out) override {
    FS_CHECK_MSG(graph_ == Graph::kOff, "a peer sum inside a graphed step");
    cuda::SumArrays(srcs, n, count, out, stream_);
  }
  void SumArrays(const int64_t* const* srcs, int n, size_t count, int64_t* out) override {
    FS_CHECK_MSG(graph_ == Graph::kOff, "a peer sum inside a graphed step");
    cuda::SumArrays(srcs, n, count, out, stream_);
  }
  void ScaleRows(float* x, int64_t ldx, const float* scale, int rows, int cols) override {
    if (rows <= 0) return;
    const float* f = Upload<float>(scale, rows);
    CopyUploads();
    if (Launching()) cuda::ScaleRows(x, ldx, f, rows, cols, stream_);
  }

  void AddBias(float* x, int64_t ldx, const float* bias, int rows, int cols) override {
    if (!Launching()) return;  // the graph has it
    cuda::AddBias(x, ldx, bias, rows, cols, stream_);
  }
  void Softcap(float* x, int64_t n, float cap) override {
    if (!Launching()) return;  // the graph has it
    cuda::Softcap(x, n, cap, stream_);
  }

  // --- the rest of the layer ---
  void RmsNorm(const float* x, int64_t ldx, const float* weight, float* y, int64_t ldy, int rows,
               int dim, float eps) override {
    if (!Launching()) return;  // the graph has it
    void* y16 = NormRounding(rows, dim);
    cuda::RmsNorm(x, ldx, weight, y, ldy, rows, dim, eps, y16, TypeOf(round_type_), stream_);
    NormRounded(y16, y, ldy, rows, dim);
  }
  void Rope(float* x, int64_t ldx, int64_t head_stride, const int32_t* positions, int tokens,
            int heads, int head_dim, const float* cos_sin) override {
    if (!Launching()) return;  // the graph has it
    cuda::Rope(x, ldx, head_stride, positions, tokens, heads, head_dim, cos_sin, stream_);
  }
  void RopeQK(float* q, int64_t ldq, int64_t q_stride, int q_heads, float* k, int64_t ldk,
              int64_t k_stride, int k_heads, const int32_t* positions, int tokens, int head_dim,
              const float* cos_sin) override {
    if (!Launching()) return;  // the graph has it
    cuda::RopeQK(q, ldq, q_stride, q_heads, k, ldk, k_stride, k_heads, positions, tokens, head_dim,
                 cos_sin, stream_);
  }
  void SiluMul(const float* gu, int64_t ld_in, float* out, int64_t ld_out, int rows, int width,
               int shards) override {
    if (!Launching()) return;  // the graph has it
    cuda::SiluMul(gu, ld_in, out, ld_out, rows, width, shards, stream_);
  }
  void GeluTanhMul(const float* gu, int64_t ld_in, float* out, int64_t ld_out, int rows, int width,
                   int shards) override {
    if (!Launching()) return;  // the graph has it
    cuda::GeluTanhMul(gu, ld_in, out, ld_out, rows, width, shards, stream_);
  }
  void MoeGate(const float* logits, int tokens, int experts, int k, bool renormalize, int32_t* ids,
               float* weights) override {
    if (!Launching()) return;  // the graph has it
    FS_CHECK_MSG(k <= 16, "top-{} routing is over the CUDA backend's 16", k);
    cuda::MoeGate(logits, tokens, experts, k, renormalize, ids, weights, stream_);
  }

  void Attention(const std::vector<AttentionArgs>& problems) override {
    if (problems.empty()) return;
    cuda::PlanAttention(problems, attention_, graph_ != Graph::kOff, &attention_plan_);
    cuda::AttentionPlan& plan = attention_plan_;
    ReserveUploads({sizeof(const float*) * plan.pages.size(),
                    sizeof(cuda::AttentionProblem) * plan.problems.size(),
                    sizeof(int) * plan.first_block.size(),
                    plan.split_queries > 0 ? sizeof(int) * plan.first_query.size() : 0});
    const float* const* pages = Upload<const float*>(
        reinterpret_cast<const float* const*>(plan.pages.data()), plan.pages.size());
    for (size_t i = 0; i < problems.size(); ++i)
      plan.problems[i].pages = pages + plan.page_offset[i];
    const int n = static_cast<int>(problems.size());
    const auto* dev = Upload<cuda::AttentionProblem>(plan.problems.data(), plan.problems.size());
    const int* first = Upload<int>(plan.first_block.data(), plan.first_block.size());
    const int* first_query = plan.split_queries > 0
                                 ? Upload<int>(plan.first_query.data(), plan.first_query.size())
                                 : nullptr;
    CopyUploads();  // one copy for the step's tables
    float* states =
        plan.split_queries > 0 ? states_.Reserve(static_cast<size_t>(plan.state_floats)) : nullptr;
    if (!Launching()) return;
    cuda::StoreKv(dev, n, plan.max_tokens, stream_);
    if (plan.tensor) {
      cuda::AttendTc(dev, first, n, plan.blocks, plan.max_head_dim, stream_);
      return;
    }
    cuda::Attend(dev, first, n, plan.blocks, plan.max_head_dim, plan.segments, states, stream_);
    cuda::AttendCombine(dev, first_query, n, plan.split_queries, states, stream_);
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
    float* sorted = sort_.Reserve(2 * static_cast<size_t>(vocab));
    int* ids = sort_ids_.Reserve(2 * static_cast<size_t>(vocab));
    cuda::SortDescending(logits, vocab, sorted, sorted + vocab, ids + vocab, ids,
                         sort_scratch_.Reserve(scratch), scratch, stream_);
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
  // SetBeforeWait's, once (not again from within it).
  void BeforeWait() {
    if (std::this_thread::get_id() != before_wait_thread_.load(std::memory_order_acquire) ||
        !before_wait_ || in_before_wait_)
      return;
    in_before_wait_ = true;
    before_wait_();
    in_before_wait_ = false;
  }
  bool Chains(DType t) const { return t == DType::kF32 || gemm_ == GpuGemm::kChain; }

  // The chains of x [m, *] by w over n columns (kernels.h: ChainGemm).
  cuda::ChainGemm Chain(const float* x, int64_t ldx, WeightsRef w, int m, int n) const {
    cuda::ChainGemm g;
    g.x = x;
    g.ldx = ldx;
    g.w = w.data;
    g.type = TypeOf(w.dtype);
    g.m = m;
    g.n = n;
    return g;
  }
  void RunChains(const float* x, int64_t ldx, WeightsRef w, float* y, int64_t ldy, int m, int n,
                 int k, bool accumulate) {
    cuda::ChainGemm g = Chain(x, ldx, w, m, n);
    g.row_stride = g.item_k = k;
    g.y = y;
    g.ldy = ldy;
    g.accumulate = accumulate;
    cuda::RunChainGemm(g, stream_);
  }
  void RunFixedChains(const float* x, int64_t ldx, WeightsRef w, int64_t* acc, int64_t ldacc, int m,
                      int n, int k, int item_k) {
    cuda::ChainGemm g = Chain(x, ldx, w, m, n);
    g.item_stride = static_cast<int64_t>(n) * item_k;
    g.row_stride = g.item_k = item_k;
    g.items = k / item_k;
    g.acc = acc;
    g.ldacc = ldacc;
    cuda::RunChainGemm(g, stream_);
  }

  // x [m, k] rounded to 16-bit `t` for a product: what the last rounding
  // or norm made, while nothing may have written device memory since (the
  // q and k/v products of one input, a norm's output), else rounded now.
  const void* Round(const float* x, int64_t ldx, int m, int k, DType t) {
    if (rounded_.x == x && rounded_.ldx == ldx && rounded_.m == m && rounded_.k == k &&
        rounded_.type == t && rounded_.writes == cuda::DeviceWrites()) {
      return x16_.data();
    }
    uint16_t* dst = x16_.Reserve(static_cast<size_t>(m) * k);
    cuda::RoundActivations(x, ldx, m, k, TypeOf(t), dst, stream_);
    round_type_ = t;
    rounded_ = Rounded{x, ldx, m, k, t, cuda::DeviceWrites()};
    return dst;
  }
  // Where a norm writes its output rounded too: products' inputs are
  // norms' outputs, rounded as the last product's were (none before one,
  // nor for products on CUDA cores).
  void* NormRounding(int rows, int dim) {
    if (round_type_ == DType::kF32 || gemm_ == GpuGemm::kChain) return nullptr;
    return x16_.Reserve(static_cast<size_t>(rows) * dim);
  }
  void NormRounded(void* y16, const float* y, int64_t ldy, int rows, int dim) {
    rounded_ = y16 ? Rounded{y, ldy, rows, dim, round_type_, cuda::DeviceWrites()} : Rounded();
  }
  // A product writes only its output (and scratch of its own): rounded
  // activations current when it starts (after any rounding of its own,
  // Mark) stay current after it unless its output overlaps them.
  class ProductWrites {
   public:
    ProductWrites(CudaBackend* b, const void* out, size_t bytes)
        : b_(b), out_(static_cast<const char*>(out)), bytes_(bytes) {
      Mark();
    }
    ~ProductWrites() {
      Rounded& r = b_->rounded_;
      if (!r.x) return;
      const auto* a = reinterpret_cast<const char*>(r.x);
      const char* a_end = a + sizeof(float) * static_cast<size_t>((r.m - 1) * r.ldx + r.k);
      if (out_ < a_end && a < out_ + bytes_) {
        r = Rounded();
      } else if (r.writes == mark_) {
        r.writes = cuda::DeviceWrites();
      }
    }
    void Mark() { mark_ = cuda::DeviceWrites(); }

   private:
    CudaBackend* b_;
    const char* out_;
    size_t bytes_;
    uint64_t mark_ = 0;
  };

  void GrowRing(size_t bytes) {
    if (ring_) {
      CopyUploads();
      Synchronize();
      ForgetGraphs();  // they copy from the ring
      FS_CUDA_CHECK(cudaFree(ring_));
      FS_CUDA_CHECK(cudaFreeHost(pinned_));
    }
    ring_bytes_ = bytes;
    FS_CUDA_CHECK(cudaMalloc(&ring_, ring_bytes_));
    FS_CUDA_CHECK(cudaMallocHost(&pinned_, ring_bytes_));
    ring_used_ = ring_copied_ = 0;
  }

  static size_t RingPadded(size_t bytes) { return (bytes + 255) / 256 * 256; }
  // Room in the ring for a call's uploads of these sizes, all of them: the
  // ring grown, or every slot read and staging from its start, before the
  // first is staged, so that a later upload of the call never moves the
  // ring or overwrites an earlier one's slot.
  void ReserveUploads(std::initializer_list<size_t> sizes) {
    if (graph_ != Graph::kOff) return;  // a graph's slots are fixed (Upload checks)
    size_t total = 0;
    for (size_t bytes : sizes) total += RingPadded(bytes);
    if (total > ring_bytes_) GrowRing(std::max(2 * ring_bytes_, total));
    if (ring_used_ + total > ring_bytes_) {
      // A step whose uploads pass the ring's end would wait there for the
      // device to read them all (a drained GPU mid-step, at every such
      // step): the ring grows, doubling, until a step's fit (a decode step
      // of 64 sequences of 8,192 positions on the 8B shape uploads about
      // 67 MiB of page tables), waiting as a wrap would, once; past its
      // largest, steps wrap.
      if (ring_bytes_ < max_ring_bytes_) {
        GrowRing(std::min(max_ring_bytes_, std::max(2 * ring_bytes_, ring_used_ + total)));
      } else {  // every slot read, then from the start
        CopyUploads();
        Synchronize();
      }
    }
  }
  // n elements from host memory into the ring, staged on the host side
  // until CopyUploads (one copy for all staged since the last) and then
  // valid for kernels issued before the next Synchronize. A call that
  // uploads more than once reserves them all first (ReserveUploads).
  template <typename T>
  const T* Upload(const T* src, size_t n) {
    const size_t bytes = sizeof(T) * n, padded = RingPadded(bytes);
    if (graph_ != Graph::kOff) {
      // Same offsets every replay: the graph copies from these slots.
      FS_CHECK_MSG(ring_used_ + padded <= ring_bytes_,
                   "a graphed step's arguments pass the upload ring's {} bytes", ring_bytes_);
      if (graph_ == Graph::kCapture) {
        capture_uploads_.push_back(bytes);
      } else {
        FS_CHECK_MSG(
            upload_index_ < replay_->uploads.size() && replay_->uploads[upload_index_] == bytes,
            "a replayed step's arguments differ from its graph's (upload {})", upload_index_);
        ++upload_index_;
      }
    } else {
      ReserveUploads({bytes});
    }
    char* host = static_cast<char*>(pinned_) + ring_used_;
    char* dev = static_cast<char*>(ring_) + ring_used_;
    std::memcpy(host, src, bytes);
    ring_used_ += padded;
    return reinterpret_cast<const T*>(dev);
  }
  // The uploads staged since the last call, to the device in one copy (in
  // a replayed graph, its own copy).
  void CopyUploads() {
    if (ring_copied_ == ring_used_) return;
    if (Launching()) {
      FS_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(ring_) + ring_copied_,
                                    static_cast<char*>(pinned_) + ring_copied_,
                                    ring_used_ - ring_copied_, cudaMemcpyHostToDevice, stream_));
    }
    ring_copied_ = ring_used_;
  }

  // Whether calls launch work: not while a graph replays (it has them).
  bool Launching() const { return graph_ != Graph::kReplay; }

  void ForgetGraphs() {
    for (auto& [key, g] : graphs_) cudaGraphExecDestroy(g.exec);
    graphs_.clear();
    seen_.clear();
  }

  const int gpu_;
  const GpuGemm gemm_;
  int sms_ = 1;                    // multiprocessors
  cudaStream_t stream_ = nullptr;  // every kernel and copy of the compute thread
  // Staging / CopyFromStaging: a buffer, and its last copy not yet waited for.
  struct StagingBuffer {
    void* data = nullptr;
    size_t bytes = 0;
    cudaEvent_t done = nullptr;
    bool pending = false;
  };
  StagingBuffer staging_[2];
  // Guards the copy streams, pinned_host_ and pieced_regions_.
  std::mutex copy_mu_;
  std::vector<cudaStream_t> copy_streams_;       // BackgroundCopies': every one made
  std::vector<cudaStream_t> idle_copy_streams_;  // those no call holds
  std::unique_ptr<cuda::LtGemm> lt_;
  std::unique_ptr<cuda::FixedGemm> fixed_;
  // What x16_ holds: x [m, k] rounded to `type` when cuda::DeviceWrites()
  // was `writes` (Round).
  struct Rounded {
    const float* x = nullptr;
    int64_t ldx = 0;
    int m = 0, k = 0;
    DType type = DType::kF32;
    uint64_t writes = 0;
  } rounded_;
  DType round_type_ = DType::kF32;  // of the last rounding
  void* ring_ = nullptr;            // device side of the upload ring
  void* pinned_ = nullptr;          // its host side
  size_t max_ring_bytes_ = 0;       // the ring grows up to this (Init)
  size_t first_ring_bytes_ = 0;     // and starts at this
  size_t ring_bytes_ = 0, ring_used_ = 0;
  size_t ring_copied_ = 0;  // uploads [0, this) copied to the device side
  int* result_ = nullptr;   // pinned: ArgMax's answer
  DeviceArray<uint16_t> x16_{this, 0};
  DeviceArray<float> parts_{this, 0};
  DeviceArray<float> sort_{this, 0};
  DeviceArray<int> sort_ids_{this, 0};
  DeviceArray<unsigned char> sort_scratch_{this, 0};
  cuda::AttentionPlan attention_plan_;  // Attention: this call's, its buffers kept
  DeviceArray<float> states_{this, 0};  // Attention: split problems' segment states
  std::vector<float> host_sorted_;
  std::vector<int> host_ids_;
  // Graphs (BeginGraph): every key seen once, the graphs recorded, and the
  // step under way.
  enum class Graph { kOff, kCapture, kReplay };
  struct StepGraph {
    cudaGraphExec_t exec = nullptr;
    std::vector<size_t> uploads;  // bytes of each argument upload, in order
    uint64_t last_use = 0;
  };
  const bool graphs_enabled_;
  const GpuAttention attention_;
  bool dependent_launch_;
  const std::function<void()> busy_;   // CudaBackendOptions::busy
  std::function<void()> before_wait_;  // SetBeforeWait, for the thread that set it
  std::atomic<std::thread::id> before_wait_thread_{};
  // A copy from pageable memory up to this size is staged by the driver at
  // once; a larger one may wait for the stream.
  static constexpr size_t kPageableStagedBytes = 64 << 10;
  bool in_before_wait_ = false;
  Graph graph_ = Graph::kOff;
  std::unordered_set<uint64_t> seen_;
  std::unordered_map<uint64_t, StepGraph> graphs_;
  uint64_t graph_key_ = 0, graph_clock_ = 0;
  std::vector<size_t> capture_uploads_;
  StepGraph* replay_ = nullptr;
  size_t upload_index_ = 0;
  std::vector<std::pair<void*, size_t>> pinned_host_;           // PinHostMemory's pieces
  std::vector<std::thread> pinners_;                            // PinHostMemory of large regions
  std::vector<std::pair<const char*, size_t>> pieced_regions_;  // those regions
  std::atomic<bool> pin_stop_{false};
  // Peer memory by the virtual memory API: what this process made (its
  // handle and size, and the share peers fetch it from), and what it mapped
  // of its peers'.
  const PeerKind peer_kind_ = PeerKindFromEnvironment();
  Allocator allocator_ = Allocator::kSync;  // Init: the pool where the GPU has one
  cudaStream_t alloc_stream_ = nullptr;     // the pool's allocations
  bool vmm_loaded_ = false;
  Status vmm_status_;
  Vmm vmm_;
  std::unordered_map<void*, std::pair<VmmMapping, std::unique_ptr<FdShare>>> vmm_owned_;
  std::unordered_map<void*, VmmMapping> vmm_opened_;
  std::vector<cudaEvent_t> marks_;  // Mark(): the first marks_used_ recorded
  size_t marks_used_ = 0;
};

}  // namespace

Result<std::unique_ptr<Backend>> MakeCudaBackend(const CudaBackendOptions& options) {
  auto b = std::make_unique<CudaBackend>(options);
  FS_RETURN_IF_ERROR(b->Init());
  return std::unique_ptr<Backend>(std::move(b));
}

bool CudaBackendBuilt() { return true; }

}  // namespace failsafe
