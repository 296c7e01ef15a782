// The coordinator's side of the host KV backup: the shared region (which
// outlives every device), its block and slot allocators, and per sequence the
// backup blocks of its KV.
//
// Content addressing: a full block whose prefix hash is known (the block
// manager's chained hash, core/kv_blocks.h) and that every device writing the
// sequence's slots has copied (its progress covers the block) is *complete*:
// it is indexed under its hash and not written again (save the same KV by a
// catch-up copy: Rebase). Complete blocks are
// shared: a sequence that starts from a device-tier prefix hit names the
// complete blocks of its hit in its own block list (one backup copy, however
// many sequences use it) and starts with its progress at the end of the
// longest complete run of them; the first step after that copies onward from
// there (StepSeq::backup_from), the positions its devices hold already
// included. Every other block (the partial last block, a block whose hash is
// not known yet or is indexed already for another copy) is private to its
// sequence.
//
// Reference counts: a block is free, private (one sequence), or indexed with
// the number of sequences naming it. An indexed block nobody names stays
// cached and is evicted, least recently used first, when a sequence needs a
// block and none is free; a block a sequence names is never evicted, so what a
// running sequence needs for its recovery stays. Once a sequence finds no
// block (the budget is spent and nothing is evictable) the rest of it is not
// backed up, and after a failure its KV past its last backed-up block is
// recomputed.
//
// "Complete" against the devices' progress: progress[slot][device] counts the
// positions [0, tokens) of every slot `device` writes for the sequence. The
// devices writing a sequence's slots under the current plan (SetPlan, then
// the sequence's DP rank: Plan::KvWriter over every (layer, head group)) are
// its writers; its blocks below the least progress of its writers are
// complete.
//
// The host tier of the prefix cache (PrefixHostTier): the scheduler looks up
// how far a new request's chained hashes are indexed (HeldPrefix); the blocks
// past its device-tier hit it takes from here are named by the sequence
// (Name, before any block of the step is allocated, so none of them is
// evicted) and copied by its devices into their pages before the step
// computes (StepSeq::host_blocks).
//
// Thread-safety: the engine thread only.
#pragma once

#include <cstdint>
#include <limits>
#include <list>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "comm/shm_region.h"
#include "common/status.h"
#include "core/prefix_host_tier.h"
#include "model/config.h"
#include "placement/plan.h"
#include "worker/kv_backup_layout.h"
#include "worker/step.h"

namespace failsafe {

// What the backup's books count (cumulative unless said).
struct BackupStats {
  int64_t shared_blocks = 0;   // blocks a sequence named from the index instead of copying
  int64_t indexed_blocks = 0;  // blocks that became complete and indexed
  int64_t evicted_blocks = 0;  // indexed blocks nobody named, freed for another sequence
};

class HostKvBackup : public PrefixHostTier {
 public:
  static Result<std::unique_ptr<HostKvBackup>> Create(const ModelConfig& config, int block_size,
                                                      int64_t budget_bytes, int max_seqs,
                                                      int num_devices,
                                                      DType kv_dtype = DType::kF32);

  const ShmRegion& region() const { return region_; }
  const BackupLayout& layout() const { return layout_; }
  int64_t capacity_blocks() const { return layout_.header().num_blocks; }
  // Blocks named by at least one sequence.
  int64_t blocks_in_use() const {
    return capacity_blocks() - static_cast<int64_t>(free_blocks_.size()) -
           static_cast<int64_t>(lru_.size());
  }
  int64_t block_bytes() const { return layout_.block_bytes(); }
  const BackupStats& stats() const { return stats_; }
  // Indexed (complete) blocks, named or not.
  int64_t indexed_blocks() const { return static_cast<int64_t>(index_.size()); }
  // Blocks a sequence may still get: the free ones and the evictable ones.
  int64_t available_blocks() const {
    return static_cast<int64_t>(free_blocks_.size() + lru_.size());
  }

  // The plan the devices write under: which devices write a sequence's slots
  // for each DP rank. Sequences that get their slot from now on (and those
  // Rebase moves) use it.
  void SetPlan(const Plan& plan);

