#include "backend/cuda/nccl_group.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <deque>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/nccl_api.h"
#include "common/check.h"
#include "common/log.h"

namespace failsafe::cuda {
namespace {

// NCCL older than this has no nonblocking communicators worth trusting
// (ncclCommGetAsyncError's in-progress states settled in 2.18).
constexpr int kOldestNccl = 21800;

struct Loaded {
  const NcclApi* api = nullptr;
  std::string why;  // where api is null
};

#ifndef FAILSAFE_CUDA_EMULATION
Loaded LoadLibrary() {
  Loaded l;
  const char* named = std::getenv("FAILSAFE_NCCL_LIBRARY");
  const std::string file = named && *named ? named : "libnccl.so.2";
  void* h = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    l.why = fmt::format("cannot load {}: {}", file, dlerror());
    return l;
  }
  static NcclApi api;
  std::string missing;
  auto bind = [&](auto& fn, const char* symbol) {
    void* p = dlsym(h, symbol);
    if (!p && missing.empty()) missing = symbol;
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
  };
  bind(api.GetVersion, "ncclGetVersion");
  bind(api.GetUniqueId, "ncclGetUniqueId");
  bind(api.CommInitRankConfig, "ncclCommInitRankConfig");
  bind(api.CommGetAsyncError, "ncclCommGetAsyncError");
  bind(api.CommAbort, "ncclCommAbort");
  bind(api.AllReduce, "ncclAllReduce");
  bind(api.AllGather, "ncclAllGather");
  bind(api.GetErrorString, "ncclGetErrorString");
  bind(api.GetLastError, "ncclGetLastError");
  if (!missing.empty()) {
    l.why = fmt::format("{} has no {}", file, missing);
    return l;
  }
  // Optional (2.28): without them, the survivors of a group whose member
  // failed make theirs anew from an id.
  api.CommRevoke = reinterpret_cast<decltype(api.CommRevoke)>(dlsym(h, "ncclCommRevoke"));
  api.CommShrink = reinterpret_cast<decltype(api.CommShrink)>(dlsym(h, "ncclCommShrink"));
  int version = 0;
  if (api.GetVersion(&version) != ncclSuccess || version < kOldestNccl) {
    l.why = fmt::format("{} is NCCL {}, older than 2.18", file, version);
    return l;
  }
  FS_LOG_DEBUG("NCCL {} from {}{}", version, file,
               api.CommRevoke && api.CommShrink ? " (groups shrink)" : "");
  l.api = &api;
  return l;
}
#endif

const Loaded& Load() {
  static const Loaded loaded = [] {
    const char* on = std::getenv("FAILSAFE_NCCL");
    if (on && std::strcmp(on, "0") == 0) return Loaded{nullptr, "FAILSAFE_NCCL=0"};
#ifdef FAILSAFE_CUDA_EMULATION
    return Loaded{EmulatedNccl(), ""};
#else
    return LoadLibrary();
#endif
  }();
  return loaded;
}

std::string Describe(const NcclApi* api, ncclResult_t r, ncclComm_t comm) {
  const char* last = comm ? api->GetLastError(comm) : nullptr;
  return fmt::format("NCCL: {}{}{}", api->GetErrorString(r), last && *last ? ": " : "",
                     last ? last : "");
}

// Ends `comm`: at once where its join finished (its kernels stop before
// the caller goes on); a join still under way on a thread of its own, since
// NCCL's abort then waits for the join's own thread to give up, which may
// take a while, and the caller has a failure to report.
void AbortComm(const NcclApi* api, ncclComm_t comm, bool joined) {
  if (joined) {
    api->CommAbort(comm);
  } else {
    std::thread([api, comm] { api->CommAbort(comm); }).detach();
  }
}

// FAILSAFE_NCCL_SHRINK=0: every group from a new id.
bool ShrinkOn() {
  static const bool on = [] {
    const char* v = std::getenv("FAILSAFE_NCCL_SHRINK");
    return !(v && std::strcmp(v, "0") == 0);
  }();
  return on;
}

// Where NCCL publishes a shrink's communicator: written by NCCL's own
// thread as the shrink's join ends (it stays null until then), read once
// the parent no longer says in progress.
ncclComm_t LoadPublished(const ncclComm_t* slot) { return __atomic_load_n(slot, __ATOMIC_ACQUIRE); }

class NcclGroup final : public Backend::DeviceGroup {
 public:
  // A group joined by id.
  NcclGroup(const NcclApi* api, ncclComm_t comm, cudaStream_t stream, int gpu)
      : api_(api), comm_(comm), stream_(stream), gpu_(gpu) {}
  // A group shrunk from `parent` (owned from here on): its communicator
  // is published into *slot once the shrink's join ends.
  NcclGroup(const NcclApi* api, ncclComm_t parent, std::unique_ptr<ncclComm_t> slot,
            cudaStream_t stream, int gpu)
      : api_(api),
        comm_(nullptr),
        stream_(stream),
        gpu_(gpu),
        parent_(parent),
        slot_(std::move(slot)) {}
  ~NcclGroup() override {
    Abort();
    for (cudaEvent_t e : spare_) cudaEventDestroy(e);
  }

