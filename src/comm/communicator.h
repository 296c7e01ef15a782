// Collectives among the active devices of a plan.
//
// Contract: every member calls the same collectives in the same order with the
// same sizes. A collective returns kAborted if the group was aborted (a peer
// died) and kDeadlineExceeded if it did not complete within the timeout; in
// both cases the group is unusable afterwards and must be rebuilt. A dead peer
// never makes a survivor hang: the failure monitor calls Abort (from any
// process or thread), and every pending and later call fails fast.
//
// Thread-safety: collectives are called from one thread per member; Abort may
// be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "common/status.h"

namespace failsafe {

class Communicator {
 public:
  Communicator();
  virtual ~Communicator() = default;
  // Distinct for every communicator this process makes: state kept for a
  // group (worker/peer_reducer.h) sees when its group was replaced.
  uint64_t serial() const { return serial_; }
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // In place: data[i] = sum over members of data[i]. The sum is taken in rank
  // order on every member, so all members get bit-identical results.
  virtual Status AllReduceSum(float* data, size_t count) = 0;
  // The same over fixed-point partial sums (common/fixed_point.h): integer
  // addition (wrapping), exact and independent of the order and the grouping
  // of the members.
  virtual Status AllReduceSum(int64_t* data, size_t count) = 0;
  // recv[r * bytes, (r + 1) * bytes) = member r's send buffer.
  virtual Status AllGather(const void* send, size_t bytes, void* recv) = 0;
  virtual Status Barrier() = 0;
  // Waits, as one collective of this group, until `done` says true: for
  // work the members do together outside this communicator that completes
  // only if every member takes part (a device library's all-reduce,
  // worker/device_group_reducer.h), which cannot tell a dead or hung peer
  // by itself. `done` is polled, often (it must be cheap), and its error
  // ends the wait. Fails as every collective does: kAborted once the group
  // is aborted, kDeadlineExceeded past the timeout (the group aborted).
  // The wait yields its core between polls, then sleeps (PollUntil): it
  // never spins.
  virtual Status Await(const std::function<Result<bool>()>& done) = 0;
  virtual void Abort() = 0;

 protected:
  // Await's loop: polls `done` until it says true or fails, `aborted` says
  // the group was aborted, or `timeout_ms` passed (then `abort` aborts the
  // group). For the first kPollYieldNs of a wait it polls between yields of
  // its core (to any thread that is ready to run on it): a device's
  // collective is usually done within tens to hundreds of microseconds,
  // and a sleep, however short it asks to be, lasts the kernel's timer
  // slack and wake-up at least (about 100 us measured on a VM), which
  // every collective of a step would add. After that it sleeps a
  // sixteenth of the time waited so far between polls (kPollNapMinNs to
  // kPollNapMaxNs, plus the slack).
  static constexpr int64_t kPollYieldNs = 250'000;
  static constexpr int64_t kPollNapMinNs = 50'000;
  static constexpr int64_t kPollNapMaxNs = 200'000;
  static Status PollUntil(const std::function<Result<bool>()>& done, int64_t timeout_ms,
                          const std::function<bool()>& aborted, const std::function<void()>& abort);

 private:
  const uint64_t serial_;
};

// A group of one: collectives are no-ops.
class LocalCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  Status AllReduceSum(float*, size_t) override { return Status::Ok(); }
  Status AllReduceSum(int64_t*, size_t) override { return Status::Ok(); }
  Status AllGather(const void* send, size_t bytes, void* recv) override;
  Status Barrier() override { return Status::Ok(); }
  Status Await(const std::function<Result<bool>()>& done) override;
  void Abort() override {}
};

}  // namespace failsafe
