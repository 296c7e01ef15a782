// NCCL's calls that FailSafe makes (nccl_api.h), emulated between the
// processes of one host for the emulated GPU: a group is a POSIX shared
// memory region named by its id, with a slot per member and buffer, and an
// operation goes in chunks of a slot. An operation waits on its stream
// (emulation.h: Pending) until every member has put in its part, so that a
// member that died or hangs leaves the others' operations unfinished, as on
// a GPU, until they abort. Joins are nonblocking as configured: a join is
// in progress until every member has joined.
//
// The sums: unsigned integers wrapping (what FailSafe's fixed-point sums
// take), floats in rank order.
//
// A revoke ends this member's operations under way and leaves its view of
// the group settled after one poll in progress; a second is refused. A
// shrink (by one rank or more, of a group joined and settled) joins the
// group named by the parent's name and the ranks excluded, which every
// remaining member names alike, as a join by id; as NCCL's nonblocking
// shrink, it publishes the new communicator into the caller's slot only
// once that join has finished (the parent in progress until then, and
// null there meanwhile), and an abort of the parent before then ends the
// new one's join (published, aborted).
//
// What a real NCCL may answer, and the callers must handle, it answers too:
// every other operation's enqueue "in progress" (ncclInProgress, then one
// poll of ncclCommGetAsyncError in progress). A member whose process is
// gone leaves the others' operations unfinished, as between GPUs of one
// host (no NCCL thread watches a peer there); with FAILSAFE_NCCL_APART=1
// (NCCL's network transport, whose proxy thread sees a connection go) it
// is a remote error (ncclRemoteError), which NCCL keeps: through a revoke,
// and failing a shrink.
#include <errno.h>
#include <fcntl.h>
#include <nccl.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>

#include "backend/cuda/emulation/emulation.h"
#include "backend/cuda/nccl_api.h"

namespace failsafe::cuda::emu {
namespace {

constexpr int kMaxRanks = 64;
constexpr size_t kSlotBytes = 64u << 10;

struct Header {
  std::atomic<uint32_t> joined;
  std::atomic<int32_t> pid[kMaxRanks];        // each member's process
  std::atomic<uint64_t> arrived[kMaxRanks];   // chunks whose part each member put in its slot
  std::atomic<uint64_t> finished[kMaxRanks];  // chunks each member has read
};
constexpr size_t kHeaderBytes = (sizeof(Header) + 4095) / 4096 * 4096;
static_assert(std::atomic<uint64_t>::is_always_lock_free);

// A member's view of its group; operations under way hold it too.
struct Group {
  std::string name;
  int rank = 0, size = 0;
  char* base = nullptr;
  size_t bytes = 0;
  std::atomic<bool> aborted{false};
  bool joined = false;
  uint64_t chunks = 0;  // chunks started
  Header* header() const { return reinterpret_cast<Header*>(base); }
  char* Slot(uint64_t chunk, int member) const {
    return base + kHeaderBytes +
           (static_cast<size_t>(chunk & 1) * static_cast<size_t>(size) +
            static_cast<size_t>(member)) *
               kSlotBytes;
  }
  ~Group() {
    if (base) munmap(base, bytes);
  }
};

}  // namespace
}  // namespace failsafe::cuda::emu

struct ncclComm {
  std::shared_ptr<failsafe::cuda::emu::Group> group;
  std::string last_error;
  uint64_t operations = 0;
  bool enqueue_pending = false;  // the last operation said in progress
  bool revoked = false;
  int revoke_polls = 0;     // polls in progress left after the revoke
  bool kept_error = false;  // a member gone, seen as over the network
  // A shrink not yet published: the new communicator and where it goes.
  ncclComm* shrink_child = nullptr;
  ncclComm** shrink_slot = nullptr;
};

namespace failsafe::cuda::emu {
namespace {

size_t ElementBytes(ncclDataType_t t) {
  switch (t) {
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
      return 8;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    default:
      return 0;
  }
}

enum class Kind { kSumU64, kSumF32, kGather };

class Operation final : public Pending {
 public:
  Operation(std::shared_ptr<Group> g, Kind kind, const void* send, void* recv, size_t count,
            size_t elem)
      : g_(std::move(g)),
        kind_(kind),
        send_(static_cast<const char*>(send)),
        recv_(static_cast<char*>(recv)),
        count_(count),
        elem_(elem) {}

