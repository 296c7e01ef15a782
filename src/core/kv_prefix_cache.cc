// The block manager's prefix cache (core/kv_blocks.h): chained block hashes,
// cached blocks with reference counts, LRU eviction of unreferenced ones.
#include <algorithm>
#include <cstring>
#include <string_view>

#include "common/check.h"
#include "core/kv_blocks.h"

namespace failsafe {

namespace {

uint64_t Mix(uint64_t x) {
  // splitmix64's finaliser: spreads the DP rank over the key.
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// The hash of one block given the hash of the blocks before it.
uint64_t ChainHash(uint64_t parent, std::span<const int32_t> block) {
  std::string bytes(sizeof(parent) + block.size_bytes(), '\0');
  std::memcpy(bytes.data(), &parent, sizeof(parent));
  std::memcpy(bytes.data() + sizeof(parent), block.data(), block.size_bytes());
  return std::hash<std::string_view>()(bytes);
}

}  // namespace

void KvBlockManager::EnablePrefixCache(uint64_t seed) {
  cache_on_ = true;
  seed_ = seed;
}

uint64_t KvBlockManager::CacheKey(uint64_t hash, int cache_rank) const {
  return cache_rank < 0 ? hash : hash ^ Mix(static_cast<uint64_t>(cache_rank) + 1);
}

int64_t KvBlockManager::EntryPages(const CachedBlock& e, int device) const {
  return PagesPerBlock(device, e.dp_rank);
}

std::vector<uint64_t> KvBlockManager::BlockHashes(std::span<const int32_t> tokens,
                                                  int max_blocks) const {
  std::vector<uint64_t> out;
  const int full = std::min(max_blocks, static_cast<int>(tokens.size()) / block_size_);
  out.reserve(std::max(0, full));
  uint64_t h = seed_;
  for (int b = 0; b < full; ++b) {
    h = ChainHash(h, tokens.subspan(static_cast<size_t>(b) * block_size_, block_size_));
    out.push_back(h);
  }
  return out;
}

int KvBlockManager::CachedPrefix(std::span<const int32_t> tokens, std::span<const uint64_t> hashes,
                                 int dp_rank) const {
  if (!cache_on_) return 0;
  const int rank = CacheRank(dp_rank);
  int b = 0;
  for (; b < static_cast<int>(hashes.size()); ++b) {
    auto it = index_.find(CacheKey(hashes[b], rank));
    if (it == index_.end()) break;
    const CachedBlock& e = entries_[it->second];
    // The hash names the block; the tokens and the chain confirm it.
    const std::span<const int32_t> block =
        tokens.subspan(static_cast<size_t>(b) * block_size_, block_size_);
    if (e.hash != hashes[b] || e.dp_rank != rank || e.parent != (b ? hashes[b - 1] : seed_) ||
        !std::equal(block.begin(), block.end(), e.tokens.begin(), e.tokens.end()))
      break;
  }
  return b;
}

int KvBlockManager::AttachPrefix(Sequence& s, std::span<const uint64_t> hashes, int blocks,
                                 const std::vector<int64_t>& pending) {
  FS_CHECK(cache_on_ && s.kv_blocks == 0 && s.dp_rank >= 0);
  const int rank = CacheRank(s.dp_rank);
  // Unreferenced blocks it takes stop counting as free: they must fit.
  std::vector<int64_t> revive(num_devices_, 0);
  std::vector<int32_t> ids;
  for (int b = 0; b < blocks; ++b) {
    const int32_t id = index_.at(CacheKey(hashes[b], rank));
    const CachedBlock& e = entries_[id];
    bool fits = true;
    if (e.refs == 0) {
      for (int d : devices_) {
        fits &= held(d) + pending[d] + revive[d] + EntryPages(e, d) <= capacity_[d];
      }
      if (!fits) break;
      for (int d : devices_) revive[d] += EntryPages(e, d);
    }
    ids.push_back(id);
  }
  if (ids.empty()) return 0;
  SeqTables& t = seqs_[s.id];
  t.dp_rank = s.dp_rank;
  for (size_t b = 0; b < ids.size(); ++b) {
    CachedBlock& e = entries_[ids[b]];
    if (e.refs++ == 0) {
      lru_.erase(e.lru);
      for (int d : devices_) evictable_[d] -= EntryPages(e, d);
    }
    t.cached.push_back(ids[b]);
    t.hashes.push_back(hashes[b]);
  }
  OnAttach(s.id, ids);
  t.blocks = static_cast<int>(ids.size());
  t.shared = t.blocks;
  t.sent = 0;
  s.kv_blocks = t.blocks;
  return t.blocks;
}

void KvBlockManager::CacheComputed(const Sequence& s) {
  if (!cache_on_) return;
  auto it = seqs_.find(s.id);
  if (it == seqs_.end()) return;
  SeqTables& t = it->second;
  const int full = std::min(s.num_computed, s.len()) / block_size_;
  const int upto = std::min(full, t.blocks);
  const std::span<const int32_t> tokens(s.tokens);
  const int rank = CacheRank(t.dp_rank);
  for (int b = static_cast<int>(t.hashes.size()); b < upto; ++b) {
    const uint64_t parent = b ? t.hashes[b - 1] : seed_;
    const std::span<const int32_t> block =
        tokens.subspan(static_cast<size_t>(b) * block_size_, block_size_);
    const uint64_t h = ChainHash(parent, block);
    t.hashes.push_back(h);
    const uint64_t key = CacheKey(h, rank);
    if (index_.count(key)) {
      t.cached.push_back(-1);  // computed side by side with another sequence: stays its own
      continue;
    }
    int32_t id;
    if (!free_entries_.empty()) {
      id = free_entries_.back();
      free_entries_.pop_back();
    } else {
      id = static_cast<int32_t>(entries_.size());
      entries_.emplace_back();
    }
    CachedBlock& e = entries_[id];
    e.hash = h;
    e.parent = parent;
    e.dp_rank = rank;
    e.refs = 1;
    e.live = true;
    e.tokens.assign(block.begin(), block.end());
    OnCacheBlock(id, s.id, t, b);
    index_[key] = id;
    t.cached.push_back(id);
  }
}

int KvBlockManager::SharedBlocks(int64_t seq_id) const {
  auto it = seqs_.find(seq_id);
  return it == seqs_.end() ? 0 : it->second.shared;
}

std::span<const uint64_t> KvBlockManager::Hashes(int64_t seq_id) const {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) return {};
  return it->second.hashes;
}

void KvBlockManager::Unref(int32_t id) {
  CachedBlock& e = entries_[id];
  FS_CHECK(e.live && e.refs > 0);
  if (--e.refs > 0) return;
  e.lru = lru_.insert(lru_.end(), id);
  for (int d : devices_) evictable_[d] += EntryPages(e, d);
  if (!e.indexed) FreeEntry(id);  // no one can hit it: freed at once
}

void KvBlockManager::FreeEntry(int32_t id) {
  CachedBlock& e = entries_[id];
  FS_CHECK(e.live && e.refs == 0);
  lru_.erase(e.lru);
  for (int d : devices_) {
    const int64_t n = EntryPages(e, d);
    used_[d] -= n;
    evictable_[d] -= n;
  }
  OnEntryGone(id, /*free=*/true);
  if (e.indexed) index_.erase(CacheKey(e.hash, e.dp_rank));
  e = CachedBlock();
  free_entries_.push_back(id);
}

void KvBlockManager::EvictFor(const std::vector<int64_t>& need) {
  for (;;) {
    bool short_of = false;
    for (int d : devices_) short_of |= capacity_[d] - used_[d] < need[d];
    if (!short_of) return;
    // The caller checked the growth against the pages held, evictable ones
    // counted as free: evicting them all makes room.
    FS_CHECK_MSG(!lru_.empty(), "no cached block left to evict");
    FreeEntry(lru_.front());
    ++evicted_blocks_;
  }
}

void KvBlockManager::DropUnreferencedCache() {
  while (!lru_.empty()) FreeEntry(lru_.front());
}

std::span<const int32_t> KvBlockManager::CachedIds(int64_t seq_id) const {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) return {};
  return it->second.cached;
}

