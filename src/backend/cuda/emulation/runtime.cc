// The CUDA runtime and cuBLASLt calls of the CUDA backend
// (cuda_backend.cc, gemm_lt.cc), emulated on the CPU so that the backend
// itself runs over the emulated kernels (emulation.h) in tests: one
// "device", its memory host memory; a stream's operations done at once in
// issue order, on the issuing thread, while nothing unfinished is ahead of
// them on the stream; while a stream is captured, launches, copies and sets
// are recorded, and a graph's launch replays them, reading host memory when
// it runs as a real graph's copies do.
//
// Work that completes only when other processes take part (an emulated
// NCCL operation, emulation/nccl.cc) is left pending on its stream, and
// what is issued behind it waits there, as on a GPU, without the issuing
// thread waiting: it runs once the operation has finished, when a call
// looks at the stream (an issue, a query, a synchronization; any thread's).
// An event recorded behind it is not ready until then. A copy from
// pageable host memory takes its bytes at once, and one to pageable host
// memory returns once it is done (CUDA's behaviour for pageable copies),
// so a copy to the host behind an unfinished operation waits for it.
//
// Eight GPUs (kGpus), every one this process's host memory, each with a
// PCI bus id of its own.
//
// Not emulated, and refused as a GPU without them would refuse them: CUDA
// IPC and the driver's virtual memory calls (peer memory), and cuBLASLt's
// algorithms (none offered: every product family takes the engine's own
// kernels, as where cuBLASLt offers none).
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "backend/cuda/emulation/emulation.h"
#include "common/check.h"

// One operation queued on a stream: Step does what it can and says
// whether the operation has finished.
struct QueuedOp {
  std::function<bool()> step;
};
// Where an event was recorded: done once the stream's work before it is.
struct EventMark {
  std::atomic<bool> done{false};
  std::chrono::steady_clock::time_point at;
};
struct CUstream_st {
  std::vector<std::function<void()>>* capture = nullptr;  // while captured
  std::mutex mu;                                          // the rest
  std::deque<std::shared_ptr<QueuedOp>> queue;            // issued, not finished, in order
  bool advancing = false;                                 // a thread is stepping queue.front()
};
struct CUevent_st {
  std::shared_ptr<EventMark> mark;  // null: never recorded
  CUstream_st* stream = nullptr;    // where mark waits
};
struct CUgraph_st {
  std::vector<std::function<void()>> ops;
};
struct CUgraphExec_st {
  std::vector<std::function<void()>> ops;
};

