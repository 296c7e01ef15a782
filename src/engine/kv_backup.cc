#include "engine/kv_backup.h"

#include <algorithm>

#include "common/check.h"

namespace failsafe {

Result<std::unique_ptr<HostKvBackup>> HostKvBackup::Create(const ModelConfig& c, int block_size,
                                                           int64_t budget, int max_seqs,
                                                           int num_devices, DType kv_dtype) {
  auto b = std::unique_ptr<HostKvBackup>(new HostKvBackup());
  b->block_size_ = block_size;
  BackupLayout probe(c.num_layers, c.num_kv_heads, block_size, c.head_dim, 0, max_seqs, num_devices,
                     kv_dtype);
  const int64_t blocks = budget / probe.block_bytes();
  if (blocks < 1) return InvalidArgument("the KV backup budget of {} bytes holds no block", budget);
  b->layout_ = BackupLayout(c.num_layers, c.num_kv_heads, block_size, c.head_dim, blocks, max_seqs,
                            num_devices, kv_dtype);
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
  b->block_.resize(static_cast<size_t>(blocks));
  for (int64_t i = blocks - 1; i >= 0; --i) b->free_blocks_.push_back(static_cast<int32_t>(i));
  for (int s = max_seqs - 1; s >= 0; --s) b->free_slots_.push_back(s);
  return b;
}

void HostKvBackup::SetPlan(const Plan& plan) {
  writers_.assign(plan.num_devices, {});
  for (int rank : plan.active) writers_[rank] = plan.KvWriters(rank);
}

int32_t HostKvBackup::Allocate() {
  int32_t id = -1;
  if (!free_blocks_.empty()) {
    id = free_blocks_.back();
    free_blocks_.pop_back();
  } else if (!lru_.empty()) {
    // The least recently used block nobody names: its copy is given up.
    id = lru_.front();
    lru_.pop_front();
    index_.erase(block_[id].hash);
    block_[id] = Block();
    ++stats_.evicted_blocks;
  } else {
    return -1;
  }
  block_[id].refs = 1;
  return id;
}

void HostKvBackup::Unref(int32_t id) {
  Block& b = block_[id];
  if (--b.refs > 0) return;
  if (b.indexed) {
    b.lru = lru_.insert(lru_.end(), id);
  } else {
    free_blocks_.push_back(id);
  }
}

int32_t HostKvBackup::Find(std::span<const uint64_t> hashes, std::span<const int32_t> tokens,
                           int b) const {
  if (static_cast<size_t>((b + 1) * block_size_) > tokens.size()) return -1;
  auto it = index_.find(hashes[b]);
  if (it == index_.end()) return -1;
  const Block& e = block_[it->second];
  if (e.parent != (b > 0 ? hashes[b - 1] : 0)) return -1;
  if (!std::equal(e.tokens.begin(), e.tokens.end(), tokens.begin() + b * block_size_)) return -1;
  return it->second;
}

int HostKvBackup::HeldPrefix(std::span<const uint64_t> hashes,
                             std::span<const int32_t> tokens) const {
  int b = 0;
  while (b < static_cast<int>(hashes.size()) && Find(hashes, tokens, b) >= 0) ++b;
  return b;
}

int HostKvBackup::Name(int64_t seq_id, std::span<const uint64_t> shared,
                       std::span<const int32_t> tokens, int start) {
  SeqBackup& sb = seqs_[seq_id];
  if (sb.named) return static_cast<int>(sb.blocks.size());
  sb.named = true;
  int named = 0;
  for (; named < static_cast<int>(shared.size()) && (named + 1) * block_size_ <= start; ++named) {
    const int32_t id = Find(shared, tokens, named);
    if (id < 0) break;
    Block& b = block_[id];
    if (b.refs++ == 0) lru_.erase(b.lru);
    sb.blocks.push_back(id);
    sb.hashes.push_back(shared[named]);
  }
  sb.tokens.assign(tokens.begin(), tokens.begin() + named * block_size_);
  stats_.shared_blocks += named;
  sb.settled = named;
  return named;
}

void HostKvBackup::Prepare(int64_t seq_id, int start, int end, StepSeq* step,
                           std::vector<int32_t>* step_blocks) {
  SeqBackup& sb = seqs_[seq_id];
  sb.named = true;  // what it did not name by now it computes
  if (sb.slot < 0) {
    if (free_slots_.empty()) {
      step->backup_slot = -1;
      return;
    }
    sb.slot = free_slots_.back();
    free_slots_.pop_back();
    if (step->dp_rank >= 0 && step->dp_rank < static_cast<int>(writers_.size()))
      sb.writers = writers_[step->dp_rank];
    // Its slot starts at the blocks it named for every device (its leading
    // indexed ones: a rollback while it had no slot may have given it
    // private ones); the step copies the rest of what the devices hold.
    int named = 0;
    while (named < static_cast<int>(sb.blocks.size()) && sb.blocks[named] >= 0 &&
           block_[sb.blocks[named]].indexed)
      ++named;
    const int held = named * block_size_;
    sb.copy_from = held;
    for (int d = 0; d < layout_.header().num_devices; ++d) {
      BackupProgress* p = layout_.Progress(region_.data(), sb.slot, d);
      p->tokens.store(held, std::memory_order_relaxed);
      p->seq_id.store(seq_id, std::memory_order_release);
    }
  }
  const int need = (end + block_size_ - 1) / block_size_;
  while (static_cast<int>(sb.blocks.size()) < need) {
    const int32_t id = sb.exhausted ? -1 : Allocate();
    sb.exhausted = id < 0;
    sb.blocks.push_back(id);
  }
  const int from = std::min(start, sb.copy_from);
  sb.copy_from = std::numeric_limits<int>::max();
  step->backup_slot = sb.slot;
  step->backup_from = from;
  step->backup_first_block = from / block_size_;
  step->backup_count = need - step->backup_first_block;
  step->backup_offset = static_cast<int32_t>(step_blocks->size());
  step_blocks->insert(step_blocks->end(), sb.blocks.begin() + step->backup_first_block,
                      sb.blocks.begin() + need);
}

int HostKvBackup::SlotProgress(int64_t seq_id, int slot, int device) const {
  const BackupProgress* p = layout_.Progress(region_.data(), slot, device);
  if (p->seq_id.load(std::memory_order_acquire) != seq_id) return 0;
  return static_cast<int>(p->tokens.load(std::memory_order_acquire));
}

int HostKvBackup::Copied(int64_t seq_id, const SeqBackup& sb) const {
  if (sb.slot < 0 || sb.writers.empty()) return 0;
  int copied = std::numeric_limits<int>::max();
  for (int d : sb.writers) copied = std::min(copied, SlotProgress(seq_id, sb.slot, d));
  return copied;
}

void HostKvBackup::IndexComplete(int64_t seq_id, SeqBackup& sb) {
  const int complete =
      std::min({Copied(seq_id, sb) / block_size_, static_cast<int>(sb.hashes.size()),
                static_cast<int>(sb.blocks.size())});
  for (; sb.settled < complete; ++sb.settled) {
    const int32_t id = sb.blocks[sb.settled];
    if (id < 0) break;
    Block& b = block_[id];
    // Named from the index, or a second copy of an indexed hash: stays as it is.
    if (b.indexed || index_.count(sb.hashes[sb.settled])) continue;
    b.indexed = true;
    b.hash = sb.hashes[sb.settled];
    b.parent = sb.settled > 0 ? sb.hashes[sb.settled - 1] : 0;
    const auto first = sb.tokens.begin() + sb.settled * block_size_;
    b.tokens.assign(first, first + block_size_);
    index_[b.hash] = id;
    ++stats_.indexed_blocks;
  }
}

void HostKvBackup::Settle(int64_t seq_id, std::span<const uint64_t> hashes,
                          std::span<const int32_t> tokens) {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) return;
  SeqBackup& sb = it->second;
  FS_CHECK_MSG(tokens.size() >= hashes.size() * block_size_,
               "sequence {}: {} tokens for {} full blocks", seq_id, tokens.size(), hashes.size());
  for (size_t b = sb.hashes.size(); b < hashes.size(); ++b) sb.hashes.push_back(hashes[b]);
  if (sb.tokens.size() < sb.hashes.size() * block_size_)
    sb.tokens.insert(sb.tokens.end(), tokens.begin() + sb.tokens.size(),
                     tokens.begin() + sb.hashes.size() * block_size_);
  IndexComplete(seq_id, sb);
}

