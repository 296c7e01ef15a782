// A device across plan changes: the host KV backup it writes, and applying a
// new plan (failure recovery and rejoin).
#include <algorithm>
#include <cstring>
#include <set>

#include "common/check.h"
#include "common/clock.h"
#include "worker/device_model.h"

namespace failsafe {

void DeviceModel::SetBackup(BackupWriter* writer, const BackupLayout& layout, void* base) {
  backup_ = writer;
  backup_layout_ = layout;
  backup_base_ = base;
}

void DeviceModel::DrainBackup() {
  if (backup_) backup_->Drain();
}

// After a step: for every sequence with a backup slot, copy the positions it
// wrote in every slot this device holds into the host backup, in the
// background.
void DeviceModel::EnqueueBackup(const StepBatch& b) {
  if (!backup_) return;
  const int bs = kv_.block_size();
  for (const StepSeq& s : b.seqs) {
    if (s.backup_slot < 0) continue;
    BackupJob job;
    job.seq_id = s.seq_id;
    job.slot = s.backup_slot;
    job.start = s.start_pos;
    job.end = s.start_pos + s.num_tokens;
    // Stop at the first block without a backup block.
    for (int blk = s.start_pos / bs; blk * bs < job.end; ++blk) {
      const int k = blk - s.backup_first_block;
      if (k < 0 || k >= s.backup_count || b.backup_blocks[s.backup_offset + k] < 0) {
        job.end = std::max(job.start, blk * bs);
        break;
      }
    }
    if (job.end <= job.start) continue;
    for (int slot : kv_.HeldSlots(s.seq_id)) {
      const int layer = slot / config_.num_kv_heads, head = slot % config_.num_kv_heads;
      for (int blk = job.start / bs; blk * bs < job.end; ++blk) {
        const int backup_block = b.backup_blocks[s.backup_offset + blk - s.backup_first_block];
        BackupJob::Copy c;
        c.page = kv_.Page(s.seq_id, slot, blk);
        c.dst = backup_layout_.Slot(backup_base_, backup_block, layer, head);
        c.from = std::max(job.start, blk * bs) - blk * bs;
        c.to = std::min(job.end, (blk + 1) * bs) - blk * bs;
        job.copies.push_back(c);
      }
    }
    backup_->Enqueue(std::move(job));
  }
}

namespace {

std::vector<int> Minus(const std::vector<int>& a, const std::vector<int>& b) {
  std::vector<int> out;
  for (int x : a) {
    if (std::find(b.begin(), b.end(), x) == b.end()) out.push_back(x);
  }
  return out;
}

void Move(ItemMatrix* from, ItemMatrix* to, int item) { to->AddShared(from->Remove(item)); }

}  // namespace

// Every head group that is DP in `next` but not in `prev` is needed by every
// active device. Its rows are split into one piece per device; each device
// supplies its piece (from its own copy if it has one, else from the host),
// and an all-gather gives everyone the whole: no byte crosses from the host
// twice.
Status DeviceModel::GatherNewDpHeads(const Plan& prev, const Plan& next, const HostLoader& load,
                                     Communicator& comm, ApplyStats* stats) {
  const int hd = config_.head_dim, g = config_.group_size(), hidden = config_.hidden_size;
  const int rows = (2 * g + 2) * hd;  // q, k, v, o^T
  const int n = comm.size(), rank = comm.rank();
  const int per = (rows + n - 1) / n;
  std::vector<float> piece(static_cast<size_t>(per) * hidden),
      all(static_cast<size_t>(per) * hidden * n);
  for (int l = 0; l < config_.num_layers; ++l) {
    LayerWeights& lw = layers_[l];
    for (int h : Minus(next.layers[l].dp_heads, prev.layers[l].dp_heads)) {
      const int r0 = std::min(rows, rank * per), r1 = std::min(rows, r0 + per);
      const bool held = lw.dp_qkv.Has(h);
      if (held) {  // this device held it (as TP until now): no host read
        for (int r = r0; r < r1; ++r) {
          float* dst = piece.data() + static_cast<int64_t>(r - r0) * hidden;
          if (r < (g + 2) * hd) {
            lw.dp_qkv.ReadRows(h, r, 1, dst);
          } else {
            lw.dp_o.ReadRows(h, r - (g + 2) * hd, 1, dst);
          }
        }
      } else if (r1 > r0) {
        load.HeadRows(l, h, r0, r1, piece.data());
        stats->host_bytes += static_cast<int64_t>(r1 - r0) * hidden *
                             static_cast<int64_t>(DTypeSize(lw.dp_qkv.dtype()));
      }
      FS_RETURN_IF_ERROR(comm.AllGather(piece.data(), piece.size() * sizeof(float), all.data()));
      if (held) continue;
      // Pieces cross as f32 (exact widening of the weights' values).
      stats->peer_bytes += static_cast<int64_t>(rows - (r1 - r0)) * hidden * 4;
      // Pieces are consecutive rows: rank k's piece starts at row k * per.
      lw.dp_qkv.Add(h, 1, [&](int, float* dst) {
        std::memcpy(dst, all.data(), sizeof(float) * static_cast<size_t>((g + 2) * hd) * hidden);
      });
      lw.dp_o.Add(h, 1, [&](int, float* dst) {
        std::memcpy(dst, all.data() + static_cast<int64_t>((g + 2) * hd) * hidden,
                    sizeof(float) * static_cast<size_t>(g * hd) * hidden);
      });
    }
  }
  return Status::Ok();
}

void DeviceModel::RestoreKv(const std::vector<SeqRestore>& seqs, ApplyStats* stats) {
  const int bs = kv_.block_size(), hd = config_.head_dim;
  std::set<int64_t> live;
  for (const SeqRestore& s : seqs) {
    live.insert(s.seq_id);
    std::vector<int> needed;
    for (int l = 0; l < config_.num_layers; ++l) {
      for (int h : plan_.layers[l].tp_heads[device_]) needed.push_back(kv_.Slot(l, h));
      if (s.dp_rank == device_) {
        for (int h : plan_.layers[l].dp_heads) needed.push_back(kv_.Slot(l, h));
      }
    }
    std::sort(needed.begin(), needed.end());
    const std::vector<int> held = kv_.HeldSlots(s.seq_id);
    for (int slot : Minus(held, needed)) kv_.DropSlot(s.seq_id, slot);
    if (s.restore_tokens <= 0) continue;
    for (int slot : Minus(needed, held)) {
      // The scheduler accounted for these pages; the pool has them.
      Status st = kv_.Reserve(s.seq_id, slot, s.restore_tokens);
      FS_CHECK_MSG(st.ok(), "{}", st.ToString());
      const int layer = slot / config_.num_kv_heads, head = slot % config_.num_kv_heads;
      for (int blk = 0; blk * bs < s.restore_tokens; ++blk) {
        const int rows = std::min(bs, s.restore_tokens - blk * bs);
        FS_CHECK(blk < static_cast<int>(s.backup_blocks.size()) && s.backup_blocks[blk] >= 0);
        const float* src = backup_layout_.Slot(backup_base_, s.backup_blocks[blk], layer, head);
        float* page = kv_.Page(s.seq_id, slot, blk);
        std::memcpy(page, src, sizeof(float) * static_cast<size_t>(rows) * hd);
        std::memcpy(page + static_cast<int64_t>(bs) * hd, src + static_cast<int64_t>(bs) * hd,
                    sizeof(float) * static_cast<size_t>(rows) * hd);
        stats->kv_restored_bytes += 2LL * rows * hd * 4;
      }
    }
  }
  for (int64_t id : kv_.Seqs()) {
    if (!live.count(id)) kv_.FreeSeq(id);
  }
}

Status DeviceModel::ApplyPlan(const Plan& prev, const Plan& next, RecoveryMode mode,
                              const WeightStore& host, Communicator& comm,
                              const std::vector<SeqRestore>& seqs, ApplyStats* stats) {
  *stats = ApplyStats();
  DrainBackup();
  int64_t t0 = ThreadCpuNanos(), w0 = MonotonicNanos();
  if (mode == RecoveryMode::kFull && layers_.empty()) InitLayers(prev, host);  // a device joining
  if (mode != RecoveryMode::kFull) {
    // Reload the whole share and rebuild the KV from the backup (or not at all).
    FS_RETURN_IF_ERROR(LoadShare(next, host));
    stats->host_bytes = weight_bytes();
    stats->weights_ns = ThreadCpuNanos() - t0;
    stats->weights_wall_ns = MonotonicNanos() - w0;
    for (int64_t id : kv_.Seqs()) kv_.FreeSeq(id);
    t0 = ThreadCpuNanos();
    w0 = MonotonicNanos();
    RestoreKv(seqs, stats);
    stats->kv_ns = ThreadCpuNanos() - t0;
    stats->kv_wall_ns = MonotonicNanos() - w0;
    return Status::Ok();
  }
  HostLoader load(config_, next.shape, host);
  const int d = device_;
  const bool active = next.IsActive(d);
  for (int l = 0; l < config_.num_layers; ++l) {
    LayerWeights& lw = layers_[l];
    const std::vector<int> new_tp = active ? next.layers[l].tp_heads[d] : std::vector<int>{};
    const std::vector<int> new_dp = active ? next.layers[l].dp_heads : std::vector<int>{};
    // Heads changing role on this device keep their rows.
    for (int h : lw.dp_qkv.items()) {
      if (std::count(new_tp.begin(), new_tp.end(), h)) {
        Move(&lw.dp_qkv, &lw.tp_qkv, h);
        Move(&lw.dp_o, &lw.tp_o, h);
      }
    }
    for (int h : lw.tp_qkv.items()) {
      if (std::count(new_dp.begin(), new_dp.end(), h)) {
        Move(&lw.tp_qkv, &lw.dp_qkv, h);
        Move(&lw.tp_o, &lw.dp_o, h);
      }
    }
    for (int h : Minus(lw.tp_qkv.items(), new_tp)) {
      lw.tp_qkv.Remove(h);
      lw.tp_o.Remove(h);
    }
    for (int h : Minus(lw.dp_qkv.items(), new_dp)) {
      lw.dp_qkv.Remove(h);
      lw.dp_o.Remove(h);
    }
    const std::vector<int> gain_tp = Minus(new_tp, lw.tp_qkv.items());
    AddHeads(&lw.tp_qkv, &lw.tp_o, l, gain_tp, load);
    stats->host_bytes +=
        static_cast<int64_t>(gain_tp.size()) * (lw.tp_qkv.item_bytes() + lw.tp_o.item_bytes());
    // DP heads that were DP before but this device lacks (it just joined) come from the host too.
    const std::vector<int> brand_new = Minus(next.layers[l].dp_heads, prev.layers[l].dp_heads);
    const std::vector<int> gain_dp = Minus(Minus(new_dp, lw.dp_qkv.items()), brand_new);
    AddHeads(&lw.dp_qkv, &lw.dp_o, l, gain_dp, load);
    stats->host_bytes +=
        static_cast<int64_t>(gain_dp.size()) * (lw.dp_qkv.item_bytes() + lw.dp_o.item_bytes());
    // FFN shards.
    const std::vector<int> new_shards = active ? next.layers[l].ffn_shards[d] : std::vector<int>{};
    for (int s : Minus(lw.ffn_gate_up.items(), new_shards)) {
      lw.ffn_gate_up.Remove(s);
      lw.ffn_down.Remove(s);
    }
    const std::vector<int> gain_shards = Minus(new_shards, lw.ffn_gate_up.items());
    AddShards(&lw, l, gain_shards, load);
    stats->host_bytes += static_cast<int64_t>(gain_shards.size()) *
                         (lw.ffn_gate_up.item_bytes() + lw.ffn_down.item_bytes());
  }
  const std::vector<int> new_chunks = active ? next.vocab_chunks[d] : std::vector<int>{};
  for (int ch : Minus(embed_.items(), new_chunks)) {
    embed_.Remove(ch);
    lm_head_.Remove(ch);
  }
  const std::vector<int> gain_chunks = Minus(new_chunks, embed_.items());
  AddChunks(gain_chunks, load);
  stats->host_bytes += static_cast<int64_t>(gain_chunks.size()) * embed_.item_bytes() *
                       (config_.tie_word_embeddings ? 1 : 2);
  plan_ = next;
  if (active) FS_RETURN_IF_ERROR(GatherNewDpHeads(prev, next, load, comm, stats));
  stats->weights_ns = ThreadCpuNanos() - t0;
  stats->weights_wall_ns = MonotonicNanos() - w0;
  t0 = ThreadCpuNanos();
  w0 = MonotonicNanos();
  RestoreKv(seqs, stats);
  stats->kv_ns = ThreadCpuNanos() - t0;
  stats->kv_wall_ns = MonotonicNanos() - w0;
  return Status::Ok();
}

}  // namespace failsafe
