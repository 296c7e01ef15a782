#include "backend/cuda/nccl_group.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
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

class NcclGroup final : public Backend::DeviceGroup {
 public:
  // parent: the group `comm` is shrunk from, whose state its join shares
  // (not owned; it outlives the join).
  NcclGroup(const NcclApi* api, ncclComm_t comm, cudaStream_t stream, ncclComm_t parent = nullptr)
      : api_(api), comm_(comm), stream_(stream), parent_(parent) {
    FS_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
  }
  ~NcclGroup() override {
    Abort();
    cudaEventDestroy(event_);
  }

  Result<bool> Done() override {
    if (!comm_) return Aborted("the NCCL group was aborted");
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = api_->CommGetAsyncError(comm_, &state);
    if (r != ncclSuccess) return Fail(r);
    // Revoked: settled once NCCL no longer says in progress (an error it
    // keeps from before the revoke is the failure revoked for).
    if (revoked_) return state != ncclInProgress;
    if (!failure_.ok()) return failure_;
    if (state == ncclInProgress) return false;
    if (state != ncclSuccess) return Fail(state);
    if (!joined_ && parent_) {
      // A shrink's join goes on in its parent too (nonblocking) until the
      // parent no longer says in progress; what else the parent says (an
      // abort of its operations) is the parent's, not the new group's.
      ncclResult_t parent_state = ncclSuccess;
      if (api_->CommGetAsyncError(parent_, &parent_state) == ncclSuccess &&
          parent_state == ncclInProgress)
        return false;
    }
    joined_ = true;
    parent_ = nullptr;
    if (!in_flight_) return true;  // joined, or nothing started
    // The operation is on the stream once the state left ncclInProgress:
    // only then may work after it be queued.
    if (!recorded_) {
      const cudaError_t e = cudaEventRecord(event_, stream_);
      if (e != cudaSuccess) return Internal("NCCL group: {}", cudaGetErrorString(e));
      recorded_ = true;
    }
    const cudaError_t e = cudaEventQuery(event_);
    if (e == cudaErrorNotReady) return false;
    if (e != cudaSuccess) return Internal("NCCL group: {}", cudaGetErrorString(e));
    in_flight_ = false;
    return true;
  }

  Status StartAllReduce(int64_t* data, size_t count) override {
    FS_CHECK_MSG(!in_flight_, "an NCCL operation started before the last finished");
    if (!comm_ || revoked_ || !failure_.ok()) return Aborted("the NCCL group was aborted");
    // Unsigned: the same bits as int64_t's wrapping sum, with no overflow.
    return Started(api_->AllReduce(data, data, count, ncclUint64, ncclSum, comm_, stream_));
  }

  Status StartAllGather(const float* send, size_t count, float* recv) override {
    FS_CHECK_MSG(!in_flight_, "an NCCL operation started before the last finished");
    if (!comm_ || revoked_ || !failure_.ok()) return Aborted("the NCCL group was aborted");
    return Started(api_->AllGather(send, recv, count, ncclFloat32, comm_, stream_));
  }

  void Abort() override {
    if (!comm_) return;
    AbortComm(api_, comm_, joined_);
    comm_ = nullptr;
    in_flight_ = false;
  }

  bool Revoke() override {
    if (!comm_ || !joined_ || !Shrinks()) {
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
    in_flight_ = false;  // Done() now says whether it has settled
    return true;
  }

  Result<std::unique_ptr<DeviceGroup>> Shrink(const std::vector<int>& excluded) override {
    if (!comm_ || !joined_ || in_flight_)
      return FailedPrecondition("an NCCL group shrinks only once joined and idle");
    if (!api_->CommShrink) return Unavailable("this NCCL cannot shrink a group");
    std::vector<int> ranks = excluded;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = nullptr;
    // NCCL_SHRINK_ABORT: a parent whose member failed (revoked, so nothing
    // of it is left under way to end), as NCCL asks for one in error.
    const ncclResult_t r = api_->CommShrink(comm_, ranks.data(), static_cast<int>(ranks.size()),
                                            &comm, &config, NCCL_SHRINK_ABORT);
    if (r != ncclSuccess && r != ncclInProgress) {
      std::string what = Describe(api_, r, comm_);
      if (comm) api_->CommAbort(comm);
      return Unavailable("{}", what);
    }
    return std::unique_ptr<DeviceGroup>(new NcclGroup(api_, comm, stream_, comm_));
  }

 private:
  Status Started(ncclResult_t r) {
    if (r != ncclSuccess && r != ncclInProgress) return Fail(r);
    in_flight_ = true;
    recorded_ = false;
    return Status::Ok();
  }
  // A peer's failure (its connection gone, an error it reported) is
  // kUnavailable; NCCL's own, or this device's, kInternal.
  bool Shrinks() const { return api_->CommRevoke && api_->CommShrink; }
  // A peer's failure leaves a joined group for Revoke (and the survivors'
  // shrink) where NCCL can: its operations refused, its kernels spinning
  // until then (the caller revokes or aborts at once); else it ends here.
  Status Fail(ncclResult_t r) {
    std::string what = Describe(api_, r, comm_);
    const bool peer = r == ncclRemoteError || r == ncclSystemError;
    Status st = peer ? Unavailable("{}", what) : Internal("{}", what);
    if (peer && joined_ && !revoked_ && Shrinks()) {
      failure_ = st;
      in_flight_ = false;
    } else {
      Abort();
    }
    return st;
  }

  const NcclApi* const api_;
  ncclComm_t comm_;
  const cudaStream_t stream_;
  ncclComm_t parent_;  // a shrink's, until its join finished
  cudaEvent_t event_ = nullptr;
  bool joined_ = false;     // the join finished
  bool revoked_ = false;    // no operation may start
  Status failure_;          // a peer's, kept for Revoke (Fail)
  bool in_flight_ = false;  // an operation started and not yet seen finished
  bool recorded_ = false;   // event_ recorded after it
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
                                                            int size, cudaStream_t stream) {
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
  return std::unique_ptr<Backend::DeviceGroup>(new NcclGroup(l.api, comm, stream));
}

}  // namespace failsafe::cuda