int HostKvBackup::Progress(int64_t seq_id, int device) const {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end() || it->second.slot < 0) return 0;
  return SlotProgress(seq_id, it->second.slot, device);
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

int HostKvBackup::RolledBack(int64_t seq_id, int tokens) {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) return tokens;
  SeqBackup& sb = it->second;
  // Blocks from the one holding position `tokens` on are written again; an
  // indexed block is never written again, so it gives way to a private one.
  const int keep = tokens / block_size_;
  int held = tokens;
  for (int b = keep; b < static_cast<int>(sb.blocks.size()); ++b) {
    const int32_t id = sb.blocks[b];
    if (id < 0 || !block_[id].indexed) continue;
    Unref(id);
    const int32_t fresh = sb.exhausted ? -1 : Allocate();
    sb.blocks[b] = fresh;
    if (fresh < 0) {
      // The budget is spent: the sequence is backed up up to here only.
      held = std::min(held, b * block_size_);
      sb.exhausted = true;
      for (int r = b + 1; r < static_cast<int>(sb.blocks.size()); ++r) {
        if (sb.blocks[r] >= 0) Unref(sb.blocks[r]);
        sb.blocks[r] = -1;
      }
      break;
    }
    if (b * block_size_ < tokens) held = std::min(held, b * block_size_);
  }
  sb.settled = std::min(sb.settled, keep);
  return held;
}