  // Leading blocks that are indexed (complete) under `hashes` with the same
  // tokens (`tokens`, from position 0) after the same parent: the host
  // tier's prefix.
  int HeldPrefix(std::span<const uint64_t> hashes, std::span<const int32_t> tokens) const override;
  // At a sequence's first step (later calls do nothing): it names the
  // indexed blocks of `shared` (hashes of its leading blocks found in either
  // tier of the prefix cache; `tokens` the sequence's, from position 0)
  // below position `start`, up to the first one not indexed with those
  // tokens, whether or not it gets a progress slot. Allocates nothing,
  // so calling it for every sequence of a step before Prepare keeps every
  // block a lookup found. Returns the blocks the sequence names from the
  // start of its KV.
  int Name(int64_t seq_id, std::span<const uint64_t> shared, std::span<const int32_t> tokens,
           int start);
  // Gives the sequence (DP rank step->dp_rank) a progress slot and backup
  // blocks for its KV up to `end_tokens`, and fills the step's backup fields
  // for it. Its slot starts at the blocks it named (Name, called before for
  // a sequence with prefix hits): they are not copied again.
  void Prepare(int64_t seq_id, int start, int end_tokens, StepSeq* step,
               std::vector<int32_t>* step_blocks);
  // Learns the hashes of the sequence's full blocks (`hashes`: chained, from
  // block 0; may be shorter than what it learnt before) and their tokens
  // (`tokens`, from position 0, at least the blocks' worth), and indexes its
  // blocks that have become complete.
  void Settle(int64_t seq_id, std::span<const uint64_t> hashes, std::span<const int32_t> tokens);
  // How many positions of the sequence `device` has backed up (0 if unknown).
  int Progress(int64_t seq_id, int device) const;
  // Backed-up positions usable for a restore: limited by `device`'s progress
  // and by the first block without a backup block.
  int Restorable(int64_t seq_id, int device) const;
  // A plan change rolled the sequence back to `tokens` positions: its
  // indexed blocks past them (which it will write again) are replaced by
  // private ones. Returns the positions its blocks still hold (`tokens`, or
  // the start of the first block it could not keep).
  int RolledBack(int64_t seq_id, int tokens);
  // After a plan change: `device` now has `tokens` positions of the sequence
  // in the backup for every slot it writes, and backs up onward from there.
  // `tokens` must not claim more than the backup holds (the recovery takes
  // the least of the rollback point and what each slot's old writer copied).
  void SetProgress(int64_t seq_id, int device, int tokens);
  // After SetProgress for every device (the devices idle): the sequence (DP
  // rank `dp_rank`) takes its writers from the plan of SetPlan, a writer
  // whose progress stops at an indexed block passes it (the block holds
  // every slot), and its next step copies from the least progress among
  // them (its devices hold every position up to the rollback point), so a
  // writer that lags catches up. A writer that lags behind a private block
  // with indexed blocks after it copies those again: the same KV (its pages
  // hold what the indexed block holds).
  void Rebase(int64_t seq_id, int dp_rank);
  // What a step's backup copy does to each of `devices` (a modelled device:
  // sim/sim_executor.h), with one lookup of the sequence: positions
  // [start, end) are copied, so a device's progress becomes `end` if it
  // reached `start` (as the devices' backup writers publish it); a copy that
  // starts past the progress leaves a gap and claims nothing.
  void CopiedByStep(int64_t seq_id, const std::vector<int>& devices, int start, int end);
  const std::vector<int32_t>& Blocks(int64_t seq_id) const;
  // Returns the sequence's slot and blocks (its devices have freed it, and
  // drained their copies first): its complete blocks stay indexed.
  void Release(int64_t seq_id);

  // Checks the books: every block free, private to one sequence, or indexed
  // with as many references as sequences name it; the unreferenced indexed
  // ones in the LRU list; no sequence names a block twice or one past its
  // first missing block; free + named + cached = the capacity.
  Status CheckInvariants() const;

 private:
  struct Block {
    int refs = 0;                      // sequences naming it
    bool indexed = false;              // complete, in index_ under `hash`
    uint64_t hash = 0;                 // when indexed
    uint64_t parent = 0;               // when indexed: the hash of the block before (0: none)
    std::vector<int32_t> tokens;       // when indexed: the block's tokens
    std::list<int32_t>::iterator lru;  // in lru_ while indexed && refs == 0
  };
  struct SeqBackup {
    int slot = -1;
    bool named = false;                               // Name has run
    std::vector<int32_t> blocks;                      // logical block -> backup block (-1: none)
    bool exhausted = false;                           // a block found the budget spent
    std::vector<int> writers;                         // devices writing its slots, ascending
    std::vector<uint64_t> hashes;                     // chained hashes of its leading full blocks
    std::vector<int32_t> tokens;                      // their tokens
    int settled = 0;                                  // blocks [0, settled) checked for the index
    int copy_from = std::numeric_limits<int>::max();  // the next step copies from here
  };
  HostKvBackup() = default;
  // What `device` published for the sequence in its progress slot.
  int SlotProgress(int64_t seq_id, int slot, int device) const;
  // Least progress of the sequence's writers (0 without a slot or writers).
  int Copied(int64_t seq_id, const SeqBackup& sb) const;
  void IndexComplete(int64_t seq_id, SeqBackup& sb);
  // The indexed block holding logical block `b` of a sequence whose chained
  // hashes and tokens are these: same hash, parent and tokens (-1: none).
  int32_t Find(std::span<const uint64_t> hashes, std::span<const int32_t> tokens, int b) const;
  // A block for a sequence (-1 if none is free or evictable).
  int32_t Allocate();
  void Unref(int32_t block);

  ShmRegion region_;
  BackupLayout layout_;
  int block_size_ = 16;
  std::vector<std::vector<int>> writers_;  // [DP rank] -> devices writing its slots
  std::vector<Block> block_;               // [backup block]
  std::vector<int32_t> free_blocks_;
  std::list<int32_t> lru_;  // indexed blocks nobody names, least recently used first
  std::unordered_map<uint64_t, int32_t> index_;  // hash -> indexed block
  std::vector<int32_t> free_slots_;
  std::unordered_map<int64_t, SeqBackup> seqs_;
  BackupStats stats_;
};

}  // namespace failsafe
