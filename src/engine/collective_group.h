// Group formation: the collective group of a plan's active devices, a new one
// for every plan (an epoch).
//
// Shared memory (one host): a region per group, whose abort flag the
// coordinator or any member raises. gloo (TCP): a rendezvous prefix per epoch
// in the coordinator's key-value store, and an AbortSignal that every
// member's watcher thread waits on. A group is never reused, so a device
// fenced out of one epoch cannot disturb the next: its region and prefix are
// simply never used again.
//
// Thread-safety: Abort may be called from any thread; the rest from the
// thread that drives the WorkerGroup.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/abort_signal.h"
#include "comm/kv_store.h"
#include "comm/shm_region.h"
#include "worker/protocol.h"

namespace failsafe {

struct CollectiveGroupOptions {
  CommKind kind = CommKind::kShm;
  int64_t timeout_ms = 30000;   // how long a member waits in one collective on its own
  size_t slot_bytes = 1 << 20;  // shared memory: bytes per member slot
  std::string gloo_hostname = "127.0.0.1";
  const KvStoreServer* store = nullptr;  // gloo: the rendezvous store
};

class CollectiveGroup {
 public:
  static Result<CollectiveGroup> Create(const CollectiveGroupOptions& options, int epoch,
                                        int members);
  CollectiveGroup() = default;

  bool valid() const { return shm_.valid() || signal_.valid(); }
  int epoch() const { return epoch_; }
  // What member `rank` needs to join: its spec and the descriptors to send.
  GroupSpec SpecFor(int rank) const;
  std::vector<int> FdsFor(int rank) const;
  // Every pending and later collective of the group fails at once.
  void Abort() const;

 private:
  CollectiveGroupOptions options_;
  int epoch_ = 0;
  int members_ = 0;
  ShmRegion shm_;       // shared memory groups
  AbortSignal signal_;  // gloo groups
};

}  // namespace failsafe
