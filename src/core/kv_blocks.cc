#include "core/kv_blocks.h"

#include <algorithm>

#include "common/check.h"

namespace failsafe {

namespace {

const std::vector<int32_t> kNoPages;

}  // namespace

std::vector<int> KvBlockManager::KeptColumns(const std::vector<int>& before,
                                             const std::vector<int>& after, bool had) {
  std::vector<int> from(after.size(), -1);
  if (!had) return from;
  for (size_t j = 0, i = 0; j < after.size(); ++j) {
    while (i < before.size() && before[i] < after[j]) ++i;
    if (i < before.size() && before[i] == after[j]) from[j] = static_cast<int>(i);
  }
  return from;
}

const std::vector<int>& KvBlockManager::OldSlots::Of(int device, int dp_rank) const {
  static const std::vector<int> kNone;
  if (!std::binary_search(active.begin(), active.end(), device)) return kNone;
  return device == dp_rank ? rank[device] : tp[device];
}

KvBlockManager::KvBlockManager(const Plan& plan, int block_size,
                               std::vector<int64_t> capacity_pages)
    : block_size_(block_size) {
  SetPlan(plan, std::move(capacity_pages));
}

void KvBlockManager::SetPlan(const Plan& plan, std::vector<int64_t> capacity_pages) {
  num_devices_ = plan.num_devices;
  devices_ = plan.active;
  tp_slots_.assign(num_devices_, {});
  rank_slots_.assign(num_devices_, {});
  // A DP rank no device is: the TP slots only.
  for (int d : plan.active) {
    tp_slots_[d] = plan.KvSlots(d, -1);
    rank_slots_[d] = plan.KvSlots(d, d);
  }
  dp_extra_ = plan.num_dp_heads_total();
  capacity_ = std::move(capacity_pages);
  capacity_.resize(num_devices_, 0);
  used_.resize(num_devices_, 0);
  evictable_.resize(num_devices_, 0);
}

bool KvBlockManager::CanGrow(const Sequence& s, int tokens, int64_t keep_free) const {
  const int add = BlocksFor(tokens) - s.kv_blocks;
  if (add <= 0) return true;
  for (int d : devices_) {
    if (held(d) + add * PagesPerBlock(d, s.dp_rank) + keep_free > capacity_[d]) return false;
  }
  return true;
}

bool KvBlockManager::Fits(int dp_rank, int blocks, int tokens, const std::vector<int64_t>& pending,
                          const std::vector<int64_t>& keep_free) const {
  const int add = BlocksFor(tokens) - blocks;
  if (add <= 0) return true;
  for (int d : devices_) {
    if (held(d) + pending[d] + add * PagesPerBlock(d, dp_rank) + keep_free[d] > capacity_[d])
      return false;
  }
  return true;
}

void KvBlockManager::AddPending(int dp_rank, int blocks, int tokens,
                                std::vector<int64_t>* pending) const {
  const int add = BlocksFor(tokens) - blocks;
  if (add <= 0) return;
  for (int d : devices_) (*pending)[d] += add * PagesPerBlock(d, dp_rank);
}

bool KvBlockManager::FitsAlone(int dp_rank, int tokens) const {
  for (int d : devices_) {
    if (BlocksFor(tokens) * PagesPerBlock(d, dp_rank) > capacity_[d]) return false;
  }
  return true;
}

void KvBlockManager::Grow(Sequence& s, int tokens) {
  const int add = BlocksFor(tokens) - s.kv_blocks;
  if (add <= 0) return;
  if (cache_on_) {
    // Unreferenced cached blocks give way when the unused pages run out.
    std::vector<int64_t> need(num_devices_, 0);
    for (int d : devices_) need[d] = add * PagesPerBlock(d, s.dp_rank);
    EvictFor(need);
  }
  auto [it, fresh] = seqs_.try_emplace(s.id);
  SeqTables& t = it->second;
  if (fresh) t.dp_rank = s.dp_rank;
  FS_CHECK_MSG(t.dp_rank == s.dp_rank && t.blocks == s.kv_blocks,
               "sequence {} changed DP rank or blocks outside the block manager", s.id);
  for (int d : devices_) used_[d] += add * PagesPerBlock(d, s.dp_rank);
  OnGrow(s.id, t, add);
  s.kv_blocks += add;
  t.blocks = s.kv_blocks;
}

void KvBlockManager::Release(Sequence& s) {
  auto it = seqs_.find(s.id);
  if (it == seqs_.end()) {
    s.kv_blocks = 0;
    return;
  }
  const SeqTables& t = it->second;
  // Blocks that are cached: the cache keeps their pages.
  std::vector<char> cached(t.cached.size(), 0);
  int own = t.blocks;
  // Last block first: a prefix's tail is evicted before its head, which
  // every longer prefix needs.
  for (size_t b = t.cached.size(); b-- > 0;) {
    if (t.cached[b] < 0) continue;
    cached[b] = 1;
    --own;
    Unref(t.cached[b]);
  }
  for (int d : devices_) {
    used_[d] -= own * PagesPerBlock(d, t.dp_rank);
    FS_CHECK(used_[d] >= 0);
  }
  OnRelease(s.id, t, cached);
  seqs_.erase(it);
  s.kv_blocks = 0;
}

bool KvBlockManager::OverCapacity() const {
  for (int d : devices_) {
    if (used_[d] > capacity_[d]) return true;
  }
  return false;
}

const std::vector<int32_t>& KvBlockManager::Table(int64_t, int) const { return kNoPages; }

int KvBlockManager::TakeUnsent(int64_t seq_id) {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) return 0;
  const int first = it->second.sent;
  it->second.sent = it->second.blocks;
  return first;
}

