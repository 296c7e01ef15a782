#include "engine/kv_tables.h"

namespace failsafe {

void AddKvTables(const KvBlockManager& kv, const Plan& plan, const Sequence& seq, int first_block,
                 StepBatch* batch) {
  if (first_block >= seq.kv_blocks) return;
  if (batch->kv.size() < static_cast<size_t>(plan.num_devices)) batch->kv.resize(plan.num_devices);
  for (int d : plan.active) {
    const size_t per_block = kv.Slots(d, seq.dp_rank).size();
    if (per_block == 0) continue;
    const std::vector<int32_t>& table = kv.Table(seq.id, d);
    if (table.empty()) continue;  // a counting block manager keeps no tables
    KvTableUpdate& u = batch->kv[d];
    KvBlockRun run;
    run.seq_id = seq.id;
    run.dp_rank = seq.dp_rank;
    run.first_block = first_block;
    run.num_blocks = seq.kv_blocks - first_block;
    run.page_offset = static_cast<int32_t>(u.pages.size());
    run.shared_blocks = kv.SharedBlocks(seq.id);
    u.runs.push_back(run);
    u.pages.insert(u.pages.end(), table.begin() + first_block * per_block, table.end());
  }
}

void AddRestores(const KvBlockManager& kv, const Plan& plan, const Sequence& seq,
                 const SeqRestore& common, bool restore_all, DeviceRestores* out) {
  if (out->size() < static_cast<size_t>(plan.num_devices)) out->resize(plan.num_devices);
  for (int d : plan.active) {
    SeqRestore sr = common;
    sr.seq_id = seq.id;
    sr.dp_rank = seq.dp_rank;
    sr.num_blocks = seq.kv_blocks;
    sr.pages = kv.Table(seq.id, d);
    const std::vector<int> slots =
        restore_all ? kv.Slots(d, seq.dp_rank) : kv.GainedSlots(seq.id, d);
    sr.restore_slots.assign(slots.begin(), slots.end());
    (*out)[d].push_back(std::move(sr));
  }
}

DirectKvTables::DirectKvTables(const Plan& plan, int block_size,
                               std::vector<int64_t> capacity_pages)
    : plan_(plan), kv_(plan, block_size, std::move(capacity_pages)) {}

Status DirectKvTables::Fill(StepBatch* batch) {
  std::vector<int64_t> pending(plan_.num_devices, 0), none(plan_.num_devices, 0);
  for (const StepSeq& s : batch->seqs) {
    auto it = seqs_.find(s.seq_id);
    const int blocks = it == seqs_.end() ? 0 : it->second.kv_blocks;
    if (it != seqs_.end() && it->second.dp_rank != s.dp_rank && blocks > 0)
      return InvalidArgument("sequence {} moved from DP rank {} to {}", s.seq_id,
                             it->second.dp_rank, s.dp_rank);
    // Without DP heads the DP rank stores nothing of its own.
    if (!plan_.IsActive(s.dp_rank) && plan_.num_dp_heads_total() > 0)
      return InvalidArgument("sequence {}: DP rank {} is not active", s.seq_id, s.dp_rank);
    const int end = s.start_pos + s.num_tokens;
    if (!kv_.Fits(s.dp_rank, blocks, end, pending, none))
      return ResourceExhausted("sequence {}: {} tokens do not fit in the devices' KV memory",
                               s.seq_id, end);
    kv_.AddPending(s.dp_rank, blocks, end, &pending);
  }
  for (const StepSeq& s : batch->seqs) {
    Sequence& seq = seqs_[s.seq_id];
    seq.id = s.seq_id;
    seq.dp_rank = s.dp_rank;
    kv_.Grow(seq, s.start_pos + s.num_tokens);
    AddKvTables(kv_, plan_, seq, kv_.TakeUnsent(seq.id), batch);
  }
  return Status::Ok();
}

void DirectKvTables::Free(int64_t seq_id) {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) return;
  kv_.Release(it->second);
  seqs_.erase(it);
}

}  // namespace failsafe