namespace failsafe::cuda::emu {
namespace {

// Never destroyed: a backend held in a static frees its memory at exit,
// after this file's statics would be gone.
std::mutex& Mu() {  // the tables below
  static auto* mu = new std::mutex();
  return *mu;
}
// Device allocations and page-locked host ranges, by start: their sizes.
std::map<const void*, size_t>& Device() {
  static auto* m = new std::map<const void*, size_t>();
  return *m;
}
std::map<const void*, size_t>& Locked() {
  static auto* m = new std::map<const void*, size_t>();
  return *m;
}
bool Within(const std::map<const void*, size_t>& m, const void* p) {
  auto it = m.upper_bound(p);
  if (it == m.begin()) return false;
  --it;
  return static_cast<const char*>(p) < static_cast<const char*>(it->first) + it->second;
}

CUstream_st g_default_stream;
CUstream_st* StreamOf(cudaStream_t s) { return s ? s : &g_default_stream; }

// Does the stream's queued work in order, as far as it can without
// waiting (block: until the queue is empty). Any thread may: the one that
// finds another stepping the queue leaves it to it (or, blocking, waits).
void Advance(CUstream_st* st, bool block) {
  std::unique_lock<std::mutex> l(st->mu);
  for (;;) {
    if (st->queue.empty()) return;
    if (!st->advancing) {
      std::shared_ptr<QueuedOp> op = st->queue.front();
      st->advancing = true;
      l.unlock();
      const bool finished = op->step();
      l.lock();
      st->advancing = false;
      if (finished) {
        st->queue.pop_front();
        continue;
      }
    }
    if (!block) return;
    l.unlock();
    std::this_thread::sleep_for(std::chrono::microseconds(50));
    l.lock();
  }
}

// Queues `step` on the stream's work and does what can be done now.
void Enqueue(CUstream_st* st, std::function<bool()> step) {
  {
    std::lock_guard<std::mutex> l(st->mu);
    st->queue.push_back(std::make_shared<QueuedOp>(QueuedOp{std::move(step)}));
  }
  Advance(st, /*block=*/false);
}

// Every stream made and not destroyed, and the default one.
std::set<CUstream_st*>& Streams() {
  static auto* all = new std::set<CUstream_st*>{&g_default_stream};
  return *all;
}

// Waits for every stream's work (as cudaFree does on a GPU).
void DrainAll() {
  std::vector<CUstream_st*> all;
  {
    std::lock_guard<std::mutex> l(Mu());
    all.assign(Streams().begin(), Streams().end());
  }
  for (CUstream_st* st : all) Advance(st, /*block=*/true);
}

// Device memory freed now (what the streams' work before it used is done).
cudaError_t FreeNow(void* p) {
  {
    std::lock_guard<std::mutex> l(Mu());
    if (Device().erase(p) == 0) return cudaErrorInvalidValue;
  }
  std::free(p);
  return cudaSuccess;
}

bool Idle(CUstream_st* st) {
  std::lock_guard<std::mutex> l(st->mu);
  return st->queue.empty();
}

// Runs `op` after the stream's work before it (now, where nothing is left
// unfinished), or records it where `s` is captured.
void Issue(cudaStream_t s, std::function<void()> op) {
  CUstream_st* st = StreamOf(s);
  if (st->capture) {
    st->capture->push_back(std::move(op));
    return;
  }
  Enqueue(st, [op = std::move(op)] {
    op();
    return true;
  });
}

// cuBLASLt's opaque handles: something to point at, holding nothing.
template <typename Handle>
cublasStatus_t NewOpaque(Handle* h) {
  *h = reinterpret_cast<Handle>(new char(0));
  return CUBLAS_STATUS_SUCCESS;
}
template <typename Handle>
cublasStatus_t DeleteOpaque(Handle h) {
  delete reinterpret_cast<char*>(h);
  return CUBLAS_STATUS_SUCCESS;
}

// `bytes` of host memory, 256-byte aligned as cudaMalloc's, entered in
// `table`.
cudaError_t Allocate(std::map<const void*, size_t>& table, void** p, size_t bytes) {
  *p = std::aligned_alloc(256, (bytes + 255) / 256 * 256 + 256);
  if (!*p) return cudaErrorMemoryAllocation;
  std::lock_guard<std::mutex> l(Mu());
  table[*p] = bytes;
  return cudaSuccess;
}

}  // namespace

void IssueLaunch(cudaStream_t s, std::function<void()> launch) { Issue(s, std::move(launch)); }

bool IssuePending(cudaStream_t s, std::shared_ptr<Pending> op) {
  CUstream_st* st = StreamOf(s);
  if (st->capture) return false;
  Enqueue(st, [op = std::move(op)] { return op->Advance(/*block=*/false); });
  return true;
}

namespace {

// A copy's host side, [p, p + span): where it touches host memory
// page-locked by cudaHostRegister or cudaMallocHost, it must lie within one
// such range. One that spans two, or locked memory and unlocked, is refused
// here (a real driver may refuse it, or copy it as pageable memory; the
// backend cuts such copies at the seams: CudaBackend::ForEachPart).
cudaError_t CheckHostSide(const void* p, size_t span) {
  if (span == 0) return cudaSuccess;
  const char* lo = static_cast<const char*>(p);
  const char* hi = lo + span;
  std::lock_guard<std::mutex> l(Mu());
  const auto& locked = Locked();
  auto it = locked.upper_bound(p);
  if (it != locked.begin()) {
    auto before = std::prev(it);
    const char* end = static_cast<const char*>(before->first) + before->second;
    if (lo < end) return hi <= end ? cudaSuccess : cudaErrorInvalidValue;  // starts inside one
  }
  // Starts in unlocked memory: no locked range may begin inside it.
  return it != locked.end() && static_cast<const char*>(it->first) < hi ? cudaErrorInvalidValue
                                                                        : cudaSuccess;
}
const void* HostSide(const void* dst, const void* src, cudaMemcpyKind kind) {
  return kind == cudaMemcpyHostToDevice ? src : kind == cudaMemcpyDeviceToHost ? dst : nullptr;
}

// Issues a copy whose source is `src` (copy(from) does it from `from`):
// from pageable host memory (`host`, `span` bytes, not page-locked) the
// bytes are taken now; to it, the call returns once the copy is done.
void IssueCopy(cudaStream_t s, cudaMemcpyKind kind, const void* host, size_t span, const void* src,
               std::function<void(const void*)> copy) {
  CUstream_st* st = StreamOf(s);
  bool pageable = false;
  if (host && span > 0 && !st->capture) {
    std::lock_guard<std::mutex> l(Mu());
    pageable = !Within(Locked(), host);
  }
  if (!pageable) {
    Issue(s, [src, copy = std::move(copy)] { copy(src); });
    return;
  }
  if (kind == cudaMemcpyHostToDevice) {
    auto staged = std::make_shared<std::vector<char>>(static_cast<const char*>(src),
                                                      static_cast<const char*>(src) + span);
    Issue(s, [staged, copy = std::move(copy)] { copy(staged->data()); });
    return;
  }
  Issue(s, [src, copy = std::move(copy)] { copy(src); });
  Advance(st, /*block=*/true);
}

}  // namespace
}  // namespace failsafe::cuda::emu

