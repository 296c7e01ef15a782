#include "core/kv_blocks.h"

#include <algorithm>

#include "common/check.h"

namespace failsafe {

namespace {

const std::vector<int32_t> kNoPages;

}  // namespace

namespace {

// For each slot of `after` (a sequence's slots on a device under the new
// plan, ascending), the position of the same slot in `before` (under the old
// plan) when the device keeps its KV there; -1 for a slot it gains, whose KV
// it must be given. `had` false: the sequence held nothing on the device, so
// every slot is gained. The one rule for the devices' tables and for the
// counting manager (and so for what the simulator restores).
std::vector<int> KeptColumns(const std::vector<int>& before, const std::vector<int>& after,
                             bool had) {
  std::vector<int> from(after.size(), -1);
  if (!had) return from;
  for (size_t j = 0, i = 0; j < after.size(); ++j) {
    while (i < before.size() && before[i] < after[j]) ++i;
    if (i < before.size() && before[i] == after[j]) from[j] = static_cast<int>(i);
  }
  return from;
}

}  // namespace

KvBlockManager::KvBlockManager(const Plan& plan, int block_size,
                               std::vector<int64_t> capacity_pages, bool page_ids)
    : block_size_(block_size), page_ids_(page_ids) {
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
  pools_.resize(num_devices_);
}

int32_t KvBlockManager::Allocate(int device) {
  Pool& p = pools_[device];
  used_[device]++;
  if (!p.free_ids.empty()) {
    const int32_t id = p.free_ids.back();
    p.free_ids.pop_back();
    return id;
  }
  return p.next_id++;
}

void KvBlockManager::FreePage(int device, int32_t id) {
  pools_[device].free_ids.push_back(id);
  used_[device]--;
  FS_CHECK(used_[device] >= 0);
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
  if (!page_ids_) {
    for (int d : devices_) used_[d] += add * PagesPerBlock(d, s.dp_rank);
    s.kv_blocks += add;
    // Its rank and blocks, for the slots it gains at a plan change.
    SeqTables& t = seqs_[s.id];
    t.dp_rank = s.dp_rank;
    t.blocks = s.kv_blocks;
    return;
  }
  SeqTables& t = seqs_[s.id];
  if (t.pages.empty()) {
    t.dp_rank = s.dp_rank;
    t.pages.resize(num_devices_);
    t.gained.resize(num_devices_);
  }
  FS_CHECK_MSG(t.dp_rank == s.dp_rank && t.blocks == s.kv_blocks,
               "sequence {} changed DP rank or blocks outside the block manager", s.id);
  for (int d : devices_) {
    const int64_t n = add * PagesPerBlock(d, s.dp_rank);
    std::vector<int32_t>& pages = t.pages[d];
    // Ids come in runs: the free list's last ids, then fresh ones. (No exact
    // reserve here: a table grows by a block at a time, and reserving the
    // exact size would copy it whole at every block.)
    Pool& pool = pools_[d];
    int64_t left = n;
    const int64_t reuse = std::min<int64_t>(left, static_cast<int64_t>(pool.free_ids.size()));
    pages.insert(pages.end(), pool.free_ids.end() - reuse, pool.free_ids.end());
    std::reverse(pages.end() - reuse, pages.end());  // last-in first-out, as Allocate
    pool.free_ids.resize(pool.free_ids.size() - reuse);
    left -= reuse;
    for (int64_t i = 0; i < left; ++i) pages.push_back(pool.next_id++);
    used_[d] += n;
  }
  s.kv_blocks += add;
  t.blocks = s.kv_blocks;
}

void KvBlockManager::Release(Sequence& s) {
  auto it = seqs_.find(s.id);
  // Blocks that are cached: the cache keeps their pages.
  std::vector<char> cached;
  if (it != seqs_.end() && !it->second.cached.empty()) {
    const std::vector<int32_t>& c = it->second.cached;
    cached.assign(c.size(), 0);
    // Last block first: a prefix's tail is evicted before its head, which
    // every longer prefix needs.
    for (size_t b = c.size(); b-- > 0;) {
      if (c[b] < 0) continue;
      cached[b] = 1;
      Unref(c[b]);
    }
  }
  if (!page_ids_) {
    int own = s.kv_blocks;
    for (char c : cached) own -= c;
    for (int d : devices_) {
      used_[d] -= own * PagesPerBlock(d, s.dp_rank);
      FS_CHECK(used_[d] >= 0);
    }
    if (it != seqs_.end()) seqs_.erase(it);
    s.kv_blocks = 0;
    return;
  }
  if (it != seqs_.end()) {
    const SeqTables& t = it->second;
    for (int d = 0; d < num_devices_; ++d) {
      const std::vector<int32_t>& pages = t.pages[d];
      if (pages.empty()) continue;
      const size_t cols = pages.size() / std::max(1, t.blocks);
      std::vector<int32_t>& free_ids = pools_[d].free_ids;
      int64_t freed = 0;
      for (int b = 0; b < t.blocks; ++b) {
        if (b < static_cast<int>(cached.size()) && cached[b]) continue;
        free_ids.insert(free_ids.end(), pages.begin() + b * cols, pages.begin() + (b + 1) * cols);
        freed += static_cast<int64_t>(cols);
      }
      used_[d] -= freed;
      FS_CHECK(used_[d] >= 0);
    }
    seqs_.erase(it);
  }
  s.kv_blocks = 0;
}

bool KvBlockManager::OverCapacity() const {
  for (int d : devices_) {
    if (used_[d] > capacity_[d]) return true;
  }
  return false;
}

const std::vector<int32_t>& KvBlockManager::Table(int64_t seq_id, int device) const {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end() || device < 0 || device >= static_cast<int>(it->second.pages.size()))
    return kNoPages;
  return it->second.pages[device];
}

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
    gone.dp_rank = it->second.dp_rank;
    gone.kv_blocks = it->second.blocks;
    ++it;
    Release(gone);
  }
  if (cache_on_) DropUnreferencedCache();
  const std::vector<int> old_active = devices_;
  const std::vector<std::vector<int>> old_tp = tp_slots_, old_rank = rank_slots_;
  auto old_slots = [&](int d, int rank) -> const std::vector<int>& {
    static const std::vector<int> kNone;
    if (!std::binary_search(old_active.begin(), old_active.end(), d)) return kNone;
    return d == rank ? old_rank[d] : old_tp[d];
  };
  // Devices may have come (a rejoin): the pools grow; ids of devices that
  // left are all freed below.
  SetPlan(plan, std::move(capacity_pages));
  // Each cached block goes with its sharers (one DP rank: the caller routed
  // them together). old_rank_of: the rank its slots were taken for.
  std::vector<int> new_rank(entries_.size(), -1), old_rank_of(entries_.size(), -1);
  for (const Sequence* s : live) {
    auto it = seqs_.find(s->id);
    if (it == seqs_.end()) continue;
    for (int32_t id : it->second.cached) {
      if (id < 0) continue;
      FS_CHECK_MSG(new_rank[id] < 0 || CacheRank(new_rank[id]) == CacheRank(s->dp_rank),
                   "sequences sharing cached block {} go to DP ranks {} and {}", id, new_rank[id],
                   s->dp_rank);
      new_rank[id] = s->dp_rank;
      old_rank_of[id] = it->second.dp_rank;
    }
  }
  if (!page_ids_) {
    used_ = PagesUnder(plan, live);
    evictable_.assign(num_devices_, 0);
    for (const Sequence* s : live) {
      SeqTables& t = seqs_[s->id];
      t.gained.assign(num_devices_, {});
      for (int d = 0; d < num_devices_; ++d) {
        const std::vector<int>& before = old_slots(d, t.dp_rank);
        const std::vector<int>& after = Slots(d, s->dp_rank);
        const bool had = t.blocks > 0 && t.blocks == s->kv_blocks && !before.empty();
        const std::vector<int> from = KeptColumns(before, after, had);
        for (size_t j = 0; j < after.size(); ++j) {
          if (from[j] < 0) t.gained[d].push_back(after[j]);
        }
      }
      t.dp_rank = s->dp_rank;
      t.blocks = s->kv_blocks;
      t.shared = LeadingCached(t);
    }
    RekeyCache(new_rank);
    return;
  }
  // Which old column (slot position) each new column keeps, -1: gained.
  // First free the columns nobody keeps, then hand out the gained ones, so
  // that ids stay low. A cached block's pages move once (as a table of one
  // block), every table naming it takes its new row.
  struct Move {
    std::vector<int32_t>* pages;  // [block][old column]
    int blocks;
    int device;
    std::vector<int> from;  // [new slot position] -> old position or -1
    std::vector<int> after;
    const std::vector<int32_t>* cached;  // a sequence's cached blocks (their rows are not its)
  };
  auto plan_move = [&](std::vector<int32_t>* pages, int blocks, int d,
                       const std::vector<int>& before, const std::vector<int>& after,
                       const std::vector<int32_t>* cached) {
    const bool had = !pages->empty() && !before.empty() &&
                     pages->size() == before.size() * static_cast<size_t>(blocks);
    Move m{pages, blocks, d, KeptColumns(before, after, had), after, cached};
    std::vector<char> kept(before.size(), 0);
    for (int f : m.from) {
      if (f >= 0) kept[f] = 1;
    }
    for (size_t i = 0; i < pages->size(); ++i) {
      const size_t b = before.empty() ? 0 : i / before.size();
      if (cached && b < cached->size() && (*cached)[b] >= 0) continue;  // the cached block's
      if (!had || !kept[i % before.size()]) FreePage(d, (*pages)[i]);
    }
    if (!had) pages->clear();
    return m;
  };
  std::vector<Move> entry_moves, seq_moves;
  for (size_t id = 0; id < entries_.size(); ++id) {
    CachedBlock& e = entries_[id];
    if (!e.live) continue;
    FS_CHECK_MSG(new_rank[id] >= 0, "cached block {} is named by no live sequence", id);
    e.pages.resize(num_devices_);
    for (int d = 0; d < num_devices_; ++d) {
      entry_moves.push_back(plan_move(&e.pages[d], 1, d, old_slots(d, old_rank_of[id]),
                                      Slots(d, new_rank[id]), nullptr));
    }
  }
  for (const Sequence* s : live) {
    SeqTables& t = seqs_[s->id];
    if (t.pages.empty()) t.dp_rank = s->dp_rank;
    t.pages.resize(num_devices_);
    t.gained.assign(num_devices_, {});
    t.blocks = s->kv_blocks;
    t.sent = t.blocks;
    for (int d = 0; d < num_devices_; ++d) {
      seq_moves.push_back(plan_move(&t.pages[d], t.blocks, d, old_slots(d, t.dp_rank),
                                    Slots(d, s->dp_rank), &t.cached));
      for (size_t j = 0; j < seq_moves.back().after.size(); ++j) {
        if (seq_moves.back().from[j] < 0) t.gained[d].push_back(seq_moves.back().after[j]);
      }
    }
    t.dp_rank = s->dp_rank;
    t.shared = LeadingCached(t);
  }
  auto apply = [&](Move& m) {
    const size_t cols = m.from.size();
    const size_t old_cols = m.pages->empty() ? 0 : m.pages->size() / m.blocks;
    std::vector<int32_t> pages(cols * m.blocks);
    for (int b = 0; b < m.blocks; ++b) {
      if (m.cached && b < static_cast<int>(m.cached->size()) && (*m.cached)[b] >= 0) {
        const std::vector<int32_t>& row = entries_[(*m.cached)[b]].pages[m.device];
        FS_CHECK(row.size() == cols);
        std::copy(row.begin(), row.end(), pages.begin() + b * cols);
        continue;
      }
      for (size_t j = 0; j < cols; ++j) {
        pages[b * cols + j] =
            m.from[j] >= 0 ? (*m.pages)[b * old_cols + m.from[j]] : Allocate(m.device);
      }
    }
    *m.pages = std::move(pages);
  };
  for (Move& m : entry_moves) apply(m);
  for (Move& m : seq_moves) apply(m);
  RekeyCache(new_rank);
  // Devices without a share hold nothing: their ids start afresh.
  for (int d = 0; d < num_devices_; ++d) {
    if (!plan.IsActive(d)) {
      FS_CHECK(used_[d] == 0);
      pools_[d] = Pool();
    }
  }
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
  if (cache_on_) FS_RETURN_IF_ERROR(CheckCache());
  if (!page_ids_) {
    for (int d = 0; d < num_devices_; ++d) {
      if (used_[d] < 0) return Internal("device {}: {} pages counted", d, used_[d]);
    }
    return Status::Ok();
  }
  for (int d = 0; d < num_devices_; ++d) {
    const Pool& p = pools_[d];
    std::vector<char> owned(static_cast<size_t>(p.next_id), 0);
    int64_t n = 0;
    auto own = [&](int32_t page) -> Status {
      if (page < 0 || page >= p.next_id)
        return Internal("device {}: page {} was never handed out", d, page);
      if (owned[page]++) return Internal("device {}: page {} is owned twice", d, page);
      ++n;
      return Status::Ok();
    };
    for (const auto& [id, t] : seqs_) {
      const std::vector<int32_t>& pages = t.pages[d];
      const size_t cols = Slots(d, t.dp_rank).size();
      if (pages.size() != cols * static_cast<size_t>(t.blocks))
        return Internal("device {}: sequence {} has {} pages for {} blocks", d, id, pages.size(),
                        t.blocks);
      for (size_t i = 0; i < pages.size(); ++i) {
        const size_t b = i / cols;
        if (b < t.cached.size() && t.cached[b] >= 0) {
          // Names a cached block's page: that block owns it.
          const std::vector<int32_t>& row = entries_[t.cached[b]].pages[d];
          if (row.size() != cols || row[i % cols] != pages[i])
            return Internal("device {}: sequence {} block {} does not name its cached pages", d, id,
                            b);
          continue;
        }
        FS_RETURN_IF_ERROR(own(pages[i]));
      }
    }
    for (const CachedBlock& e : entries_) {
      if (!e.live) continue;
      for (int32_t page : e.pages[d]) FS_RETURN_IF_ERROR(own(page));
    }
    for (int32_t page : p.free_ids) {
      if (page < 0 || page >= p.next_id || owned[page])
        return Internal("device {}: free page {} is in use or unknown", d, page);
      owned[page] = 1;
    }
    if (n != used_[d]) return Internal("device {}: {} pages owned, {} counted", d, n, used_[d]);
    if (n + static_cast<int64_t>(p.free_ids.size()) != p.next_id)
      return Internal("device {}: {} used + {} free != {} handed out", d, n, p.free_ids.size(),
                      p.next_id);
  }
  return Status::Ok();
}

}  // namespace failsafe
