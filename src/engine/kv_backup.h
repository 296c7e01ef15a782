// The coordinator's side of the host KV backup: the shared region (which
// outlives every device), its block and slot allocators, and per request the
// backup blocks of its KV.
//
// Budget policy: a request gets a backup block for each block of its KV while
// the budget lasts; once one of its blocks finds the budget spent, the rest of
// that request is not backed up, and after a failure its KV past the last
// backed-up block is recomputed. Blocks return when the request finishes or
// is preempted (after the devices have freed it).
//
// Thread-safety: the engine thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "comm/shm_region.h"
#include "common/status.h"
#include "model/config.h"
#include "worker/kv_backup_layout.h"
#include "worker/step.h"

namespace failsafe {

class HostKvBackup {
 public:
  static Result<std::unique_ptr<HostKvBackup>> Create(const ModelConfig& config, int block_size,
                                                      int64_t budget_bytes, int max_seqs,
                                                      int num_devices);

  const ShmRegion& region() const { return region_; }
  const BackupLayout& layout() const { return layout_; }
  int64_t capacity_blocks() const { return layout_.header().num_blocks; }
  int64_t blocks_in_use() const {
    return capacity_blocks() - static_cast<int64_t>(free_blocks_.size());
  }
  int64_t block_bytes() const { return layout_.block_floats() * 4; }

  // Gives the sequence a progress slot and backup blocks for its KV up to
  // `end_tokens`, and fills the step's backup fields for it.
  void Prepare(int64_t seq_id, int start, int end_tokens, StepSeq* step,
               std::vector<int32_t>* step_blocks);
  // How many positions of the sequence `device` has backed up (0 if unknown).
  int Progress(int64_t seq_id, int device) const;
  // Backed-up positions usable for a restore: limited by `device`'s progress
  // and by the first block without a backup block.
  int Restorable(int64_t seq_id, int device) const;
  // After a plan change: `device` now has `tokens` positions of the sequence
  // in the backup for every slot it writes, and backs up onward from there.
  // `tokens` must not claim more than the backup holds (the recovery takes
  // the least of the rollback point and what each slot's old writer copied).
  void SetProgress(int64_t seq_id, int device, int tokens);
  // What a step's backup copy does to each of `devices` (a modelled device:
  // sim/sim_executor.h), with one lookup of the sequence: positions
  // [start, end) are copied, so a device's progress becomes `end` if it
  // reached `start` (as the devices' backup writers publish it); a copy that
  // starts past the progress leaves a gap and claims nothing.
  void CopiedByStep(int64_t seq_id, const std::vector<int>& devices, int start, int end);
  const std::vector<int32_t>& Blocks(int64_t seq_id) const;
  // Returns the sequence's slot and blocks (its devices have freed it).
  void Release(int64_t seq_id);

 private:
  struct SeqBackup {
    int slot = -1;
    std::vector<int32_t> blocks;  // logical block -> backup block
    bool exhausted = false;       // a block found the budget spent
  };
  HostKvBackup() = default;

  ShmRegion region_;
  BackupLayout layout_;
  int block_size_ = 16;
  std::vector<int32_t> free_blocks_;
  std::vector<int32_t> free_slots_;
  std::unordered_map<int64_t, SeqBackup> seqs_;
};

}  // namespace failsafe
