// A device's paged KV cache.
//
// The pool is an array of pages; a page holds K [block_size, head_dim] then
// V [block_size, head_dim] for one (sequence, layer, KV head) slot and
// block_size consecutive positions. A sequence holds pages only for the slots
// its device computes: the device's TP heads, and the DP heads when the device
// is the sequence's DP rank.
//
// Thread-safety: not thread-safe; owned by the device's compute thread.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "common/status.h"

namespace failsafe {

class KvCache {
 public:
  // max_pages: the pool's size (virtual memory, committed as pages are used).
  KvCache(int num_layers, int num_kv_heads, int block_size, int head_dim, int64_t max_pages);
  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  int block_size() const { return block_size_; }
  int head_dim() const { return head_dim_; }
  int64_t page_floats() const { return 2LL * block_size_ * head_dim_; }
  int64_t page_bytes() const { return page_floats() * 4; }
  int64_t max_pages() const { return max_pages_; }
  int64_t used_pages() const { return max_pages_ - static_cast<int64_t>(free_.size()); }
  int num_slots() const { return num_layers_ * num_kv_heads_; }
  int Slot(int layer, int head) const { return layer * num_kv_heads_ + head; }

  bool HasSeq(int64_t seq) const { return seqs_.count(seq) != 0; }
  // Ensures the slot of the sequence has pages for positions [0, num_tokens).
  // Fails (changing nothing) if the pool runs out.
  Status Reserve(int64_t seq, int slot, int num_tokens);
  // Pages of one slot (one per block), or nullptr if the slot holds none.
  const float* const* Pages(int64_t seq, int slot) const;
  float* Page(int64_t seq, int slot, int block);
  int NumBlocks(int64_t seq, int slot) const;
  // Frees pages past num_tokens in every slot of the sequence.
  void Truncate(int64_t seq, int num_tokens);
  // Frees every page of one slot of the sequence.
  void DropSlot(int64_t seq, int slot);
  void FreeSeq(int64_t seq);
  std::vector<int64_t> Seqs() const;
  // Slots of the sequence that hold pages.
  std::vector<int> HeldSlots(int64_t seq) const;

 private:
  struct SeqPages {
    std::vector<std::vector<float*>> slots;  // [slot] -> page per block
  };
  float* PageAddress(int64_t index) const { return base_ + index * page_floats(); }
  int64_t PageIndex(const float* p) const { return (p - base_) / page_floats(); }

  const int num_layers_, num_kv_heads_, block_size_, head_dim_;
  const int64_t max_pages_;
  float* base_ = nullptr;
  size_t mapped_bytes_ = 0;
  std::vector<int64_t> free_;  // stack of free page indices
  std::unordered_map<int64_t, SeqPages> seqs_;
};

}  // namespace failsafe
