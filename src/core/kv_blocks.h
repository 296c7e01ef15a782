// The KV block manager: the one owner of every device's KV pages.
//
// A page holds block_size positions of one (layer, KV head) slot of one
// sequence. On device d a sequence caches the slots plan.KvSlots(d, dp_rank)
// (its TP head groups on every device holding them, its DP head groups on its
// DP rank only), so one block of a sequence takes KvSlots(d, rank).size()
// pages on d: a device holding more head groups (nonuniform) fills sooner;
// cyclic placement evens it out.
//
// The manager hands out page ids per device and keeps each sequence's block
// table per device: [block][position of the slot in KvSlots] -> page id. The
// devices are page stores: the engine sends them the tables (each step the
// blocks it added) and they write where they are told.
//
// Check, then commit: CanGrow/Fits/FitsAlone have no side effects; Grow cannot
// fail (the caller checked); Release frees every page of a sequence.
// Page ids on a device are reused most recently freed first and never exceed
// the largest number of pages the device ever held at once, so they stay
// below its capacity (and its pool's size).
//
// Thread-safety: none; the scheduler's thread only.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "core/sequence.h"
#include "placement/plan.h"

namespace failsafe {

class KvBlockManager {
 public:
  KvBlockManager() = default;
  // capacity_pages: [device id] -> pages the device may hold (0 without a pool).
  // With page_ids false the manager only counts pages (the same admission,
  // growth and re-plan arithmetic) and keeps no tables: for the simulator,
  // which has no devices to tell where to write, and whose models hold tens
  // of pages per block and device.
  KvBlockManager(const Plan& plan, int block_size, std::vector<int64_t> capacity_pages,
                 bool page_ids = true);

  int block_size() const { return block_size_; }
  int BlocksFor(int tokens) const { return (tokens + block_size_ - 1) / block_size_; }
  // Pages one block of a sequence with DP rank `dp_rank` takes on a device.
  int64_t PagesPerBlock(int device, int dp_rank) const {
    return static_cast<int64_t>(tp_slots_[device].size()) + (device == dp_rank ? dp_extra_ : 0);
  }
  // The slots a sequence with DP rank `dp_rank` caches on `device`
  // (Plan::KvSlots, cached).
  const std::vector<int>& Slots(int device, int dp_rank) const {
    return device == dp_rank ? rank_slots_[device] : tp_slots_[device];
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
  // Gives the sequence pages for `tokens` tokens on every device (s.dp_rank
  // must be set and the growth checked).
  void Grow(Sequence& s, int tokens);
  // Frees every page of the sequence.
  void Release(Sequence& s);

  int64_t capacity(int device) const { return capacity_[device]; }
  int64_t used(int device) const { return used_[device]; }
  int64_t free(int device) const { return capacity_[device] - used_[device]; }
  const std::vector<int>& devices() const { return devices_; }
  // Devices over capacity (after a plan change).
  bool OverCapacity() const;

  // The sequence's block table on `device`: [block][slot position] -> page
  // id, Slots(device, dp_rank).size() entries per block (empty if it holds
  // none there).
  const std::vector<int32_t>& Table(int64_t seq_id, int device) const;
  // Blocks the devices have not been sent yet (the first one); marks them
  // sent. A step carries the tables from there on.
  int TakeUnsent(int64_t seq_id);
  // The devices may have missed the sequence's last tables (a failed step):
  // send the whole table again.
  void MarkUnsent(int64_t seq_id);

  // Pages per device the sequences would take under `plan` (their current
  // blocks and DP ranks).
  std::vector<int64_t> PagesUnder(const Plan& plan, const std::vector<const Sequence*>& seqs) const;
  // Moves to a new plan and capacities. `live` (with their DP ranks under the
  // new plan) keep their blocks; every other sequence's pages are freed. A
  // slot a device held under the old plan and still holds keeps its pages
  // (its KV stays in place); every other slot gets new pages, and
  // GainedSlots() lists it (its KV must be restored or recomputed). The
  // caller has made the live sequences fit (PagesUnder). Every table counts
  // as sent (the plan change carries them whole).
  void Reconfigure(const Plan& plan, std::vector<int64_t> capacity_pages,
                   const std::vector<const Sequence*>& live);
  // Slots of the sequence that `device` did not hold before the last
  // Reconfigure, ascending.
  std::vector<int> GainedSlots(int64_t seq_id, int device) const;

  // Checks the books: every page of a device owned by at most one table
  // entry and below the device's id high-water mark, owned + free ids = the
  // mark, used = owned pages <= capacity, every table of the right size.
  Status CheckInvariants() const;

 private:
  struct Pool {
    std::vector<int32_t> free_ids;  // freed ids, reused last-in first-out
    int32_t next_id = 0;            // ids [0, next_id) have been handed out
  };
  struct SeqTables {
    int dp_rank = -1;
    int blocks = 0;
    int sent = 0;                              // blocks the devices have been sent
    std::vector<std::vector<int32_t>> pages;   // [device] -> [block][slot position]
    std::vector<std::vector<int32_t>> gained;  // [device] -> slots gained at the last plan change
  };
  int32_t Allocate(int device);
  void FreePage(int device, int32_t id);
  void SetPlan(const Plan& plan, std::vector<int64_t> capacity_pages);

  int block_size_ = 16;
  bool page_ids_ = true;
  int num_devices_ = 0;
  std::vector<int> devices_;                  // active devices
  std::vector<std::vector<int>> tp_slots_;    // [device] -> KvSlots(device, another rank)
  std::vector<std::vector<int>> rank_slots_;  // [device] -> KvSlots(device, device)
  int64_t dp_extra_ = 0;                      // DP slots (over all layers)
  std::vector<int64_t> capacity_, used_;
  std::vector<Pool> pools_;  // [device]
  std::unordered_map<int64_t, SeqTables> seqs_;
};

}  // namespace failsafe
