// Collectives through one shared-memory region, for devices on one host.
//
// Members write their contribution into their own slot and meet at a barrier;
// waiting blocks on a futex (never spins: many device processes may share few
// cores). Small all-reduces then sum every slot in rank order; large ones
// reduce-scatter (each member sums a piece) and all-gather, reading 2x rather
// than n x the payload. Slots are double-buffered, so one barrier per chunk
// suffices for the direct path.
//
// Abort: any process mapping the region (a member or the coordinator) sets
// the abort flag and wakes every waiter; pending and later collectives fail
// with kAborted. A member whose wait exceeds the timeout aborts the group and
// fails with kDeadlineExceeded.
#pragma once

#include <atomic>
#include <cstdint>

#include "comm/communicator.h"
#include "comm/shm_region.h"

namespace failsafe {

class ShmCommunicator final : public Communicator {
 public:
  // All-reduces whose total traffic (payload x members) exceeds this use
  // reduce-scatter + all-gather.
  static constexpr size_t kScatterThresholdBytes = 1 << 20;

  // Creates a region for `members` with slots of `slot_bytes`.
  static Result<ShmRegion> CreateRegion(int members, size_t slot_bytes);
  // Aborts the group whose region this is (callable from any process).
  static void AbortRegion(const ShmRegion& region);
  static bool IsAborted(const ShmRegion& region);

  // `region` must come from CreateRegion (or be its fd mapped in this process).
  ShmCommunicator(ShmRegion region, int rank, int64_t timeout_ms);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Status AllReduceSum(float* data, size_t count) override;
  Status AllReduceSum(int64_t* data, size_t count) override;
  Status AllGather(const void* send, size_t bytes, void* recv) override;
  Status Barrier() override;
  Status Await(const std::function<Result<bool>()>& done) override;
  void Abort() override { AbortRegion(region_); }

 private:
  struct Header;
  Header* header() const { return static_cast<Header*>(region_.data()); }
  char* Slot(int buffer, int member) const;
  float* ResultArea() const;
  template <typename T>
  Status Reduce(T* data, size_t count);
  template <typename T>
  Status ReduceDirect(T* data, size_t count);
  template <typename T>
  Status ReduceScatterGather(T* data, size_t count);

  ShmRegion region_;
  const int rank_;
  int size_ = 0;
  size_t slot_bytes_ = 0;
  const int64_t timeout_ms_;
  uint64_t ops_ = 0;  // chunks done: selects the slot buffer
};

}  // namespace failsafe
