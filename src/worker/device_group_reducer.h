// All-reduces by the devices' own library of collectives (NCCL between
// GPUs: Backend::DeviceGroup) among device processes on distinct devices of
// one host, in device memory, rather than reading peers' memory
// (worker/peer_reducer.h) or staging through the host.
//
// The library knows nothing of FailSafe's failures: a dead or hung member
// leaves the others' operations unfinished on their GPUs. So no member ever
// waits for one inside the library: each operation is started, then waited
// for as a collective of the group's communicator (Communicator::Await), so
// under its deadline, its abort (the coordinator's, when it finds a member
// dead or hung) and its progress records, exactly as a collective of the
// communicator's own. A wait that fails aborts the library's group
// (ncclCommAbort ends the operations under way); the next group, on the
// survivors or with a member that rejoined, makes a new one.
//
// The sums are the communicator's, bit for bit: fixed-point partial sums
// as integers (wrapping, exact in any order) by the library's all-reduce;
// floats gathered by the library and added in rank order by the backend
// (Backend::SumArrays), since the library's own float sums follow its own
// order.
//
// A group takes the library only where every member can (the same host
// boot and network namespace, every device distinct, the library loaded);
// else, the same on every member, Ready says false and the caller goes on
// to peer memory or the host. A member whose join fails (the library's own
// error, not a peer's failure) fails that step and never offers the
// library again, so the next group does without it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "backend/backend.h"
#include "comm/communicator.h"
#include "common/status.h"

namespace failsafe {

class DeviceGroupReducer {
 public:
  // Floats gathered at once for a float all-reduce: every member's part of
  // a chunk (device memory, allocated at the first; with the growth of a
  // DeviceArray at most 1.5 times this, within the PeerReducer::kMemoryBytes
  // that a device budget sets aside, which a group through the library
  // never allocates).
  static constexpr size_t kGatherBytes = 32u << 20;

  explicit DeviceGroupReducer(Backend* backend) : backend_(backend) {
    gathered_.set_memory(backend);
    warm_sum_.set_memory(backend);
  }
  ~DeviceGroupReducer();
  DeviceGroupReducer(const DeviceGroupReducer&) = delete;
  DeviceGroupReducer& operator=(const DeviceGroupReducer&) = delete;

  // Whether `comm`'s all-reduces go through the library: set up at the
  // first call for each communicator, a collective (every member calls it
  // at the same point: as the members join the communicator, under its
  // own timeout rather than a step's, since the library's join may take
  // seconds). False, the same on every member, where any member cannot
  // take part. An error where the group failed meanwhile.
  Result<bool> Ready(Communicator& comm);
  // data[i] = the sum over the group's members of their data[i], i < count,
  // in device memory. Only after Ready(comm) said true.
  Status AllReduceSum(Communicator& comm, int64_t* data, size_t count);
  Status AllReduceSum(Communicator& comm, float* data, size_t count);

  bool ready() const { return ready_; }
  const std::string& why_not() const { return why_not_; }

 private:
  Status SetUp(Communicator& comm, bool* ready);
  // Waits for the group's operation (or join) under `comm`; a failure
  // aborts the group.
  Status Wait(Communicator& comm);

  Backend* const backend_;
  std::unique_ptr<Backend::DeviceGroup> group_;
  uint64_t serial_ = 0;  // the communicator set up for (0: none)
  bool ready_ = false;   // for that communicator
  bool broken_ = false;  // the library failed here: offered no more
  DeviceArray<float> gathered_;
  DeviceArray<int64_t> warm_sum_;  // the setup's first all-reduce
  std::string why_not_;
};

}  // namespace failsafe
