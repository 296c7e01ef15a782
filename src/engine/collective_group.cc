#include "engine/collective_group.h"

#include "comm/shm_communicator.h"

namespace failsafe {

Result<CollectiveGroup> CollectiveGroup::Create(const CollectiveGroupOptions& options, int epoch,
                                                int members) {
  CollectiveGroup g;
  g.options_ = options;
  g.epoch_ = epoch;
  g.members_ = members;
  if (options.kind == CommKind::kShm) {
    FS_ASSIGN_OR_RETURN(g.shm_, ShmCommunicator::CreateRegion(members, options.slot_bytes));
  } else {
    if (!options.store) return FailedPrecondition("a gloo group needs the rendezvous store");
    FS_ASSIGN_OR_RETURN(g.signal_, AbortSignal::Create());
  }
  return g;
}

GroupSpec CollectiveGroup::SpecFor(int rank) const {
  GroupSpec spec;
  spec.kind = options_.kind;
  spec.rank = rank;
  spec.size = members_;
  spec.timeout_ms = options_.timeout_ms;
  if (options_.kind == CommKind::kGloo) {
    spec.store_host = options_.store->host();
    spec.store_port = options_.store->port();
    spec.prefix = "epoch" + std::to_string(epoch_);
    spec.hostname = options_.gloo_hostname;
  }
  return spec;
}

std::vector<int> CollectiveGroup::FdsFor(int) const {
  return {options_.kind == CommKind::kShm ? shm_.fd() : signal_.fd()};
}

void CollectiveGroup::Abort() const {
  if (shm_.valid()) ShmCommunicator::AbortRegion(shm_);
  if (signal_.valid()) signal_.Raise();
}

}  // namespace failsafe
