// All-reduces by the devices' own library of collectives (NCCL between
// GPUs: Backend::DeviceGroup) among device processes on distinct devices of
// one host, in device memory, rather than reading peers' memory
// (worker/peer_reducer.h) or staging through the host.
//
// The library knows nothing of FailSafe's failures: a dead or hung member
// leaves the others' operations unfinished on their GPUs. So no member ever
// waits for one inside the library: operations are started on the device's
// stream, where the work issued after them waits for them, and the host
// goes on issuing the step's kernels; before it waits for the stream
// itself (Settle: at the end of a step, before a copy to the host, or any
// wait of the backend's own, Backend::SetBeforeWait), it waits for the
// operations started as a collective of the group's communicator
// (Communicator::Await), so under its deadline, its abort (the
// coordinator's, when it finds a member dead or hung) and its progress
// records, exactly as a collective of the communicator's own: once a step,
// not once an operation. A wait that fails aborts the library's group
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
//
// Where the library can (Backend::DeviceGroup::Revoke and Shrink: NCCL
// 2.28), a group done with (its communicator replaced, or its operation
// ended by the deadline or an abort, the library having reported no error)
// is revoked rather than aborted, and kept: when the next group's members
// all hold it, in its order, and lose one of its members or more, the next
// group is shrunk from it (the members it loses excluded) rather than made
// from a new id, which member 0 makes and every member bootstraps from.
// Any member that cannot (a device rejoined, a library without the calls,
// a parent that did not settle within kSettleMs or kept an error, a shrink
// that did not start) sends every member the new id's way, decided alike
// from what each says at the setup.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

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
  // in device memory, for the kernels issued next (on the device's stream,
  // after the sum): started, not waited for. Only after Ready(comm) said
  // true.
  Status AllReduceSum(Communicator& comm, int64_t* data, size_t count);
  Status AllReduceSum(Communicator& comm, float* data, size_t count);
  // Waits for the operations started (under comm's deadline and abort);
  // the first failure since the group was set up, if any, again.
  Status Settle(Communicator& comm);
  bool unsettled() const { return group_ && waited_ < group_->started(); }

  bool ready() const { return ready_; }
  const std::string& why_not() const { return why_not_; }

 private:
  // Who this member is in a group: the group's identity (a hash of the id
  // it was made from, or of its parent's and the ranks a shrink excluded:
  // alike on every member; 0: none), its rank and size.
  struct Membership {
    uint64_t id = 0;
    int rank = -1, size = 0;
  };
  // How long a member waits for the group it holds to settle (its
  // operations ended by a revoke) before it shrinks it: a revoke stops the
  // library's kernels at once, so a parent that takes longer is not used.
  static constexpr int64_t kSettleMs = 200;
  // How long an operation's enqueue is polled before it is waited for as a
  // collective (WaitEnqueued).
  static constexpr int64_t kEnqueueSpinNs = 20'000'000;
  Status SetUp(Communicator& comm, bool* ready);
  // Shrinks parent_.group to comm's members (parent_ ranks but `excluded`); false
  // in *shrunk, alike on every member, where any could not.
  Status Shrink(Communicator& comm, const std::vector<int>& excluded, bool* shrunk);
  // One operation of each kind on the group just joined, so that whatever
  // the library sets up at its first is done here, not inside a step.
  Status WarmUp(Communicator& comm);
  // Waits for the group's operations (or join) under `comm`; a failure
  // retires the group.
  Status Wait(Communicator& comm);
  // Waits until the operation started last is on the device's stream.
  Status WaitEnqueued(Communicator& comm);
  // What an operation on a failed group returns: its failure.
  Status Gone() const;
  // Waits under `comm` until done() says so; a failure retires the group.
  Status Await(Communicator& comm, const std::function<Result<bool>()>& done);
  // `st`, an operation's start; a failure retires the group.
  Status Started(Status st);
  // After a failed wait or start: the group retired, and the library
  // offered no more where it failed itself.
  void Failed(const Status& st, bool library_failed);
  // Lets go of group_ (if any): kept as parent_ (revoked) where the
  // library can, else aborted; any older parent aborted.
  void Retire();

  Backend* const backend_;
  std::unique_ptr<Backend::DeviceGroup> group_;
  Membership member_;  // in group_
  // A group done with, revoked and kept for a shrink, and who this member
  // was in it.
  struct Held {
    std::unique_ptr<Backend::DeviceGroup> group;
    Membership member;
  };
  Held parent_;
  uint64_t serial_ = 0;  // the communicator set up for (0: none)
  bool ready_ = false;   // for that communicator
  bool broken_ = false;  // the library failed here: offered no more
  uint64_t waited_ = 0;  // group_'s operations waited for (by number)
  Status failed_;        // the group's failure, for its communicator
  DeviceArray<float> gathered_;
  DeviceArray<int64_t> warm_sum_;  // the setup's first all-reduce
  std::string why_not_;
};

}  // namespace failsafe
