// A device's paged KV cache: a page store. The scheduler's block manager
// (core/kv_blocks.h) owns which page holds what; the device is told each
// sequence's block table and writes where it says.
//
// The pool is an array of pages; a page holds K [block_size, head_dim] then
// V [block_size, head_dim] for one (sequence, layer, KV head) slot and
// block_size consecutive positions, as f32 or bf16 (kv_dtype: half the
// bytes, the values rounded once as they are stored; AttentionArgs). A
// page's address is typed float* either way. A sequence's table on this
// device lists, per block, one page for each of its slots (Plan::KvSlots:
// the device's TP heads, and the DP heads when the device is the sequence's
// DP rank).
//
// A table that does not fit the store (a page outside the pool, a page that
// already holds something else, a block out of order) is refused with an
// error and changes nothing: it means the coordinator and the device are out
// of step, which a plan change (sending every table whole) repairs.
// Prefix caching: a table's first shared_blocks blocks may name pages other
// tables hold (full blocks of a cached prefix); the sequence only reads them
// (SharedBlocks: the device refuses a step that would write there).
//
// Thread-safety: not thread-safe; owned by the device's compute thread.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "common/status.h"

namespace failsafe {

// What a KV cache holds for `--kv-dtype auto`: bf16 for a model whose
// matrices are bf16 (its keys and values are products of bf16 weights;
// half the memory a token), else f32.
inline DType DefaultKvDtype(DType weights) {
  return weights == DType::kBF16 ? DType::kBF16 : DType::kF32;
}

class KvCache {
 public:
  // max_pages: the pool's size, in `memory` (a backend's device memory; host
  // memory is committed as pages are used).
  KvCache(int num_layers, int num_kv_heads, int block_size, int head_dim, int64_t max_pages,
          DeviceMemory* memory = &HostMemory(), DType kv_dtype = DType::kF32);
  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  int block_size() const { return block_size_; }
  int head_dim() const { return head_dim_; }
  DType kv_dtype() const { return kv_dtype_; }
  int elem_bytes() const { return static_cast<int>(DTypeSize(kv_dtype_)); }
  int64_t page_elems() const { return 2LL * block_size_ * head_dim_; }
  int64_t page_bytes() const { return page_elems() * elem_bytes(); }
  int64_t max_pages() const { return max_pages_; }
  int64_t used_pages() const { return used_pages_; }
  int num_slots() const { return num_layers_ * num_kv_heads_; }
  int Slot(int layer, int head) const { return layer * num_kv_heads_ + head; }

  bool HasSeq(int64_t seq) const { return seqs_.count(seq) != 0; }
  // Blocks [first_block, first_block + num_blocks) of the sequence's table:
  // pages[b * slots.size() + i] holds slot slots[i] (ascending) of block
  // first_block + b. Blocks the sequence already has must name the same pages
  // (a table sent again); first_block must not pass its last block. Fails,
  // changing nothing, on anything else.
  // Its first `shared_blocks` blocks may name pages other tables hold.
  Status AddBlocks(int64_t seq, const std::vector<int>& slots, int first_block, int num_blocks,
                   const int32_t* pages, int shared_blocks = 0);
  // Leading blocks of the sequence's table that are shared (read-only).
  int SharedBlocks(int64_t seq) const;
  // Pages of one slot (one per block, device addresses in a host array), or
  // nullptr if the slot holds none.
  float* const* Pages(int64_t seq, int slot) const;
  // The page (device memory) of a block the table covers (the caller checked
  // NumBlocks).
  float* Page(int64_t seq, int slot, int block);
  int NumBlocks(int64_t seq, int slot) const;
  // Page ids of one slot, one per block (empty if it holds none).
  std::vector<int32_t> PageIds(int64_t seq, int slot) const;
  // Forgets the sequence's table (its pages are free for the block manager
  // to hand out again; their contents stay until overwritten).
  void FreeSeq(int64_t seq);
  std::vector<int64_t> Seqs() const;
  // Slots of the sequence that hold pages, ascending.
  std::vector<int> HeldSlots(int64_t seq) const;

 private:
  struct SeqPages {
    std::vector<int> slots;                     // held slots, ascending
    std::vector<std::vector<int32_t>> ids;      // [slot] -> page id per block
    std::vector<std::vector<float*>> pointers;  // [slot] -> page per block
    int shared = 0;                             // leading read-only blocks
  };
  float* PageAddress(int64_t index) const {
    return reinterpret_cast<float*>(reinterpret_cast<char*>(base_) + index * page_bytes());
  }

  const int num_layers_, num_kv_heads_, block_size_, head_dim_;
  const DType kv_dtype_;
  const int64_t max_pages_;
  DeviceMemory* const memory_;
  float* base_ = nullptr;
  size_t pool_bytes_ = 0;
  // [page id] -> tables naming it (0: free; more than one only for shared
  // blocks); grows on demand.
  std::vector<int32_t> holders_;
  int64_t used_pages_ = 0;  // pages named by at least one table
  std::unordered_map<int64_t, SeqPages> seqs_;
};

}  // namespace failsafe