void KvBlockManager::OwnFrom(int64_t seq_id, int block) {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end() || !cache_on_) return;
  SeqTables& t = it->second;
  block = std::max(0, block);
  if (block >= static_cast<int>(t.cached.size())) return;
  for (size_t b = block; b < t.cached.size(); ++b) {
    const int32_t id = t.cached[b];
    if (id < 0) continue;
    CachedBlock& e = entries_[id];
    FS_CHECK_MSG(e.live && e.refs == 1, "sequence {} takes over cached block {} that {} name",
                 seq_id, b, e.refs);
    // Its pages (counted as used already) are the sequence's from now on.
    if (e.indexed) index_.erase(CacheKey(e.hash, e.dp_rank));
    OnEntryGone(id, /*free=*/false);
    e = CachedBlock();
    free_entries_.push_back(id);
  }
  t.cached.resize(block);
  t.hashes.resize(block);
  t.shared = std::min(t.shared, block);
}

Status KvBlockManager::CheckCache() const {
  std::vector<int> refs(entries_.size(), 0);
  std::vector<int64_t> own(num_devices_, 0);
  for (const auto& [id, t] : seqs_) {
    if (t.cached.size() != t.hashes.size() || t.shared > static_cast<int>(t.cached.size()) ||
        static_cast<int>(t.cached.size()) > t.blocks)
      return Internal("sequence {}: {} blocks, {} hashed, {} shared", id, t.blocks, t.hashes.size(),
                      t.shared);
    int own_blocks = t.blocks;
    for (size_t b = 0; b < t.cached.size(); ++b) {
      const int32_t e = t.cached[b];
      if (e < 0) {
        if (static_cast<int>(b) < t.shared)
          return Internal("sequence {}: shared block {} is not cached", id, b);
        continue;
      }
      if (e >= static_cast<int32_t>(entries_.size()) || !entries_[e].live ||
          entries_[e].hash != t.hashes[b])
        return Internal("sequence {}: block {} names a wrong cached block", id, b);
      ++refs[e];
      --own_blocks;
    }
    for (int d : devices_) own[d] += own_blocks * PagesPerBlock(d, t.dp_rank);
  }
  std::vector<int64_t> evictable(num_devices_, 0), cached(num_devices_, 0);
  size_t live = 0, unreferenced = 0, unindexed = 0;
  for (size_t i = 0; i < entries_.size(); ++i) {
    const CachedBlock& e = entries_[i];
    if (!e.live) continue;
    ++live;
    if (e.refs != refs[i])
      return Internal("cached block {}: {} references counted, {} tables name it", i, e.refs,
                      refs[i]);
    auto it = index_.find(CacheKey(e.hash, e.dp_rank));
    if (e.indexed && (it == index_.end() || it->second != static_cast<int32_t>(i)))
      return Internal("cached block {} is not indexed by its hash", i);
    if (!e.indexed) {
      if (e.refs == 0) return Internal("cached block {} is neither indexed nor named", i);
      ++unindexed;
    }
    for (int d : devices_) {
      cached[d] += EntryPages(e, d);
      if (e.refs == 0) evictable[d] += EntryPages(e, d);
    }
    unreferenced += e.refs == 0;
  }
  if (live != index_.size() + unindexed || unreferenced != lru_.size())
    return Internal("{} cached blocks, {} indexed, {} unreferenced, {} in the LRU list", live,
                    index_.size(), unreferenced, lru_.size());
  for (int32_t id : lru_) {
    if (!entries_[id].live || entries_[id].refs != 0)
      return Internal("cached block {} in the LRU list is referenced", id);
  }
  for (int d : devices_) {
    if (evictable[d] != evictable_[d])
      return Internal("device {}: {} evictable pages counted, {} cached unreferenced", d,
                      evictable_[d], evictable[d]);
    if (own[d] + cached[d] != used_[d])
      return Internal("device {}: {} pages used, {} own + {} cached", d, used_[d], own[d],
                      cached[d]);
    if (used_[d] > capacity_[d])
      return Internal("device {}: {} pages used of {}", d, used_[d], capacity_[d]);
  }
  return Status::Ok();
}

}  // namespace failsafe
