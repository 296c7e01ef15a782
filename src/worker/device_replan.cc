// A device across plan changes: the host KV backup it writes, and applying a
// new plan (failure recovery and rejoin).
#include <algorithm>
#include <cstring>
#include <set>
#include <thread>

#include "common/check.h"
#include "common/clock.h"
#include "worker/device_model.h"

namespace failsafe {

void DeviceModel::SetBackup(BackupWriter* writer, const BackupLayout& layout, void* base) {
  FS_CHECK_MSG(layout.kv_dtype() == kv_.kv_dtype(), "the KV backup holds {}, the pages {}",
               DTypeName(layout.kv_dtype()), DTypeName(kv_.kv_dtype()));
  backup_ = writer;
  backup_layout_ = layout;
  backup_base_ = base;
}

void DeviceModel::DrainBackup() {
  if (backup_) backup_->Drain();
}

// After a step: for every sequence with a backup slot, copy the positions it
// wrote into the host backup, in the background: every DP slot the device
// holds (it is the sequence's DP rank) and every TP slot it is the backup
// writer of (a replicated head group is copied by one of its holders).
void DeviceModel::EnqueueBackup(const StepBatch& b) {
  if (!backup_) return;
  const int bs = kv_.block_size();
  for (const StepSeq& s : b.seqs) {
    if (s.backup_slot < 0) continue;
    BackupJob job;
    job.seq_id = s.seq_id;
    job.slot = s.backup_slot;
    // Positions before start_pos the backup lacks are in the pages already.
    job.start = s.BackupStart();
    job.end = s.start_pos + s.num_tokens;
    // Stop at the first block without a backup block.
    for (int blk = job.start / bs; blk * bs < job.end; ++blk) {
      const int k = blk - s.backup_first_block;
      if (k < 0 || k >= s.backup_count || b.backup_blocks[s.backup_offset + k] < 0) {
        job.end = std::max(job.start, blk * bs);
        break;
      }
    }
    if (job.end <= job.start) continue;
    for (int slot : kv_.HeldSlots(s.seq_id)) {
      const int layer = slot / config_.num_kv_heads, head = slot % config_.num_kv_heads;
      if (!plan_.IsDpHead(layer, head) && !backup_tp_slot_[slot]) continue;
      for (int blk = job.start / bs; blk * bs < job.end; ++blk) {
        const int backup_block = b.backup_blocks[s.backup_offset + blk - s.backup_first_block];
        BackupJob::Copy c;
        c.page = reinterpret_cast<const char*>(kv_.Page(s.seq_id, slot, blk));
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
// active device. Its rows (q, k, v, then o^T) are split into one piece per
// device; each device supplies its piece (from its own copy where it holds
// those rows, else from the host), and an all-gather gives everyone the
// whole: no byte crosses from the host twice.
Status DeviceModel::GatherNewDpHeads(const Plan& prev, const Plan& next, const HostLoader& load,
                                     Communicator& comm, ApplyStats* stats) {
  const int hd = config_.head_dim, g = config_.group_size(), hidden = config_.hidden_size;
  const int rows = (2 * g + 2) * hd;  // q, k, v, o^T
  const int n = comm.size(), rank = comm.rank();
  const int per = (rows + n - 1) / n;
  std::vector<float> piece(static_cast<size_t>(per) * hidden),
      all(static_cast<size_t>(per) * hidden * n);
  for (int l = 0; l < config_.num_layers; ++l) {
    AttentionWeights& dp = layers_[l].dp;
    for (int h : Minus(next.layers[l].dp_heads, prev.layers[l].dp_heads)) {
      // Row r of the group from this device's copy into dst (as f32, exact);
      // false if it lacks it.
      auto local_row = [&](int r, float* dst) -> bool {
        const ItemMatrix* m = &dp.o;
        int item = 0, in_item = 0;
        if (r < g * hd) {
          m = &dp.q;
          item = h * g + r / hd;
          in_item = r % hd;
        } else if (r < (g + 2) * hd) {
          m = &dp.kv;
          item = h;
          in_item = r - g * hd;
        } else {
          item = h * g + (r - (g + 2) * hd) / hd;
          in_item = (r - (g + 2) * hd) % hd;
        }
        if (!m->Has(item)) return false;
        m->ReadRows(item, in_item, 1, dst);
        return true;
      };
      const int r0 = std::min(rows, rank * per), r1 = std::min(rows, r0 + per);
      for (int r = r0; r < r1; ++r) {
        float* dst = piece.data() + static_cast<int64_t>(r - r0) * hidden;
        if (!local_row(r, dst)) {
          load.HeadRows(l, h, r, r + 1, dst);
          stats->host_bytes += static_cast<int64_t>(hidden) * DTypeSize(dp.q.dtype());
        }
      }
      FS_RETURN_IF_ERROR(comm.AllGather(piece.data(), piece.size() * sizeof(float), all.data()));
      // Pieces are consecutive rows: rank k's piece starts at row k * per.
      // Items this device lacks take their rows from the gathered whole.
      auto copy_rows = [&](int row0, int count, float* dst) {
        std::memcpy(dst, all.data() + static_cast<int64_t>(row0) * hidden,
                    sizeof(float) * static_cast<size_t>(count) * hidden);
        for (int r = row0; r < row0 + count; ++r) {
          if (r < r0 || r >= r1) stats->peer_bytes += static_cast<int64_t>(hidden) * 4;
        }
      };
      std::vector<int> missing;
      for (int j = 0; j < g; ++j) {
        if (!dp.q.Has(h * g + j)) missing.push_back(h * g + j);
      }
      for (auto [first, count] : ItemRuns(missing, 0)) {
        dp.q.Add(first, count, [&](int q, float* dst) { copy_rows((q - h * g) * hd, hd, dst); });
        dp.o.Add(first, count,
                 [&](int q, float* dst) { copy_rows((g + 2) * hd + (q - h * g) * hd, hd, dst); });
      }
      if (!dp.kv.Has(h)) dp.kv.Add(h, 1, [&](int, float* dst) { copy_rows(g * hd, 2 * hd, dst); });
    }
  }
  return Status::Ok();
}

int64_t DeviceModel::CopyFromBackup(int64_t seq_id, int slot, int block, int32_t backup_block,
                                    int rows, std::vector<DeviceMemory::HostCopy>& batch) {
  const int bs = kv_.block_size();
  const int64_t row = static_cast<int64_t>(config_.head_dim) * kv_.elem_bytes();
  const int layer = slot / config_.num_kv_heads, head = slot % config_.num_kv_heads;
  const char* src = backup_layout_.Slot(backup_base_, backup_block, layer, head);
  char* page = reinterpret_cast<char*>(kv_.Page(seq_id, slot, block));
  const size_t bytes = static_cast<size_t>(rows * row);
  // K, then V a block further: one copy where the rows are the whole block.
  DeviceMemory::AppendCopy(batch, {page, src, bytes});
  DeviceMemory::AppendCopy(batch, {page + bs * row, src + bs * row, bytes});
  return 2LL * rows * row;
}

void DeviceModel::CopyBackupIn(const std::vector<DeviceMemory::HostCopy>& batch,
                               bool compute_thread) {
  if (batch.empty()) return;
  if (compute_thread) backend_->Synchronize();
  backend_->BackgroundCopiesToDevice(batch.data(), batch.size());
}

Status DeviceModel::CopyHostHits(const StepBatch& b) {
  const int bs = kv_.block_size();
  // Checked first (identically on every device): a bad entry changes nothing.
  for (const StepSeq& s : b.seqs) {
    if (s.host_blocks == 0) continue;
    if (s.host_blocks < 0 || s.host_first_block < 0 || s.host_offset < 0 ||
        s.host_offset + static_cast<int64_t>(s.host_blocks) >
            static_cast<int64_t>(b.backup_blocks.size()) ||
        (s.host_first_block + s.host_blocks) * bs > s.start_pos) {
      return InvalidArgument("sequence {}: a malformed host-tier hit", s.seq_id);
    }
    if (s.host_first_block < kv_.SharedBlocks(s.seq_id))
      return FailedPrecondition("sequence {}: a host-tier hit into a shared block", s.seq_id);
    for (int k = 0; k < s.host_blocks; ++k) {
      const int32_t id = b.backup_blocks[s.host_offset + k];
      if (!backup_base_ || id < 0 || id >= backup_layout_.header().num_blocks)
        return FailedPrecondition("sequence {}: block {} has no host backup to copy from", s.seq_id,
                                  s.host_first_block + k);
    }
  }
  // Before any graph of the step begins (CopyBackupIn synchronizes).
  std::vector<DeviceMemory::HostCopy> batch;
  for (const StepSeq& s : b.seqs) {
    if (s.host_blocks == 0) continue;
    for (int slot : KvSlots(s.dp_rank)) {
      for (int k = 0; k < s.host_blocks; ++k)
        CopyFromBackup(s.seq_id, slot, s.host_first_block + k, b.backup_blocks[s.host_offset + k],
                       bs, batch);
    }
  }
  CopyBackupIn(batch, /*compute_thread=*/true);
  return Status::Ok();
}

Status DeviceModel::RestoreKv(const std::vector<SeqRestore>& seqs, bool keep, ApplyStats* stats,
                              bool background) {
  const int bs = kv_.block_size();
  // Check the new tables against what the device holds before changing it.
  for (const SeqRestore& s : seqs) {
    const std::vector<int>& slots = KvSlots(s.dp_rank);
    if (s.num_blocks < 0 || s.pages.size() != slots.size() * static_cast<size_t>(s.num_blocks))
      return InvalidArgument("sequence {}: a block table of {} pages for {} blocks of {} slots",
                             s.seq_id, s.pages.size(), s.num_blocks, slots.size());
    if (s.restore_tokens > 0 &&
        (s.restore_tokens > s.num_blocks * bs ||
         static_cast<int64_t>(s.backup_blocks.size()) * bs < s.restore_tokens)) {
      return InvalidArgument("sequence {}: {} positions to restore exceed its blocks", s.seq_id,
                             s.restore_tokens);
    }
    if (s.restore_from < 0 || s.restore_from % bs != 0 ||
        s.restore_from > std::max(0, s.restore_tokens) || s.shared_blocks < 0 ||
        s.shared_blocks > s.num_blocks || s.restore_from > s.shared_blocks * bs) {
      return InvalidArgument(
          "sequence {}: restoring from position {} with {} shared blocks of {} does not fit",
          s.seq_id, s.restore_from, s.shared_blocks, s.num_blocks);
    }
    if (!keep) continue;
    // A kept slot must hold its KV up to restore_tokens in the pages the new
    // table names. The device may lack the table's last blocks (the step that
    // would have brought them failed): nothing was written there.
    const int needed = (std::max(0, s.restore_tokens) + bs - 1) / bs;
    for (size_t i = 0; i < slots.size(); ++i) {
      if (std::count(s.restore_slots.begin(), s.restore_slots.end(), slots[i])) continue;
      const std::vector<int32_t> had = kv_.PageIds(s.seq_id, slots[i]);
      const int n = static_cast<int>(had.size());
      bool same = n >= needed && n <= s.num_blocks;
      for (int b = 0; same && b < n; ++b)
        same = had[b] == s.pages[static_cast<size_t>(b) * slots.size() + i];
      if (!same) {
        return FailedPrecondition(
            "device {}: sequence {} keeps slot {} in place, but the device holds other pages",
            device_, s.seq_id, slots[i]);
      }
    }
  }
  for (int64_t id : kv_.Seqs()) kv_.FreeSeq(id);
  std::vector<DeviceMemory::HostCopy> batch;
  for (const SeqRestore& s : seqs) {
    const std::vector<int>& slots = KvSlots(s.dp_rank);
    FS_RETURN_IF_ERROR(
        kv_.AddBlocks(s.seq_id, slots, 0, s.num_blocks, s.pages.data(), s.shared_blocks));
    if (s.restore_tokens <= 0) continue;
    for (int slot : slots) {
      if (keep && !std::count(s.restore_slots.begin(), s.restore_slots.end(), slot)) continue;
      for (int blk = s.restore_from / bs; blk * bs < s.restore_tokens; ++blk) {
        const int rows = std::min(bs, s.restore_tokens - blk * bs);
        if (s.backup_blocks[blk] < 0 ||
            s.backup_blocks[blk] >= backup_layout_.header().num_blocks || !backup_base_) {
          return FailedPrecondition("sequence {}: block {} has no host backup to restore from",
                                    s.seq_id, blk);
        }
        stats->kv_restored_bytes +=
            CopyFromBackup(s.seq_id, slot, blk, s.backup_blocks[blk], rows, batch);
      }
    }
  }
  CopyBackupIn(batch, /*compute_thread=*/!background);
  return Status::Ok();
}

Status DeviceModel::ApplyPlan(const Plan& prev, const Plan& next, RecoveryMode mode,
                              const WeightStore& host, Communicator& comm,
                              const std::vector<SeqRestore>& seqs, ApplyStats* stats) {
  *stats = ApplyStats();
  ++graph_epoch_;
  DrainBackup();
  int64_t t0 = ThreadCpuNanos(), w0 = MonotonicNanos();
  if (mode == RecoveryMode::kFull && layers_.empty()) InitLayers(prev, host);  // a device joining
  if (mode != RecoveryMode::kFull) {
    // Reload the whole share and rebuild the KV from the backup (or not at all).
    FS_RETURN_IF_ERROR(LoadShare(next, host));
    stats->host_bytes = weight_bytes();
    stats->weights_ns = ThreadCpuNanos() - t0;
    stats->weights_wall_ns = MonotonicNanos() - w0;
    t0 = ThreadCpuNanos();
    w0 = MonotonicNanos();
    FS_RETURN_IF_ERROR(RestoreKv(seqs, /*keep=*/false, stats));
    stats->kv_ns = ThreadCpuNanos() - t0;
    stats->kv_wall_ns = MonotonicNanos() - w0;
    return Status::Ok();
  }
  // The new plan first: the KV restore reads its slots while the weights
  // move (which read only `prev` and `next`).
  plan_ = next;
  UpdateBackupSlots();
  ApplyStats kv;
  Status kv_status;
  std::thread restore([&] {
    const int64_t t = ThreadCpuNanos(), w = MonotonicNanos();
    kv_status = RestoreKv(seqs, /*keep=*/true, &kv, /*background=*/true);
    kv.kv_ns = ThreadCpuNanos() - t;
    kv.kv_wall_ns = MonotonicNanos() - w;
  });
  const Status weights = MoveWeights(prev, next, host, comm, stats);
  stats->weights_ns = ThreadCpuNanos() - t0;
  stats->weights_wall_ns = MonotonicNanos() - w0;
  restore.join();
  stats->kv_restored_bytes = kv.kv_restored_bytes;
  stats->kv_ns = kv.kv_ns;
  stats->kv_wall_ns = kv.kv_wall_ns;
  FS_RETURN_IF_ERROR(weights);
  return kv_status;
}

Status DeviceModel::MoveWeights(const Plan& prev, const Plan& next, const WeightStore& host,
                                Communicator& comm, ApplyStats* stats) {
  HostLoader load(config_, next.shape, host);
  const int d = device_;
  const bool active = next.IsActive(d);
  for (int l = 0; l < config_.num_layers; ++l) {
    LayerWeights& lw = layers_[l];
    const std::vector<int> new_tp_q = active ? next.layers[l].tp_queries[d] : std::vector<int>{};
    const std::vector<int> new_tp_kv = active ? next.layers[l].tp_heads[d] : std::vector<int>{};
    const std::vector<int> new_dp = active ? next.layers[l].dp_heads : std::vector<int>{};
    const std::vector<int> new_dp_q = QueriesOfGroups(new_dp);
    // Heads changing role on this device keep their rows.
    auto move = [](AttentionWeights* from, AttentionWeights* to, const std::vector<int>& groups,
                   const std::vector<int>& queries) {
      for (int h : from->kv.items()) {
        if (std::count(groups.begin(), groups.end(), h)) Move(&from->kv, &to->kv, h);
      }
      for (int q : from->q.items()) {
        if (std::count(queries.begin(), queries.end(), q)) {
          Move(&from->q, &to->q, q);
          Move(&from->o, &to->o, q);
        }
      }
    };
    move(&lw.dp, &lw.tp, new_tp_kv, new_tp_q);
    move(&lw.tp, &lw.dp, new_dp, new_dp_q);
    for (AttentionWeights* w : {&lw.tp, &lw.dp}) {
      const std::vector<int>& keep_q = w == &lw.tp ? new_tp_q : new_dp_q;
      const std::vector<int>& keep_kv = w == &lw.tp ? new_tp_kv : new_dp;
      for (int q : Minus(w->q.items(), keep_q)) {
        w->q.Remove(q);
        w->o.Remove(q);
      }
      for (int h : Minus(w->kv.items(), keep_kv)) w->kv.Remove(h);
    }
    const std::vector<int> gain_tp_q = Minus(new_tp_q, lw.tp.q.items());
    const std::vector<int> gain_tp_kv = Minus(new_tp_kv, lw.tp.kv.items());
    AddAttention(&lw.tp, l, gain_tp_q, gain_tp_kv, load);
    stats->host_bytes +=
        static_cast<int64_t>(gain_tp_q.size()) * (lw.tp.q.item_bytes() + lw.tp.o.item_bytes()) +
        static_cast<int64_t>(gain_tp_kv.size()) * lw.tp.kv.item_bytes();
    // DP heads that were DP before but this device lacks (it just joined) come
    // from the host too; heads new to DP are gathered below.
    const std::vector<int> brand_new = Minus(next.layers[l].dp_heads, prev.layers[l].dp_heads);
    const std::vector<int> old_dp = Minus(new_dp, brand_new);
    const std::vector<int> gain_dp_q = Minus(QueriesOfGroups(old_dp), lw.dp.q.items());
    const std::vector<int> gain_dp_kv = Minus(old_dp, lw.dp.kv.items());
    AddAttention(&lw.dp, l, gain_dp_q, gain_dp_kv, load);
    stats->host_bytes +=
        static_cast<int64_t>(gain_dp_q.size()) * (lw.dp.q.item_bytes() + lw.dp.o.item_bytes()) +
        static_cast<int64_t>(gain_dp_kv.size()) * lw.dp.kv.item_bytes();
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
  if (active) FS_RETURN_IF_ERROR(GatherNewDpHeads(prev, next, load, comm, stats));
  // The weights phase ends when they are on the device: copies from the
  // backend's staging may still run on return from their call.
  backend_->Synchronize();
  return Status::Ok();
}

}  // namespace failsafe