  bool Advance(bool block) override {
    for (;;) {
      if (done_ || g_->aborted.load()) return done_ = true;
      if (Step()) continue;
      if (!block) return false;
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

 private:
  // One move of the chunk under way; false where it must wait for a peer.
  bool Step() {
    Header* h = g_->header();
    const size_t per = kSlotBytes / elem_;
    const size_t n = std::min(per, count_ - off_);
    if (!written_) {
      if (off_ >= count_) return done_ = true;
      chunk_ = ++g_->chunks;
      // The slot was last read in chunk - 2: by every member before now.
      for (int m = 0; m < g_->size; ++m) {
        if (chunk_ > 2 && h->finished[m].load(std::memory_order_acquire) < chunk_ - 2) {
          --g_->chunks;
          return false;
        }
      }
      std::memcpy(g_->Slot(chunk_, g_->rank), send_ + off_ * elem_, n * elem_);
      h->arrived[g_->rank].store(chunk_, std::memory_order_release);
      written_ = true;
    }
    for (int m = 0; m < g_->size; ++m) {
      if (h->arrived[m].load(std::memory_order_acquire) < chunk_) return false;
    }
    if (kind_ == Kind::kGather) {
      for (int m = 0; m < g_->size; ++m) {
        std::memcpy(recv_ + (static_cast<size_t>(m) * count_ + off_) * elem_, g_->Slot(chunk_, m),
                    n * elem_);
      }
    } else {
      for (size_t i = 0; i < n; ++i) {
        if (kind_ == Kind::kSumU64) {
          uint64_t sum = 0;
          for (int m = 0; m < g_->size; ++m)
            sum += reinterpret_cast<const uint64_t*>(g_->Slot(chunk_, m))[i];
          reinterpret_cast<uint64_t*>(recv_)[off_ + i] = sum;
        } else {
          float sum = reinterpret_cast<const float*>(g_->Slot(chunk_, 0))[i];
          for (int m = 1; m < g_->size; ++m)
            sum += reinterpret_cast<const float*>(g_->Slot(chunk_, m))[i];
          reinterpret_cast<float*>(recv_)[off_ + i] = sum;
        }
      }
    }
    h->finished[g_->rank].store(chunk_, std::memory_order_release);
    off_ += n;
    written_ = false;
    if (off_ >= count_) done_ = true;
    return true;
  }

  const std::shared_ptr<Group> g_;
  const Kind kind_;
  const char* const send_;
  char* const recv_;
  const size_t count_, elem_;
  size_t off_ = 0;        // elements done
  uint64_t chunk_ = 0;    // the chunk under way
  bool written_ = false;  // its part is in the slot
  bool done_ = false;
};

bool Joined(ncclComm* c) {
  Group& g = *c->group;
  if (!g.joined &&
      g.header()->joined.load(std::memory_order_acquire) >= static_cast<uint32_t>(g.size)) {
    g.joined = true;
    shm_unlink(g.name.c_str());  // every member has it mapped
  }
  return g.joined;
}

ncclResult_t Issue(ncclComm* c, Kind kind, const void* send, void* recv, size_t count, size_t elem,
                   cudaStream_t stream) {
  if (!c || !Joined(c) || c->revoked) {
    if (c)
      c->last_error =
          c->revoked ? "an operation on a revoked group" : "an operation before the join finished";
    return ncclInvalidUsage;
  }
  if (count == 0) return ncclSuccess;
  auto op = std::make_shared<Operation>(c->group, kind, send, recv, count, elem);
  if (!IssuePending(stream, std::move(op))) {
    c->last_error = "operations are not captured by the emulation";
    return ncclInvalidUsage;
  }
  if (++c->operations % 2 == 0) {
    c->enqueue_pending = true;
    return ncclInProgress;
  }
  return ncclSuccess;
}

bool OverTheNetwork() {
  static const bool apart = [] {
    const char* v = std::getenv("FAILSAFE_NCCL_APART");
    return v && std::strcmp(v, "1") == 0;
  }();
  return apart;
}

// A member whose process no longer exists.
bool MemberGone(const Group& g) {
  for (int m = 0; m < g.size; ++m) {
    const pid_t pid = g.header()->pid[m].load(std::memory_order_acquire);
    if (pid > 0 && ::kill(pid, 0) != 0 && errno == ESRCH) return true;
  }
  return false;
}

ncclResult_t GetVersion(int* version) {
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

ncclResult_t GetUniqueId(ncclUniqueId* id) {
  std::memset(id->internal, 0, sizeof(id->internal));
  std::random_device rd;
  const uint64_t r = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(getpid());
  std::snprintf(id->internal, sizeof(id->internal), "/fs-emu-nccl-%016llx",
                static_cast<unsigned long long>(r));
  return ncclSuccess;
}

// Joins the group named `name` as `rank` of `nranks`.
ncclResult_t JoinNamed(ncclComm_t* comm, int nranks, const std::string& name, int rank,
                       ncclConfig_t* config) {
  *comm = nullptr;
  if (nranks < 1 || nranks > kMaxRanks || rank < 0 || rank >= nranks) return ncclInvalidArgument;
  auto g = std::make_shared<Group>();
  g->name = name;
  g->rank = rank;
  g->size = nranks;
  g->bytes = kHeaderBytes + 2 * static_cast<size_t>(nranks) * kSlotBytes;
  const int fd = shm_open(g->name.c_str(), O_CREAT | O_RDWR, 0600);
  if (fd < 0) return ncclSystemError;
  void* p = MAP_FAILED;
  if (ftruncate(fd, static_cast<off_t>(g->bytes)) == 0)
    p = mmap(nullptr, g->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    shm_unlink(g->name.c_str());
    return ncclSystemError;
  }
  g->base = static_cast<char*>(p);
  g->header()->pid[rank].store(getpid(), std::memory_order_release);
  g->header()->joined.fetch_add(1, std::memory_order_acq_rel);
  *comm = new ncclComm{std::move(g), ""};
  const bool blocking = !config || config->blocking != 0;
  if (!blocking) return Joined(*comm) ? ncclSuccess : ncclInProgress;
  while (!Joined(*comm)) std::this_thread::sleep_for(std::chrono::microseconds(100));
  return ncclSuccess;
}

ncclResult_t CommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank,
                                ncclConfig_t* config) {
  return JoinNamed(comm, nranks,
                   std::string(id.internal, strnlen(id.internal, sizeof(id.internal))), rank,
                   config);
}

// NCCL's proxy thread over the network transport: a member gone is a
// lost connection, an error it keeps. A revoke stops the proxy: what it saw
// by then it keeps, and it sees nothing more.
void WatchMembers(ncclComm* comm) {
  if (comm->kept_error || comm->revoked || !OverTheNetwork() || !MemberGone(*comm->group)) return;
  comm->last_error = "a member's connection is gone";
  comm->kept_error = true;
}

ncclResult_t CommRevoke(ncclComm_t comm, int flags) {
  if (!comm || flags != 0) return ncclInvalidArgument;
  if (comm->revoked) {
    comm->last_error = "the communicator is revoked already";
    return ncclInvalidArgument;
  }
  if (!Joined(comm) || comm->shrink_child) {
    comm->last_error = "a revoke before the join finished, or during a shrink";
    return ncclInvalidUsage;
  }
  WatchMembers(comm);  // a last look before the revoke stops the proxy
  comm->revoked = true;
  comm->revoke_polls = 1;
  comm->enqueue_pending = false;
  // This member's operations under way end; its later ones are refused.
  // (Operations hold the member's view: a view of its own for the rest.)
  comm->group->aborted.store(true);
  return ncclInProgress;
}

ncclResult_t CommShrink(ncclComm_t comm, int* excluded, int count, ncclComm_t* newcomm,
                        ncclConfig_t* config, int flags) {
  if (!comm || !newcomm || count <= 0 || !excluded ||
      (flags != NCCL_SHRINK_DEFAULT && flags != NCCL_SHRINK_ABORT))
    return ncclInvalidArgument;
  *newcomm = nullptr;
  const Group& g = *comm->group;
  if (!Joined(comm) || comm->revoke_polls > 0 || comm->shrink_child ||
      (!comm->revoked && comm->enqueue_pending)) {
    comm->last_error = "a shrink of a group not joined or settled, or with an operation under way";
    return ncclInvalidArgument;
  }
  if (comm->kept_error) {
    comm->last_error = "a member's connection is gone";
    return ncclRemoteError;
  }
  // The new name: the parent's and the ranks excluded (FNV-1a), alike on
  // every remaining member.
  uint64_t h = 0xcbf29ce484222325ULL;
  auto mix = [&](uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xff;
      h *= 0x100000001b3ULL;
    }
  };
  for (char c : g.name) mix(static_cast<unsigned char>(c));
  int below = 0;
  for (int i = 0; i < count; ++i) {
    const int r = excluded[i];
    if (r < 0 || r >= g.size || r == g.rank || (i > 0 && r <= excluded[i - 1])) {
      comm->last_error = "excluded ranks out of range, unordered, or this member's";
      return ncclInvalidArgument;
    }
    below += r < g.rank;
    mix(static_cast<uint64_t>(r));
  }
  char name[40];
  std::snprintf(name, sizeof(name), "/fs-emu-nccl-%016llx", static_cast<unsigned long long>(h));
  ncclComm_t child = nullptr;
  ncclConfig_t nonblocking = config ? *config : ncclConfig_t(NCCL_CONFIG_INITIALIZER);
  nonblocking.blocking = 0;
  const ncclResult_t r = JoinNamed(&child, g.size - count, name, g.rank - below, &nonblocking);
  if (r != ncclSuccess && r != ncclInProgress) return r;
  if (config && config->blocking != 0) {
    while (!Joined(child)) std::this_thread::sleep_for(std::chrono::microseconds(100));
    *newcomm = child;
    return ncclSuccess;
  }
  comm->shrink_child = child;
  comm->shrink_slot = newcomm;
  return ncclInProgress;
}

ncclResult_t CommGetAsyncError(ncclComm_t comm, ncclResult_t* state) {
  if (comm->shrink_child) {
    // In progress while the shrink's join goes on; its communicator
    // published once that has finished, on the last poll that says so.
    *state = ncclInProgress;
    if (Joined(comm->shrink_child)) {
      __atomic_store_n(comm->shrink_slot, comm->shrink_child, __ATOMIC_RELEASE);
      comm->shrink_child = nullptr;
      comm->shrink_slot = nullptr;
    }
    return ncclSuccess;
  }
  WatchMembers(comm);
  if (comm->revoked && comm->revoke_polls > 0) {  // settled after a poll
    --comm->revoke_polls;
    *state = ncclInProgress;
  } else if (comm->kept_error) {
    *state = ncclRemoteError;
  } else if (comm->revoked) {
    *state = ncclSuccess;
  } else if (comm->enqueue_pending) {
    comm->enqueue_pending = false;
    *state = ncclInProgress;
  } else {
    *state = Joined(comm) ? ncclSuccess : ncclInProgress;
  }
  return ncclSuccess;
}

ncclResult_t CommAbort(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  if (ncclComm* child = comm->shrink_child) {
    // The shrink's join ends, failed; NCCL publishes what it made.
    child->group->aborted.store(true);
    child->last_error = "the parent was aborted during the shrink";
    __atomic_store_n(comm->shrink_slot, child, __ATOMIC_RELEASE);
  }
  comm->group->aborted.store(true);
  if (!comm->group->joined) shm_unlink(comm->group->name.c_str());
  delete comm;
  return ncclSuccess;
}

ncclResult_t AllReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                       ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  // Sums of 64-bit integers and of floats: what FailSafe asks for.
  const bool integers = type == ncclUint64 || type == ncclInt64;
  if (op != ncclSum || !(integers || type == ncclFloat32)) return ncclInvalidArgument;
  return Issue(comm, type == ncclFloat32 ? Kind::kSumF32 : Kind::kSumU64, send, recv, count,
               ElementBytes(type), stream);
}

ncclResult_t AllGather(const void* send, void* recv, size_t count, ncclDataType_t type,
                       ncclComm_t comm, cudaStream_t stream) {
  if (ElementBytes(type) == 0) return ncclInvalidArgument;
  return Issue(comm, Kind::kGather, send, recv, count, ElementBytes(type), stream);
}

const char* GetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess:
      return "no error";
    case ncclSystemError:
      return "unhandled system error";
    case ncclInternalError:
      return "internal error";
    case ncclInvalidArgument:
      return "invalid argument";
    case ncclInvalidUsage:
      return "invalid usage";
    case ncclInProgress:
      return "NCCL operation in progress";
    case ncclRemoteError:
      return "remote process exited or there was a network error";
    default:
      return "unknown result code";
  }
}

const char* GetLastError(ncclComm_t comm) { return comm ? comm->last_error.c_str() : ""; }

}  // namespace
}  // namespace failsafe::cuda::emu

namespace failsafe::cuda {

const NcclApi* EmulatedNccl() {
  static const NcclApi api = {
      emu::GetVersion,   emu::GetUniqueId, emu::CommInitRankConfig, emu::CommGetAsyncError,
      emu::CommAbort,    emu::AllReduce,   emu::AllGather,          emu::GetErrorString,
      emu::GetLastError, emu::CommRevoke,  emu::CommShrink,
  };
  return &api;
}

}  // namespace failsafe::cuda
