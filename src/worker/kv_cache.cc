#include "worker/kv_cache.h"

#include <sys/mman.h>

#include <algorithm>
#include <new>

#include "common/check.h"

namespace failsafe {

KvCache::KvCache(int num_layers, int num_kv_heads, int block_size, int head_dim, int64_t max_pages)
    : num_layers_(num_layers),
      num_kv_heads_(num_kv_heads),
      block_size_(block_size),
      head_dim_(head_dim),
      max_pages_(max_pages) {
  mapped_bytes_ = static_cast<size_t>(std::max<int64_t>(max_pages_, 1) * page_bytes());
  void* p = ::mmap(nullptr, mapped_bytes_, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  base_ = static_cast<float*>(p);
  free_.reserve(static_cast<size_t>(max_pages_));
  for (int64_t i = max_pages_ - 1; i >= 0; --i) free_.push_back(i);
}

KvCache::~KvCache() { ::munmap(base_, mapped_bytes_); }

Status KvCache::Reserve(int64_t seq, int slot, int num_tokens) {
  const int need = (num_tokens + block_size_ - 1) / block_size_;
  SeqPages& s = seqs_[seq];
  if (s.slots.empty()) s.slots.resize(num_slots());
  auto& pages = s.slots[slot];
  const int missing = need - static_cast<int>(pages.size());
  if (missing <= 0) return Status::Ok();
  if (missing > static_cast<int64_t>(free_.size())) {
    return ResourceExhausted("KV pool exhausted: sequence {} needs {} more pages, {} of {} free",
                             seq, missing, free_.size(), max_pages_);
  }
  for (int i = 0; i < missing; ++i) {
    pages.push_back(PageAddress(free_.back()));
    free_.pop_back();
  }
  return Status::Ok();
}

const float* const* KvCache::Pages(int64_t seq, int slot) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end() || it->second.slots.empty() || it->second.slots[slot].empty())
    return nullptr;
  return it->second.slots[slot].data();
}

float* KvCache::Page(int64_t seq, int slot, int block) {
  auto& pages = seqs_.at(seq).slots.at(slot);
  FS_CHECK(block >= 0 && block < static_cast<int>(pages.size()));
  return pages[block];
}

int KvCache::NumBlocks(int64_t seq, int slot) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end() || it->second.slots.empty()) return 0;
  return static_cast<int>(it->second.slots[slot].size());
}

void KvCache::Truncate(int64_t seq, int num_tokens) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  const size_t keep = static_cast<size_t>((num_tokens + block_size_ - 1) / block_size_);
  for (auto& pages : it->second.slots) {
    while (pages.size() > keep) {
      free_.push_back(PageIndex(pages.back()));
      pages.pop_back();
    }
  }
}

void KvCache::DropSlot(int64_t seq, int slot) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end() || it->second.slots.empty()) return;
  for (float* p : it->second.slots[slot]) free_.push_back(PageIndex(p));
  it->second.slots[slot].clear();
}

void KvCache::FreeSeq(int64_t seq) {
  Truncate(seq, 0);
  seqs_.erase(seq);
}

std::vector<int64_t> KvCache::Seqs() const {
  std::vector<int64_t> out;
  for (auto& [id, _] : seqs_) out.push_back(id);
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<int> KvCache::HeldSlots(int64_t seq) const {
  std::vector<int> out;
  auto it = seqs_.find(seq);
  if (it == seqs_.end() || it->second.slots.empty()) return out;
  for (int s = 0; s < num_slots(); ++s) {
    if (!it->second.slots[s].empty()) out.push_back(s);
  }
  return out;
}

}  // namespace failsafe
