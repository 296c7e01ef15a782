// Carrying the block manager's tables (core/kv_blocks.h) to the devices: the
// new entries of a step, and the whole tables of a plan change.
//
// Thread-safety: plain functions over the caller's objects.
#pragma once

#include <cstdint>
#include <unordered_map>

#include "core/kv_blocks.h"
#include "worker/device_model.h"
#include "worker/step.h"

namespace failsafe {

// Adds blocks [first_block, the sequence's last) of its tables on every
// active device of `plan` to batch->kv.
void AddKvTables(const KvBlockManager& kv, const Plan& plan, const Sequence& seq, int first_block,
                 StepBatch* batch);

// What every active device of `plan` (the block manager's plan, just
// reconfigured) holds of `seq`: `common` (restore_tokens, backup blocks) with
// the device's whole table, and as slots to restore the ones it gained, or
// every slot if `restore_all` (the devices' state is uncertain).
void AddRestores(const KvBlockManager& kv, const Plan& plan, const Sequence& seq,
                 const SeqRestore& common, bool restore_all, DeviceRestores* out);

// Block tables for steps built without a scheduler (single-sequence
// generation, benchmarks, tests): the same block manager gives each sequence
// of a batch pages for the positions it writes, and the batch carries them.
//
// Thread-safety: none.
class DirectKvTables {
 public:
  // capacity_pages: [device id] -> pages (Executor::kv_capacity_pages).
  DirectKvTables(const Plan& plan, int block_size, std::vector<int64_t> capacity_pages);
  // Grows every sequence of the batch to the end of its chunk (on the DP
  // rank the batch gives it) and adds the new table entries to batch->kv.
  // Fails, changing nothing, if the devices lack room or a sequence changes
  // its DP rank.
  Status Fill(StepBatch* batch);
  // The sequence is gone from the devices: its pages are free.
  void Free(int64_t seq_id);
  const KvBlockManager& kv() const { return kv_; }

 private:
  Plan plan_;
  PagedKvBlockManager kv_;
  std::unordered_map<int64_t, Sequence> seqs_;
};

}  // namespace failsafe