  Result<bool> Done() override { return Reached(started_); }
  uint64_t started() const override { return started_; }

  Result<bool> Reached(uint64_t n) override {
    if (!comm_ && !parent_) return Aborted("the NCCL group was aborted");
    if (!comm_) {
      // A shrink's join: under way in its parent (nonblocking) until the
      // parent no longer says in progress; NCCL has published the new
      // communicator by then (null where the shrink failed early).
      ncclResult_t parent_state = ncclSuccess;
      const ncclResult_t r = api_->CommGetAsyncError(parent_, &parent_state);
      if (r == ncclSuccess && parent_state == ncclInProgress) return false;
      comm_ = LoadPublished(slot_.get());
      if (r != ncclSuccess || parent_state != ncclSuccess || !comm_) {
        std::string what = Describe(api_, r != ncclSuccess ? r : parent_state, parent_);
        Abort();
        return Unavailable("the NCCL group's shrink: {}", what);
      }
    }
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = api_->CommGetAsyncError(comm_, &state);
    if (r != ncclSuccess) return Fail(r);
    // Revoked: settled once NCCL no longer says in progress. An error it
    // says then is one it keeps (a peer's, seen by its proxy thread), which
    // would fail a shrink too.
    if (revoked_) {
      if (state == ncclInProgress) return false;
      if (state != ncclSuccess) kept_ = state;
      return true;
    }
    if (state == ncclInProgress) return false;
    if (state != ncclSuccess) return Fail(state);
    if (!joined_) {
      joined_ = true;
      if (parent_) {
        // Its parent is done with: aborted (never destroyed, which can
        // wait for the member that failed), off this thread.
        std::thread([api = api_, parent = parent_] { api->CommAbort(parent); }).detach();
        parent_ = nullptr;
        slot_.reset();
      }
    }
    if (!in_flight_) return true;  // joined, or nothing started
    // The last operation is on the stream once the state left
    // ncclInProgress: marked there.
    enqueued_ = true;
    FS_RETURN_IF_ERROR(MarkLast());
    while (!marks_.empty() && marks_.front().first <= n) {
      const cudaError_t e = cudaEventQuery(marks_.front().second);
      if (e == cudaErrorNotReady) {
        (void)cudaGetLastError();  // not an error: kept from the next launch's check
        return false;
      }
      if (e != cudaSuccess) return Internal("NCCL group: {}", cudaGetErrorString(e));
      spare_.push_back(marks_.front().second);
      marks_.pop_front();
    }
    if (n >= started_) in_flight_ = false;
    return true;
  }

  Result<bool> Enqueued() override {
    if (!in_flight_ || enqueued_) return true;
    if (!comm_) return Aborted("the NCCL group was aborted");
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = api_->CommGetAsyncError(comm_, &state);
    if (r != ncclSuccess) return Fail(r);
    if (state == ncclInProgress) return false;
    if (state != ncclSuccess) return Fail(state);
    enqueued_ = true;
    FS_RETURN_IF_ERROR(MarkLast());
    return true;
  }

  Status StartAllReduce(int64_t* data, size_t count) override {
    FS_CHECK_MSG(!in_flight_ || enqueued_, "an NCCL operation started before the last's enqueue");
    if (!Usable()) return Aborted("the NCCL group was aborted");
    // Unsigned: the same bits as int64_t's wrapping sum, with no overflow.
    return Started(api_->AllReduce(data, data, count, ncclUint64, ncclSum, comm_, stream_));
  }

  Status StartAllGather(const float* send, size_t count, float* recv) override {
    FS_CHECK_MSG(!in_flight_ || enqueued_, "an NCCL operation started before the last's enqueue");
    if (!Usable()) return Aborted("the NCCL group was aborted");
    return Started(api_->AllGather(send, recv, count, ncclFloat32, comm_, stream_));
  }