void KvBlockManager::MarkUnsent(int64_t seq_id) {
  auto it = seqs_.find(seq_id);
  if (it != seqs_.end()) it->second.sent = 0;
}

std::vector<int64_t> KvBlockManager::PagesUnder(const Plan& plan,
                                                const std::vector<const Sequence*>& seqs) const {
  std::vector<int64_t> out(plan.num_devices, 0);
  const int64_t dp = plan.num_dp_heads_total();
  std::vector<char> seen(cache_on_ ? entries_.size() : 0, 0);
  for (const Sequence* s : seqs) {
    int64_t blocks = s->kv_blocks;
    if (cache_on_) {
      auto it = seqs_.find(s->id);
      if (it != seqs_.end()) {
        for (int32_t id : it->second.cached) {
          if (id < 0) continue;
          if (seen[id]) --blocks;  // counted with its first sharer
          seen[id] = 1;
        }
      }
    }
    for (int d : plan.active)
      out[d] += blocks * (plan.num_tp_heads_total(d) + (s->dp_rank == d ? dp : 0));
  }
  return out;
}

void KvBlockManager::Reconfigure(const Plan& plan, std::vector<int64_t> capacity_pages,
                                 const std::vector<const Sequence*>& live) {
  std::unordered_map<int64_t, const Sequence*> keep;
  for (const Sequence* s : live) keep[s->id] = s;
  // Under the old plan: sequences that do not go on give their pages back
  // and let go of their cached blocks, and cached blocks nobody names go.
  for (auto it = seqs_.begin(); it != seqs_.end();) {
    if (keep.count(it->first)) {
      ++it;
      continue;
    }
    Sequence gone;
    gone.id = it->first;
    ++it;
    Release(gone);
  }
  if (cache_on_) DropUnreferencedCache();
  const OldSlots old{devices_, tp_slots_, rank_slots_};
  // Devices may have come (a rejoin) or gone.
  SetPlan(plan, std::move(capacity_pages));
  // Each cached block goes with its sharers (one DP rank: the caller routed
  // them together). old_rank: the rank its slots were taken for.
  std::vector<int> new_rank(entries_.size(), -1), old_rank(entries_.size(), -1);
  for (const Sequence* s : live) {
    auto it = seqs_.find(s->id);
    if (it == seqs_.end()) continue;
    for (int32_t id : it->second.cached) {
      if (id < 0) continue;
      FS_CHECK_MSG(new_rank[id] < 0 || CacheRank(new_rank[id]) == CacheRank(s->dp_rank),
                   "sequences sharing cached block {} go to DP ranks {} and {}", id, new_rank[id],
                   s->dp_rank);
      new_rank[id] = s->dp_rank;
      old_rank[id] = it->second.dp_rank;
    }
  }
  OnReplan(plan, old, live, new_rank, old_rank);
  for (const Sequence* s : live) {
    SeqTables& t = seqs_[s->id];
    if (t.blocks == 0 && t.cached.empty()) t.dp_rank = s->dp_rank;
    t.gained.assign(num_devices_, {});
    for (int d = 0; d < num_devices_; ++d) {
      const std::vector<int>& before = old.Of(d, t.dp_rank);
      const std::vector<int>& after = Slots(d, s->dp_rank);
      const std::vector<int> from = KeptColumns(before, after, Keeps(t, *s, before));
      for (size_t j = 0; j < after.size(); ++j) {
        if (from[j] < 0) t.gained[d].push_back(after[j]);
      }
    }
    t.dp_rank = s->dp_rank;
    t.blocks = s->kv_blocks;
    t.sent = t.blocks;
    t.shared = LeadingCached(t);
  }
  RekeyCache(new_rank);
  used_ = PagesUnder(plan, live);
  evictable_.assign(num_devices_, 0);
}

int KvBlockManager::LeadingCached(const SeqTables& t) {
  int n = 0;
  while (n < static_cast<int>(t.cached.size()) && t.cached[n] >= 0) ++n;
  return n;
}

void KvBlockManager::RekeyCache(const std::vector<int>& new_rank) {
  if (!cache_on_) return;
  index_.clear();
  for (size_t id = 0; id < entries_.size(); ++id) {
    CachedBlock& e = entries_[id];
    if (!e.live) continue;
    e.dp_rank = CacheRank(new_rank[id]);
    e.indexed = index_.emplace(CacheKey(e.hash, e.dp_rank), static_cast<int32_t>(id)).second;
  }
}

std::vector<int> KvBlockManager::GainedSlots(int64_t seq_id, int device) const {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end() || device < 0 || device >= static_cast<int>(it->second.gained.size()))
    return {};
  return it->second.gained[device];
}

Status KvBlockManager::CheckInvariants() const {
  if (cache_on_) return CheckCache();
  std::vector<int64_t> own(num_devices_, 0);
  for (const auto& [id, t] : seqs_) {
    for (int d : devices_) own[d] += t.blocks * PagesPerBlock(d, t.dp_rank);
  }
  for (int d = 0; d < num_devices_; ++d) {
    if (used_[d] != own[d])
      return Internal("device {}: {} pages counted, the sequences hold {}", d, used_[d], own[d]);
    if (evictable_[d] != 0) return Internal("device {}: {} evictable pages", d, evictable_[d]);
  }
  return Status::Ok();
}

}  // namespace failsafe
