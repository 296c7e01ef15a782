// Paged KV accounting for every device, in pages (block_size tokens of one
// (layer, KV head) slot). Pure bookkeeping: the devices allocate the same
// pages themselves; this decides whether they can.
//
// On device d a sequence of B blocks uses B * tp_slots[d] pages for its TP
// heads, plus B * dp_slots pages if d is its DP rank. So a device holding more
// head groups (nonuniform) fills sooner; cyclic placement evens it out.
//
// Check, then commit: CanGrow has no side effects; Grow cannot fail.
#pragma once

#include <cstdint>
#include <vector>

#include "core/sequence.h"
#include "placement/plan.h"

namespace failsafe {

class KvAccounting {
 public:
  KvAccounting() = default;
  // capacity_pages: [device id] -> pool size (0 for devices without a pool).
  KvAccounting(const Plan& plan, int block_size, std::vector<int64_t> capacity_pages);

  int block_size() const { return block_size_; }
  int BlocksFor(int tokens) const { return (tokens + block_size_ - 1) / block_size_; }
  // Pages one block of a sequence takes on a device.
  int64_t PagesPerBlock(int device, int dp_rank) const {
    return tp_slots_[device] + (device == dp_rank ? dp_slots_ : 0);
  }
  bool CanGrow(const Sequence& s, int tokens, int64_t keep_free_pages = 0) const;
  // Would a sequence on `dp_rank` holding `blocks` blocks fit `tokens` tokens,
  // given `pending` pages already promised per device in this step and
  // `keep_free` pages per device left over?
  bool Fits(int dp_rank, int blocks, int tokens, const std::vector<int64_t>& pending,
            const std::vector<int64_t>& keep_free) const;
  void AddPending(int dp_rank, int blocks, int tokens, std::vector<int64_t>* pending) const;
  // Would `tokens` tokens fit on empty devices (the sequence alone)?
  bool FitsAlone(int dp_rank, int tokens) const;
  void Grow(Sequence& s, int tokens);
  void Release(Sequence& s);

  int64_t capacity(int device) const { return capacity_[device]; }
  int64_t used(int device) const { return used_[device]; }
  int64_t free(int device) const { return capacity_[device] - used_[device]; }
  const std::vector<int>& devices() const { return devices_; }
  // Devices over capacity (after a plan change).
  bool OverCapacity() const;
  // Re-accounts every sequence under a new plan and capacities.
  void Reconfigure(const Plan& plan, std::vector<int64_t> capacity_pages,
                   const std::vector<const Sequence*>& live);

 private:
  int block_size_ = 16;
  std::vector<int> devices_;       // active devices
  std::vector<int64_t> tp_slots_;  // [device] -> TP (layer, head) slots
  int64_t dp_slots_ = 0;           // DP (layer, head) slots
  std::vector<int64_t> capacity_, used_;
};

}  // namespace failsafe