using failsafe::cuda::emu::Issue;

extern "C" {

// --- devices ---
cudaError_t cudaGetDeviceCount(int* count) {
  *count = failsafe::cuda::emu::kGpus;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  return device >= 0 && device < failsafe::cuda::emu::kGpus ? cudaSuccess : cudaErrorInvalidDevice;
}
cudaError_t cudaDeviceGetPCIBusId(char* bus, int len, int device) {
  if (device < 0 || device >= failsafe::cuda::emu::kGpus) return cudaErrorInvalidDevice;
  std::snprintf(bus, static_cast<size_t>(len), "00000000:%02X:00.0", 0x18 + device);
  return cudaSuccess;
}
cudaError_t cudaSetDeviceFlags(unsigned int) { return cudaSuccess; }
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  // A small GPU's 4 multiprocessors (what sizes grids: the fixed-point
  // items split over blocks as on a GPU with few), a Hopper block's shared
  // memory at most, a stream-ordered memory pool; any other attribute 0.
  *value = attr == cudaDevAttrMultiProcessorCount ? 4
           : attr == cudaDevAttrMaxSharedMemoryPerBlockOptin
               ? static_cast<int>(failsafe::cuda::emu::kMaxSharedBytes)
           : attr == cudaDevAttrMemoryPoolsSupported ? 1
                                                     : 0;
  return device >= 0 && device < failsafe::cuda::emu::kGpus ? cudaSuccess : cudaErrorInvalidDevice;
}

// A Hopper multiprocessor's: 2,048 threads, 32 blocks and 228 KiB of shared
// memory (1 KiB of it kept by each block), registers not counted.
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, const void*, int threads,
                                                          size_t shared) {
  if (threads <= 0 || threads > 1024) return cudaErrorInvalidValue;
  const size_t by_shared = (228u << 10) / (shared + 1024);
  *blocks =
      static_cast<int>(std::min<size_t>({32, static_cast<size_t>(2048 / threads), by_shared}));
  return cudaSuccess;
}