  void Abort() override {
    DropMarks();
    if (parent_) {
      // A shrink's join not finished: its parent first (which ends the
      // join, waiting for NCCL's thread of it), then the new communicator
      // NCCL published meanwhile, if any; off this thread.
      std::thread([api = api_, parent = parent_, comm = comm_, slot = std::move(slot_)] {
        api->CommAbort(parent);
        const ncclComm_t published = comm ? comm : LoadPublished(slot.get());
        if (published) api->CommAbort(published);
      }).detach();
      parent_ = nullptr;
      comm_ = nullptr;
      return;
    }
    if (!comm_) return;
    AbortComm(api_, comm_, joined_);
    comm_ = nullptr;
  }

  bool Revoke() override {
    if (comm_ && revoked_) return true;
    // Not where NCCL reported an error (it keeps it, and would fail the
    // shrink), or where the last operation's enqueue may still be NCCL's
    // job (not yet seen out of ncclInProgress): a revoke then ends that
    // job under NCCL's own feet.
    if (!comm_ || !joined_ || !Shrinks() || (in_flight_ && !enqueued_)) {
      Abort();
      return false;
    }
    const ncclResult_t r = api_->CommRevoke(comm_, 0);  // NCCL_REVOKE_DEFAULT
    if (r != ncclSuccess && r != ncclInProgress) {
      FS_LOG_DEBUG("NCCL group: revoke: {}", Describe(api_, r, comm_));
      Abort();
      return false;
    }
    revoked_ = true;
    DropMarks();  // Done() now says whether it has settled
    return true;
  }

  Result<std::unique_ptr<DeviceGroup>> Shrink(const std::vector<int>& excluded) override {
    if (!Shrinks()) return Unavailable("this NCCL cannot shrink a group");
    if (!comm_ || !revoked_) return FailedPrecondition("an NCCL group shrinks only once revoked");
    if (kept_ != ncclSuccess)
      return Unavailable("the NCCL group keeps an error: {}", api_->GetErrorString(kept_));
    if (excluded.empty()) return InvalidArgument("an NCCL group shrinks by one member or more");
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream_, &capturing) != cudaSuccess ||
        capturing != cudaStreamCaptureStatusNone)
      return FailedPrecondition("an NCCL group shrinks outside a graph's capture");
    FS_CUDA_CHECK(cudaSetDevice(gpu_));  // NCCL binds the group to the thread's device
    std::vector<int> ranks = excluded;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    auto slot = std::make_unique<ncclComm_t>(nullptr);
    // NCCL_SHRINK_ABORT: a parent whose member may have failed (revoked,
    // settled: nothing of it is left under way to end), as NCCL asks for
    // one in error; no resources shared with it.
    const ncclResult_t r = api_->CommShrink(comm_, ranks.data(), static_cast<int>(ranks.size()),
                                            slot.get(), &config, NCCL_SHRINK_ABORT);
    if (r != ncclSuccess && r != ncclInProgress) {
      // Not started: NCCL published nothing, and this group is the
      // caller's still.
      return Unavailable("{}", Describe(api_, r, comm_));
    }
    const ncclComm_t parent = comm_;
    comm_ = nullptr;
    return std::unique_ptr<DeviceGroup>(
        new NcclGroup(api_, parent, std::move(slot), stream_, gpu_));
  }

 private:
  bool Usable() const { return comm_ && joined_ && !revoked_; }
  Status Started(ncclResult_t r) {
    if (r != ncclSuccess && r != ncclInProgress) return Fail(r);
    ++started_;
    in_flight_ = true;
    // ncclSuccess: enqueued; ncclInProgress: NCCL's job until the state
    // leaves it.
    enqueued_ = r == ncclSuccess;
    return enqueued_ ? MarkLast() : Status::Ok();
  }
  // An event after the last operation started (enqueued), once.
  Status MarkLast() {
    if (!marks_.empty() && marks_.back().first == started_) return Status::Ok();
    cudaEvent_t e = nullptr;
    if (spare_.empty()) {
      const cudaError_t made = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
      if (made != cudaSuccess) return Internal("NCCL group: {}", cudaGetErrorString(made));
    } else {
      e = spare_.back();
      spare_.pop_back();
    }
    marks_.emplace_back(started_, e);
    const cudaError_t r = cudaEventRecord(e, stream_);
    if (r != cudaSuccess) return Internal("NCCL group: {}", cudaGetErrorString(r));
    return Status::Ok();
  }
  // The operations under way ended: their marks no longer waited for.
  void DropMarks() {
    in_flight_ = false;
    for (auto& m : marks_) spare_.push_back(m.second);
    marks_.clear();
  }
  bool Shrinks() const { return api_->CommRevoke && api_->CommShrink && ShrinkOn(); }
  // A peer's failure (its connection gone, an error it reported) is
  // kUnavailable; NCCL's own, or this device's, kInternal. Either ends
  // the group: NCCL keeps the error, so it could not be shrunk.
  Status Fail(ncclResult_t r) {
    std::string what = Describe(api_, r, comm_);
    const bool peer = r == ncclRemoteError || r == ncclSystemError;
    Abort();
    return peer ? Unavailable("{}", what) : Internal("{}", what);
  }

  const NcclApi* const api_;
  ncclComm_t comm_;  // null once aborted, or a shrink's until published
  const cudaStream_t stream_;
  const int gpu_;
  // A shrink's parent and where NCCL publishes its communicator, until
  // its join finished (owned: aborted then, or with it).
  ncclComm_t parent_ = nullptr;
  std::unique_ptr<ncclComm_t> slot_;
  // Events recorded after operations (by their number), in order, not yet
  // seen done; and events free for reuse.
  std::deque<std::pair<uint64_t, cudaEvent_t>> marks_;
  std::vector<cudaEvent_t> spare_;
  uint64_t started_ = 0;             // operations started, numbered from 1
  bool joined_ = false;              // the join finished
  bool revoked_ = false;             // no operation may start
  ncclResult_t kept_ = ncclSuccess;  // the error a revoked group settled with
  bool in_flight_ = false;           // operations started and not yet seen finished
  bool enqueued_ = false;            // the last of them is on the stream
};

}  // namespace

