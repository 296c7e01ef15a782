#include "engine/kv_backup.h"

#include <algorithm>

namespace failsafe {

Result<std::unique_ptr<HostKvBackup>> HostKvBackup::Create(const ModelConfig& c, int block_size,
                                                           int64_t budget, int max_seqs,
                                                           int num_devices) {
  auto b = std::unique_ptr<HostKvBackup>(new HostKvBackup());
  b->block_size_ = block_size;
  BackupLayout probe(c.num_layers, c.num_kv_heads, block_size, c.head_dim, 0, max_seqs,
                     num_devices);
  const int64_t blocks = budget / (probe.block_floats() * 4);
  if (blocks < 1) return InvalidArgument("the KV backup budget of {} bytes holds no block", budget);
  b->layout_ = BackupLayout(c.num_layers, c.num_kv_heads, block_size, c.head_dim, blocks, max_seqs,
                            num_devices);
  FS_ASSIGN_OR_RETURN(b->region_,
                      ShmRegion::Create("failsafe-kv-backup", b->layout_.total_bytes()));
  auto* h = static_cast<BackupHeader*>(b->region_.data());
  *h = b->layout_.header();
  for (int s = 0; s < max_seqs; ++s) {
    for (int d = 0; d < num_devices; ++d) {
      BackupProgress* p = b->layout_.Progress(b->region_.data(), s, d);
      p->seq_id.store(-1);
      p->tokens.store(0);
    }
  }
  for (int64_t i = blocks - 1; i >= 0; --i) b->free_blocks_.push_back(static_cast<int32_t>(i));
  for (int s = max_seqs - 1; s >= 0; --s) b->free_slots_.push_back(s);
  return b;
}

void HostKvBackup::Prepare(int64_t seq_id, int start, int end, StepSeq* step,
                           std::vector<int32_t>* step_blocks) {
  SeqBackup& sb = seqs_[seq_id];
  if (sb.slot < 0) {
    if (free_slots_.empty()) {
      step->backup_slot = -1;
      return;
    }
    sb.slot = free_slots_.back();
    free_slots_.pop_back();
    // The slot starts empty for every device.
    for (int d = 0; d < layout_.header().num_devices; ++d) {
      BackupProgress* p = layout_.Progress(region_.data(), sb.slot, d);
      p->tokens.store(0, std::memory_order_relaxed);
      p->seq_id.store(seq_id, std::memory_order_release);
    }
  }
  const int need = (end + block_size_ - 1) / block_size_;
  while (static_cast<int>(sb.blocks.size()) < need) {
    if (sb.exhausted || free_blocks_.empty()) {
      sb.exhausted = true;
      sb.blocks.push_back(-1);
    } else {
      sb.blocks.push_back(free_blocks_.back());
      free_blocks_.pop_back();
    }
  }
  step->backup_slot = sb.slot;
  step->backup_first_block = start / block_size_;
  step->backup_count = need - step->backup_first_block;
  step->backup_offset = static_cast<int32_t>(step_blocks->size());
  step_blocks->insert(step_blocks->end(), sb.blocks.begin() + step->backup_first_block,
                      sb.blocks.begin() + need);
}

int HostKvBackup::Progress(int64_t seq_id, int device) const {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end() || it->second.slot < 0) return 0;
  const BackupProgress* p = layout_.Progress(region_.data(), it->second.slot, device);
  if (p->seq_id.load(std::memory_order_acquire) != seq_id) return 0;
  return static_cast<int>(p->tokens.load(std::memory_order_acquire));
}

int HostKvBackup::Restorable(int64_t seq_id, int device) const {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) return 0;
  int backed = 0;
  for (int32_t b : it->second.blocks) {
    if (b < 0) break;
    backed += block_size_;
  }
  return std::min(Progress(seq_id, device), backed);
}

void HostKvBackup::SetProgress(int64_t seq_id, int device, int tokens) {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end() || it->second.slot < 0) return;
  BackupProgress* p = layout_.Progress(region_.data(), it->second.slot, device);
  p->seq_id.store(seq_id, std::memory_order_relaxed);
  p->tokens.store(tokens, std::memory_order_release);
}

void HostKvBackup::CopiedByStep(int64_t seq_id, const std::vector<int>& devices, int start,
                                int end) {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end() || it->second.slot < 0) return;
  for (int device : devices) {
    BackupProgress* p = layout_.Progress(region_.data(), it->second.slot, device);
    if (p->seq_id.load(std::memory_order_relaxed) != seq_id) {
      p->tokens.store(0, std::memory_order_relaxed);
      p->seq_id.store(seq_id, std::memory_order_relaxed);
    }
    const int64_t held = p->tokens.load(std::memory_order_relaxed);
    if (end > held && start <= held) p->tokens.store(end, std::memory_order_release);
  }
}

const std::vector<int32_t>& HostKvBackup::Blocks(int64_t seq_id) const {
  static const std::vector<int32_t> kNone;
  auto it = seqs_.find(seq_id);
  return it == seqs_.end() ? kNone : it->second.blocks;
}

void HostKvBackup::Release(int64_t seq_id) {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) return;
  for (int32_t b : it->second.blocks) {
    if (b >= 0) free_blocks_.push_back(b);
  }
  if (it->second.slot >= 0) {
    for (int d = 0; d < layout_.header().num_devices; ++d) {
      layout_.Progress(region_.data(), it->second.slot, d)
          ->seq_id.store(-1, std::memory_order_release);
    }
    free_slots_.push_back(it->second.slot);
  }
  seqs_.erase(it);
}

}  // namespace failsafe
