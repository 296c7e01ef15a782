#include "backend/cuda/nccl_group.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <type_traits>

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
  int version = 0;
  if (api.GetVersion(&version) != ncclSuccess || version < kOldestNccl) {
    l.why = fmt::format("{} is NCCL {}, older than 2.18", file, version);
    return l;
  }
  FS_LOG_DEBUG("NCCL {} from {}", version, file);
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
  NcclGroup(const NcclApi* api, ncclComm_t comm, cudaStream_t stream)
      : api_(api), comm_(comm), stream_(stream) {
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
    if (state == ncclInProgress) return false;
    if (state != ncclSuccess) return Fail(state);
    joined_ = true;
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
    if (!comm_) return Aborted("the NCCL group was aborted");
    // Unsigned: the same bits as int64_t's wrapping sum, with no overflow.
    return Started(api_->AllReduce(data, data, count, ncclUint64, ncclSum, comm_, stream_));
  }

  Status StartAllGather(const float* send, size_t count, float* recv) override {
    FS_CHECK_MSG(!in_flight_, "an NCCL operation started before the last finished");
    if (!comm_) return Aborted("the NCCL group was aborted");
    return Started(api_->AllGather(send, recv, count, ncclFloat32, comm_, stream_));
  }

  void Abort() override {
    if (!comm_) return;
    AbortComm(api_, comm_, joined_);
    comm_ = nullptr;
    in_flight_ = false;
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
  Status Fail(ncclResult_t r) {
    std::string what = Describe(api_, r, comm_);
    Abort();
    if (r == ncclRemoteError || r == ncclSystemError) return Unavailable("{}", what);
    return Internal("{}", what);
  }

  const NcclApi* const api_;
  ncclComm_t comm_;
  const cudaStream_t stream_;
  cudaEvent_t event_ = nullptr;
  bool joined_ = false;     // the join finished
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
