// One forward step as every device of the group sees it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace failsafe {

struct StepSeq {
  int64_t seq_id = 0;
  int32_t start_pos = 0;  // tokens of this sequence already in the KV cache
  int32_t num_tokens =
      0;  // tokens computed in this step: positions [start_pos, start_pos + num_tokens)
  int32_t dp_rank = 0;       // device that computes this sequence's DP heads
  int32_t token_offset = 0;  // index of its first token in StepBatch::tokens
  // Rows [logits_row, logits_row + logits_rows) of the logits output hold
  // the logits of its last logits_rows tokens (the last one's are sampled
  // when it ends the sequence; the others are for prompt logprobs);
  // logits_row -1: none.
  int32_t logits_row = -1;
  int32_t logits_rows = 1;
  // Host KV backup: progress slot (-1: not backed up) and the backup blocks of
  // logical blocks [backup_first_block, backup_first_block + backup_count),
  // at StepBatch::backup_blocks[backup_offset...] (-1 entries: no backup).
  // The copy covers positions [backup_from, start_pos + num_tokens): from
  // before start_pos when the devices hold KV the backup does not have yet
  // (a prefix hit, a slot that came late, a writer that lags after a plan
  // change); -1: from start_pos.
  int32_t backup_slot = -1;
  int32_t backup_from = -1;
  int32_t backup_first_block = 0;
  int32_t backup_count = 0;
  int32_t backup_offset = 0;
  // Host-tier prefix hit: before the step computes, every device copies
  // blocks [host_first_block, host_first_block + host_blocks) of every slot
  // it caches for the sequence (Plan::KvSlots) from the host backup blocks
  // at StepBatch::backup_blocks[host_offset...] into their pages. They end
  // at or before start_pos.
  int32_t host_first_block = 0;
  int32_t host_blocks = 0;
  int32_t host_offset = 0;

  // The first position the step's backup copy covers (see backup_from).
  int32_t BackupStart() const {
    return backup_from >= 0 ? std::min(backup_from, start_pos) : start_pos;
  }
};

// Entries a sequence's block table on one device gains: blocks
// [first_block, first_block + num_blocks), their pages at
// KvTableUpdate::pages[page_offset...] as [block][slot position], the slots
// being Plan::KvSlots(device, dp_rank). The sequence's first `shared_blocks`
// blocks are cached pages (prefix caching): other tables may name them too,
// and the sequence only reads them.
struct KvBlockRun {
  int64_t seq_id = 0;
  int32_t dp_rank = 0;
  int32_t first_block = 0;
  int32_t num_blocks = 0;
  int32_t page_offset = 0;
  int32_t shared_blocks = 0;
};

// What one device's block tables gain in a step (the scheduler's block
// manager chose the pages).
struct KvTableUpdate {
  std::vector<KvBlockRun> runs;
  std::vector<int32_t> pages;
};

struct StepBatch {
  std::vector<StepSeq> seqs;
  std::vector<int32_t> tokens;  // [total tokens]
  int32_t num_logits_rows = 0;
  std::vector<int32_t> backup_blocks;
  // [device id] -> its block tables' new entries. On the wire a device gets
  // only its own (at its index; the others empty).
  std::vector<KvTableUpdate> kv;
  // Seconds the scheduler's cost model estimates the step at (the hang
  // deadline scales it); 0: none, the executor estimates it. Stays on the
  // coordinator: not part of the wire encoding.
  double estimated_s = 0;

  int num_tokens() const { return static_cast<int>(tokens.size()); }
};

// Measured on one device during one step.
struct ForwardStats {
  // Compute time of each sync segment (the work between two collectives):
  // embedding, then attention and FFN of every layer, then the LM head.
  std::vector<int64_t> segment_cpu_ns;   // CPU time of the compute thread
  std::vector<int64_t> segment_wall_ns;  // wall time
  int64_t collective_wall_ns = 0;        // time inside collectives
  double attention_flops = 0;            // projections + attention core
  double ffn_flops = 0;
  double other_flops = 0;  // LM head
  int64_t kv_bytes = 0;    // KV pages in use after the step
};

// What a device must know of one sequence when the plan changes.
struct SeqRestore {
  int64_t seq_id = 0;
  int32_t dp_rank = 0;
  // Positions [restore_from, restore_tokens) of every slot in restore_slots
  // come from the host backup; later positions will be recomputed, earlier
  // ones are in cached blocks another sequence's restore writes (restore_from
  // a multiple of the block size).
  int32_t restore_tokens = 0;
  int32_t restore_from = 0;
  // Leading blocks of the table that are cached (shared, read-only): their
  // pages may be named by other tables.
  int32_t shared_blocks = 0;
  std::vector<int32_t> backup_blocks;  // logical block -> backup block
  // The sequence's whole block table on this device under the new plan:
  // num_blocks blocks of Plan::KvSlots(device, dp_rank) pages each.
  int32_t num_blocks = 0;
  std::vector<int32_t> pages;  // [block][slot position] -> page id
  // Slots whose pages are new to the device (restored or recomputed); every
  // other slot keeps the pages, and the KV, it held.
  std::vector<int32_t> restore_slots;
};
// [device id] -> what the device holds after a plan change.
using DeviceRestores = std::vector<std::vector<SeqRestore>>;

// What applying a plan cost on one device.
struct ApplyStats {
  int64_t host_bytes = 0;         // weights read from the host copy (PCIe)
  int64_t peer_bytes = 0;         // weights received from other devices (NVLink)
  int64_t kv_restored_bytes = 0;  // KV copied from the host backup
  int64_t weights_ns = 0;         // CPU time spent on weights
  int64_t kv_ns = 0;              // CPU time spent restoring KV
  int64_t weights_wall_ns = 0;    // wall time of the weights phase
  int64_t kv_wall_ns = 0;         // wall time of the KV phase
};

}  // namespace failsafe