void PrepareNcclEnvironment() {
  // Every connection made as a group forms rather than at its first
  // operation of each kind, which would otherwise fall inside a step.
  setenv("NCCL_RUNTIME_CONNECT", "0", 0);
  // Each device process as a host of its own (NCCL refuses two members
  // on one GPU; as hosts apart they talk over its network transport, the
  // host's sockets): how NCCL's joins, operations and aborts are checked
  // on a machine with one GPU. Slow; a test's, never a deployment's.
  if (NcclApart()) {
    setenv("NCCL_HOSTID", fmt::format("failsafe-{}", getpid()).c_str(), 1);
    setenv("NCCL_NET", "Socket", 1);  // not InfiniBand or a plugin's
    setenv("NCCL_IB_DISABLE", "1", 1);
    setenv("NCCL_SOCKET_IFNAME", "=lo", 0);  // every member is on this host
  }
}

bool NcclApart() {
  static const bool apart = [] {
    const char* v = std::getenv("FAILSAFE_NCCL_APART");
    return v && std::strcmp(v, "1") == 0;
  }();
  return apart;
}

bool NcclLoaded(std::string* why) {
  const Loaded& l = Load();
  if (!l.api && why) *why = l.why;
  return l.api != nullptr;
}

Result<std::string> NewNcclGroupId() {
  const Loaded& l = Load();
  if (!l.api) return Unavailable("{}", l.why);
  ncclUniqueId id;
  const ncclResult_t r = l.api->GetUniqueId(&id);
  if (r != ncclSuccess) return Unavailable("{}", Describe(l.api, r, nullptr));
  return std::string(id.internal, sizeof(id.internal));
}

Result<std::unique_ptr<Backend::DeviceGroup>> JoinNcclGroup(const std::string& id, int rank,
                                                            int size, cudaStream_t stream,
                                                            int gpu) {
  const Loaded& l = Load();
  if (!l.api) return Unavailable("{}", l.why);
  ncclUniqueId uid;
  if (id.size() != sizeof(uid.internal))
    return InvalidArgument("an NCCL group id of {} bytes, not {}", id.size(), sizeof(uid.internal));
  std::memcpy(uid.internal, id.data(), sizeof(uid.internal));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  const ncclResult_t r = l.api->CommInitRankConfig(&comm, size, uid, rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    std::string what = Describe(l.api, r, comm);
    if (comm) l.api->CommAbort(comm);
    return Unavailable("{}", what);
  }
  return std::unique_ptr<Backend::DeviceGroup>(new NcclGroup(l.api, comm, stream, gpu));
}

}  // namespace failsafe::cuda