// --- memory ---
cudaError_t cudaMalloc(void** p, size_t bytes) {
  return failsafe::cuda::emu::Allocate(failsafe::cuda::emu::Device(), p, bytes);
}
cudaError_t cudaFree(void* p) {
  if (!p) return cudaSuccess;
  failsafe::cuda::emu::DrainAll();  // the device's work first, as on a GPU
  return failsafe::cuda::emu::FreeNow(p);
}
// The stream-ordered pool's: allocated at once, freed after the stream's
// work before it.
cudaError_t cudaMallocAsync(void** p, size_t bytes, cudaStream_t) { return cudaMalloc(p, bytes); }
cudaError_t cudaFreeAsync(void* p, cudaStream_t s) {
  if (!p) return cudaSuccess;
  {
    std::lock_guard<std::mutex> l(failsafe::cuda::emu::Mu());
    if (failsafe::cuda::emu::Device().count(p) == 0) return cudaErrorInvalidValue;
  }
  Issue(s, [p] { failsafe::cuda::emu::FreeNow(p); });
  return cudaSuccess;
}
cudaError_t cudaMallocHost(void** p, size_t bytes) {
  return failsafe::cuda::emu::Allocate(failsafe::cuda::emu::Locked(), p, bytes);
}
cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned int) { return cudaMallocHost(p, bytes); }
cudaError_t cudaFreeHost(void* p) {
  failsafe::cuda::emu::DrainAll();  // as cudaFree
  {
    std::lock_guard<std::mutex> l(failsafe::cuda::emu::Mu());
    failsafe::cuda::emu::Locked().erase(p);
  }
  std::free(p);
  return cudaSuccess;
}
cudaError_t cudaHostRegister(void* p, size_t bytes, unsigned int) {
  std::lock_guard<std::mutex> l(failsafe::cuda::emu::Mu());
  failsafe::cuda::emu::Locked()[p] = bytes;
  return cudaSuccess;
}
cudaError_t cudaHostUnregister(void* p) {
  std::lock_guard<std::mutex> l(failsafe::cuda::emu::Mu());
  return failsafe::cuda::emu::Locked().erase(p) ? cudaSuccess : cudaErrorHostMemoryNotRegistered;
}
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* a, const void* p) {
  std::memset(a, 0, sizeof(*a));
  std::lock_guard<std::mutex> l(failsafe::cuda::emu::Mu());
  if (failsafe::cuda::emu::Within(failsafe::cuda::emu::Device(), p)) {
    a->type = cudaMemoryTypeDevice;
    a->devicePointer = const_cast<void*>(p);
  } else if (failsafe::cuda::emu::Within(failsafe::cuda::emu::Locked(), p)) {
    a->type = cudaMemoryTypeHost;
    a->hostPointer = const_cast<void*>(p);
    a->devicePointer = const_cast<void*>(p);
  } else {
    a->type = cudaMemoryTypeUnregistered;
  }
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t s) {
  const void* host = failsafe::cuda::emu::HostSide(dst, src, kind);
  if (host) {
    const cudaError_t e = failsafe::cuda::emu::CheckHostSide(host, bytes);
    if (e != cudaSuccess) return e;
  }
  failsafe::cuda::emu::IssueCopy(s, kind, host, bytes, src,
                                 [=](const void* from) { std::memmove(dst, from, bytes); });
  return cudaSuccess;
}
cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch,
                              size_t width, size_t height, cudaMemcpyKind kind, cudaStream_t s) {
  const void* host = failsafe::cuda::emu::HostSide(dst, src, kind);
  const size_t pitch = kind == cudaMemcpyHostToDevice ? spitch : dpitch;
  const size_t span = height ? (height - 1) * pitch + width : 0;
  if (host) {
    const cudaError_t e = failsafe::cuda::emu::CheckHostSide(host, span);
    if (e != cudaSuccess) return e;
  }
  failsafe::cuda::emu::IssueCopy(s, kind, host, span, src, [=](const void* from) {
    for (size_t r = 0; r < height; ++r) {
      std::memmove(static_cast<char*>(dst) + r * dpitch,
                   static_cast<const char*>(from) + r * spitch, width);
    }
  });
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t s) {
  Issue(s, [=] { std::memset(p, value, bytes); });
  return cudaSuccess;
}

// --- streams, events, graphs ---
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int) {
  *s = new CUstream_st();
  std::lock_guard<std::mutex> l(failsafe::cuda::emu::Mu());
  failsafe::cuda::emu::Streams().insert(*s);
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  // Its work finishes first, as on a GPU; where some cannot yet (an
  // operation waiting for other processes), the stream is left to it.
  if (!s) return cudaErrorInvalidResourceHandle;
  failsafe::cuda::emu::Advance(s, /*block=*/false);
  if (!failsafe::cuda::emu::Idle(s)) return cudaSuccess;
  {
    std::lock_guard<std::mutex> l(failsafe::cuda::emu::Mu());
    failsafe::cuda::emu::Streams().erase(s);
  }
  delete s;
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  CUstream_st* st = failsafe::cuda::emu::StreamOf(s);
  if (st->capture) return cudaErrorStreamCaptureUnsupported;
  failsafe::cuda::emu::Advance(st, /*block=*/true);
  return cudaSuccess;
}
cudaError_t cudaStreamQuery(cudaStream_t s) {
  CUstream_st* st = failsafe::cuda::emu::StreamOf(s);
  if (st->capture) return cudaErrorStreamCaptureUnsupported;
  failsafe::cuda::emu::Advance(st, /*block=*/false);
  return failsafe::cuda::emu::Idle(st) ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaEventCreate(cudaEvent_t* e) {
  *e = new CUevent_st();
  return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int) { return cudaEventCreate(e); }
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete e;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  CUstream_st* st = failsafe::cuda::emu::StreamOf(s);
  if (st->capture) return cudaErrorStreamCaptureUnsupported;
  // Done (and timed) when the stream reaches it: at once where it is idle.
  auto mark = std::make_shared<EventMark>();
  e->mark = mark;
  e->stream = st;
  failsafe::cuda::emu::Enqueue(st, [mark] {
    mark->at = std::chrono::steady_clock::now();
    mark->done.store(true, std::memory_order_release);
    return true;
  });
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t e) {
  if (!e->mark || e->mark->done.load(std::memory_order_acquire)) return cudaSuccess;
  failsafe::cuda::emu::Advance(e->stream, /*block=*/false);
  return e->mark->done.load(std::memory_order_acquire) ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  while (cudaEventQuery(e) == cudaErrorNotReady)
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (cudaEventQuery(start) != cudaSuccess || cudaEventQuery(end) != cudaSuccess)
    return cudaErrorNotReady;
  if (!start->mark || !end->mark) return cudaErrorInvalidResourceHandle;
  *ms = std::chrono::duration<float, std::milli>(end->mark->at - start->mark->at).count();
  return cudaSuccess;
}
cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus* status) {
  *status = failsafe::cuda::emu::StreamOf(s)->capture ? cudaStreamCaptureStatusActive
                                                      : cudaStreamCaptureStatusNone;
  return cudaSuccess;
}
// The emulation checks no capture rules but a capturing stream's own (its
// synchronizations and events refused), whatever the mode.
cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode* mode) {
  thread_local cudaStreamCaptureMode current = cudaStreamCaptureModeGlobal;
  std::swap(current, *mode);
  return cudaSuccess;
}
cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode) {
  CUstream_st* st = failsafe::cuda::emu::StreamOf(s);
  if (st->capture) return cudaErrorIllegalState;
  st->capture = new std::vector<std::function<void()>>();
  return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* graph) {
  CUstream_st* st = failsafe::cuda::emu::StreamOf(s);
  if (!st->capture) return cudaErrorIllegalState;
  *graph = new CUgraph_st{std::move(*st->capture)};
  delete st->capture;
  st->capture = nullptr;
  return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  *exec = new CUgraphExec_st{graph->ops};
  return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete graph;
  return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete exec;
  return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s) {
  for (const auto& op : exec->ops) Issue(s, op);
  return cudaSuccess;
}