void HostKvBackup::SetProgress(int64_t seq_id, int device, int tokens) {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end() || it->second.slot < 0) return;
  BackupProgress* p = layout_.Progress(region_.data(), it->second.slot, device);
  p->seq_id.store(seq_id, std::memory_order_relaxed);
  p->tokens.store(tokens, std::memory_order_release);
}

void HostKvBackup::Rebase(int64_t seq_id, int dp_rank) {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) return;
  SeqBackup& sb = it->second;
  sb.writers.clear();
  if (dp_rank >= 0 && dp_rank < static_cast<int>(writers_.size())) sb.writers = writers_[dp_rank];
  if (sb.slot < 0) return;
  // A writer behind an indexed block has it in the backup already (every
  // slot of it): its progress passes it, so that the catch-up copy does not
  // write it again. The devices are idle (a plan change), so this races with
  // no backup writer.
  for (int d : sb.writers) {
    int p = Progress(seq_id, d);
    const int was = p;
    for (int b = p / block_size_; b < static_cast<int>(sb.blocks.size()); ++b) {
      if (sb.blocks[b] < 0 || !block_[sb.blocks[b]].indexed) break;
      p = (b + 1) * block_size_;
    }
    if (p != was) SetProgress(seq_id, d, p);
  }
  sb.copy_from = Copied(seq_id, sb);
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
  SeqBackup& sb = it->second;
  // Its devices drained their copies: what they published is final.
  IndexComplete(seq_id, sb);
  for (int32_t b : sb.blocks) {
    if (b >= 0) Unref(b);
  }
  if (sb.slot >= 0) {
    for (int d = 0; d < layout_.header().num_devices; ++d) {
      layout_.Progress(region_.data(), sb.slot, d)->seq_id.store(-1, std::memory_order_release);
    }
    free_slots_.push_back(sb.slot);
  }
  seqs_.erase(it);
}

Status HostKvBackup::CheckInvariants() const {
  const size_t n = block_.size();
  std::vector<int> named(n, 0);
  for (const auto& [id, sb] : seqs_) {
    bool missing = false;
    std::vector<int32_t> mine;
    for (int32_t b : sb.blocks) {
      if (b < 0) {
        missing = true;
        continue;
      }
      if (missing)
        return Internal("sequence {}: backup block {} after a missing one (exhausted)", id, b);
      if (b >= static_cast<int32_t>(n)) return Internal("sequence {}: no backup block {}", id, b);
      mine.push_back(b);
      ++named[b];
    }
    std::sort(mine.begin(), mine.end());
    if (std::adjacent_find(mine.begin(), mine.end()) != mine.end())
      return Internal("sequence {} names a backup block twice", id);
  }
  std::vector<char> is_free(n, 0), in_lru(n, 0);
  for (int32_t b : free_blocks_) {
    if (is_free[b]++) return Internal("backup block {} is free twice", b);
  }
  for (int32_t b : lru_) {
    if (in_lru[b]++) return Internal("backup block {} is in the LRU list twice", b);
  }
  size_t indexed = 0;
  for (size_t i = 0; i < n; ++i) {
    const Block& b = block_[i];
    if (b.refs != named[i])
      return Internal("backup block {}: {} references counted, {} sequences name it", i, b.refs,
                      named[i]);
    if (!b.indexed && b.refs > 1)
      return Internal("private backup block {} is named by {} sequences", i, b.refs);
    if (is_free[i] != (!b.indexed && b.refs == 0))
      return Internal("backup block {}: free {}, indexed {}, {} references", i, is_free[i] != 0,
                      b.indexed, b.refs);
    if (in_lru[i] != (b.indexed && b.refs == 0))
      return Internal("backup block {}: in the LRU list {}, {} references", i, in_lru[i] != 0,
                      b.refs);
    if (b.indexed) {
      ++indexed;
      auto it = index_.find(b.hash);
      if (it == index_.end() || it->second != static_cast<int32_t>(i))
        return Internal("indexed backup block {} is not found by its hash", i);
    }
  }
  if (indexed != index_.size())
    return Internal("{} backup blocks indexed, {} in the index", indexed, index_.size());
  return Status::Ok();
}

}  // namespace failsafe
