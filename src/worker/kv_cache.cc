#include "worker/kv_cache.h"

#include <algorithm>
#include <new>
#include <unordered_set>

#include "common/check.h"

namespace failsafe {

KvCache::KvCache(int num_layers, int num_kv_heads, int block_size, int head_dim, int64_t max_pages,
                 DeviceMemory* memory, DType kv_dtype)
    : num_layers_(num_layers),
      num_kv_heads_(num_kv_heads),
      block_size_(block_size),
      head_dim_(head_dim),
      kv_dtype_(kv_dtype),
      max_pages_(max_pages),
      memory_(memory) {
  FS_CHECK_MSG(kv_dtype == DType::kF32 || kv_dtype == DType::kBF16,
               "a KV cache holds f32 or bf16, not {}", DTypeName(kv_dtype));
  pool_bytes_ = static_cast<size_t>(std::max<int64_t>(max_pages_, 1) * page_bytes());
  base_ = static_cast<float*>(memory_->Allocate(pool_bytes_));
}

KvCache::~KvCache() { memory_->Free(base_, pool_bytes_); }

Status KvCache::AddBlocks(int64_t seq, const std::vector<int>& slots, int first_block,
                          int num_blocks, const int32_t* pages, int shared_blocks) {
  if (first_block < 0 || num_blocks < 0)
    return InvalidArgument("sequence {}: blocks [{}, +{}) out of range", seq, first_block,
                           num_blocks);
  for (size_t i = 0; i < slots.size(); ++i) {
    if (slots[i] < 0 || slots[i] >= num_slots() || (i > 0 && slots[i] <= slots[i - 1]))
      return InvalidArgument("sequence {}: bad slot list", seq);
  }
  auto it = seqs_.find(seq);
  const SeqPages* held = it == seqs_.end() ? nullptr : &it->second;
  int have = 0;
  if (held && !held->slots.empty()) {
    if (held->slots != slots) {
      return FailedPrecondition(
          "sequence {}: its table holds {} slots on this device, the update {}", seq,
          held->slots.size(), slots.size());
    }
    have = static_cast<int>(held->ids[slots.front()].size());
  }
  if (shared_blocks < 0 || shared_blocks > first_block + num_blocks ||
      (held && have > 0 && shared_blocks != held->shared))
    return FailedPrecondition("sequence {}: {} shared blocks do not fit its table", seq,
                              shared_blocks);
  if (first_block > have) {
    return FailedPrecondition("sequence {}: table holds {} blocks, the update starts at block {}",
                              seq, have, first_block);
  }
  // Check everything before changing anything.
  std::unordered_set<int32_t> fresh;
  for (int b = 0; b < num_blocks; ++b) {
    for (size_t i = 0; i < slots.size(); ++i) {
      const int32_t page = pages[static_cast<int64_t>(b) * slots.size() + i];
      const int block = first_block + b;
      if (block < have) {
        if (held->ids[slots[i]][block] != page)
          return FailedPrecondition("sequence {}: block {} of slot {} is page {}, not {}", seq,
                                    block, slots[i], held->ids[slots[i]][block], page);
        continue;
      }
      if (page < 0 || page >= max_pages_)
        return InvalidArgument("sequence {}: page {} is outside the pool of {} pages", seq, page,
                               max_pages_);
      if (!fresh.insert(page).second)
        return FailedPrecondition("sequence {}: page {} is named twice", seq, page);
      // A shared (cached) block's pages may be held by other tables.
      if (block >= shared_blocks && page < static_cast<int64_t>(holders_.size()) &&
          holders_[page] > 0) {
        return FailedPrecondition("sequence {}: page {} of block {} already holds KV of another",
                                  seq, page, block);
      }
    }
  }
  SeqPages& s = seqs_[seq];
  if (s.ids.empty()) {
    s.ids.resize(num_slots());
    s.pointers.resize(num_slots());
  }
  s.slots = slots;
  s.shared = shared_blocks;
  for (int b = std::max(0, have - first_block); b < num_blocks; ++b) {
    for (size_t i = 0; i < slots.size(); ++i) {
      const int32_t page = pages[static_cast<int64_t>(b) * slots.size() + i];
      if (page >= static_cast<int64_t>(holders_.size()))
        holders_.resize(std::max<size_t>(page + 1, holders_.size() * 2), 0);
      if (holders_[page]++ == 0) ++used_pages_;
      s.ids[slots[i]].push_back(page);
      s.pointers[slots[i]].push_back(PageAddress(page));
    }
  }
  return Status::Ok();
}

float* const* KvCache::Pages(int64_t seq, int slot) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end() || it->second.pointers.empty() || it->second.pointers[slot].empty())
    return nullptr;
  return it->second.pointers[slot].data();
}

float* KvCache::Page(int64_t seq, int slot, int block) {
  return seqs_.at(seq).pointers.at(slot).at(block);
}

int KvCache::NumBlocks(int64_t seq, int slot) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end() || it->second.ids.empty()) return 0;
  return static_cast<int>(it->second.ids[slot].size());
}

std::vector<int32_t> KvCache::PageIds(int64_t seq, int slot) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end() || it->second.ids.empty()) return {};
  return it->second.ids[slot];
}

void KvCache::FreeSeq(int64_t seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  for (const auto& ids : it->second.ids) {
    for (int32_t page : ids) {
      if (--holders_[page] == 0) --used_pages_;
    }
  }
  seqs_.erase(it);
}

int KvCache::SharedBlocks(int64_t seq) const {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? 0 : it->second.shared;
}

std::vector<int64_t> KvCache::Seqs() const {
  std::vector<int64_t> out;
  for (auto& [id, _] : seqs_) out.push_back(id);
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<int> KvCache::HeldSlots(int64_t seq) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return {};
  return it->second.slots;
}

}  // namespace failsafe