// --- what a GPU without them refuses ---
cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t*, void*) { return cudaErrorNotSupported; }
cudaError_t cudaIpcOpenMemHandle(void**, cudaIpcMemHandle_t, unsigned int) {
  return cudaErrorNotSupported;
}
cudaError_t cudaIpcCloseMemHandle(void*) { return cudaErrorNotSupported; }
cudaError_t cudaGetDriverEntryPointByVersion(const char*, void** fn, unsigned int,
                                             unsigned long long,
                                             cudaDriverEntryPointQueryResult* result) {
  *fn = nullptr;
  if (result) *result = cudaDriverEntryPointSymbolNotFound;
  return cudaErrorNotSupported;
}

// --- cuBLASLt: handles that hold nothing, and no algorithm offered ---
cublasStatus_t cublasLtCreate(cublasLtHandle_t* h) { return failsafe::cuda::emu::NewOpaque(h); }
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) { return failsafe::cuda::emu::DeleteOpaque(h); }
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* d, cublasComputeType_t,
                                        cudaDataType_t) {
  return failsafe::cuda::emu::NewOpaque(d);
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
  return failsafe::cuda::emu::DeleteOpaque(d);
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t, cublasLtMatmulDescAttributes_t,
                                              const void*, size_t) {
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* l, cudaDataType, uint64_t,
                                          uint64_t, int64_t) {
  return failsafe::cuda::emu::NewOpaque(l);
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
  return failsafe::cuda::emu::DeleteOpaque(l);
}
cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t,
                                                cublasLtMatrixLayoutAttribute_t, const void*,
                                                size_t) {
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* p) {
  return failsafe::cuda::emu::NewOpaque(p);
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
  return failsafe::cuda::emu::DeleteOpaque(p);
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t,
                                                    cublasLtMatmulPreferenceAttributes_t,
                                                    const void*, size_t) {
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t,
                                              cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                                              cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                                              cublasLtMatmulPreference_t, int,
                                              cublasLtMatmulHeuristicResult_t*, int* returned) {
  *returned = 0;
  return CUBLAS_STATUS_NOT_SUPPORTED;
}
cublasStatus_t cublasLtMatmulAlgoConfigGetAttribute(const cublasLtMatmulAlgo_t*,
                                                    cublasLtMatmulAlgoConfigAttributes_t, void*,
                                                    size_t, size_t*) {
  return CUBLAS_STATUS_NOT_SUPPORTED;
}
cublasStatus_t cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t, const void*, const void*,
                              cublasLtMatrixLayout_t, const void*, cublasLtMatrixLayout_t,
                              const void*, const void*, cublasLtMatrixLayout_t, void*,
                              cublasLtMatrixLayout_t, const cublasLtMatmulAlgo_t*, void*, size_t,
                              cudaStream_t) {
  FS_CHECK_MSG(false, "cuBLASLt offered no algorithm, yet a product was run through it");
  return CUBLAS_STATUS_NOT_SUPPORTED;
}

}  // extern "C"
