// PagedKvBlockManager (core/kv_blocks.h): the page ids behind the books.
#include <algorithm>

#include "common/check.h"
#include "core/kv_blocks.h"

namespace failsafe {

namespace {

const std::vector<int32_t> kNoPages;

}  // namespace

PagedKvBlockManager::Pool& PagedKvBlockManager::PoolOf(int device) {
  if (pools_.size() < static_cast<size_t>(num_devices_)) pools_.resize(num_devices_);
  return pools_[device];
}

void PagedKvBlockManager::FreeIds(int device, std::span<const int32_t> ids) {
  std::vector<int32_t>& free_ids = PoolOf(device).free_ids;
  free_ids.insert(free_ids.end(), ids.begin(), ids.end());
}

const std::vector<int32_t>& PagedKvBlockManager::Table(int64_t seq_id, int device) const {
  auto it = tables_.find(seq_id);
  if (it == tables_.end() || device < 0 || device >= static_cast<int>(it->second.size()))
    return kNoPages;
  return it->second[device];
}

void PagedKvBlockManager::OnGrow(int64_t seq_id, const SeqTables& t, int add) {
  Tables& tables = tables_[seq_id];
  if (tables.size() < static_cast<size_t>(num_devices_)) tables.resize(num_devices_);
  for (int d : devices_) {
    const int64_t n = add * PagesPerBlock(d, t.dp_rank);
    std::vector<int32_t>& pages = tables[d];
    // Ids come in runs: the free list's last ids, then fresh ones. (No exact
    // reserve here: a table grows by a block at a time, and reserving the
    // exact size would copy it whole at every block.)
    Pool& pool = PoolOf(d);
    const int64_t reuse = std::min<int64_t>(n, static_cast<int64_t>(pool.free_ids.size()));
    pages.insert(pages.end(), pool.free_ids.end() - reuse, pool.free_ids.end());
    std::reverse(pages.end() - reuse, pages.end());  // last-in first-out
    pool.free_ids.resize(pool.free_ids.size() - reuse);
    for (int64_t i = reuse; i < n; ++i) pages.push_back(pool.next_id++);
  }
}

void PagedKvBlockManager::OnRelease(int64_t seq_id, const SeqTables& t,
                                    const std::vector<char>& cached) {
  auto it = tables_.find(seq_id);
  if (it == tables_.end()) return;
  const Tables& tables = it->second;
  for (int d = 0; d < static_cast<int>(tables.size()); ++d) {
    const std::vector<int32_t>& pages = tables[d];
    if (pages.empty()) continue;
    const size_t cols = pages.size() / std::max(1, t.blocks);
    for (int b = 0; b < t.blocks; ++b) {
      if (b < static_cast<int>(cached.size()) && cached[b]) continue;  // the cache's
      FreeIds(d, std::span(pages).subspan(b * cols, cols));
    }
  }
  tables_.erase(it);
}

void PagedKvBlockManager::OnAttach(int64_t seq_id, std::span<const int32_t> ids) {
  Tables& tables = tables_[seq_id];
  tables.assign(num_devices_, {});
  for (int32_t id : ids) {
    for (int d : devices_) {
      const std::vector<int32_t>& row = entry_pages_[id][d];
      tables[d].insert(tables[d].end(), row.begin(), row.end());
    }
  }
}

void PagedKvBlockManager::OnCacheBlock(int32_t id, int64_t seq_id, const SeqTables& t, int block) {
  if (entry_pages_.size() <= static_cast<size_t>(id)) entry_pages_.resize(id + 1);
  Tables& rows = entry_pages_[id];
  rows.assign(num_devices_, {});
  const Tables& tables = tables_.at(seq_id);
  for (int d : devices_) {
    const size_t cols = Slots(d, t.dp_rank).size();
    const auto row = tables[d].begin() + block * cols;
    rows[d].assign(row, row + cols);
  }
}

void PagedKvBlockManager::OnEntryGone(int32_t id, bool free) {
  Tables& rows = entry_pages_[id];
  if (free) {
    for (int d = 0; d < static_cast<int>(rows.size()); ++d) FreeIds(d, rows[d]);
  }
  rows.clear();
}

void PagedKvBlockManager::OnReplan(const Plan& plan, const OldSlots& old,
                                   const std::vector<const Sequence*>& live,
                                   const std::vector<int>& new_rank,
                                   const std::vector<int>& old_rank) {
  // Which old column (slot position) each new column keeps (KeptColumns),
  // -1: gained. First free the columns nobody keeps, then hand out the
  // gained ones, so that ids stay low. A cached block's pages move once (as
  // a table of one block), every table naming it takes its new row.
  struct Move {
    std::vector<int32_t>* pages;  // [block][old column]
    int old_blocks, blocks;
    int device;
    std::vector<int> from;               // [new slot position] -> old position or -1
    const std::vector<int32_t>* cached;  // a sequence's cached blocks (their rows are not its)
  };
  auto plan_move = [&](std::vector<int32_t>* pages, int old_blocks, int blocks, int d,
                       const std::vector<int>& before, const std::vector<int>& after, bool had,
                       const std::vector<int32_t>* cached) {
    FS_CHECK_MSG(!had || pages->size() == before.size() * static_cast<size_t>(old_blocks),
                 "device {}: a table of {} pages for {} blocks of {} slots", d, pages->size(),
                 old_blocks, before.size());
    Move m{pages, old_blocks, blocks, d, KeptColumns(before, after, had), cached};
    std::vector<char> kept(before.size(), 0);
    for (int f : m.from) {
      if (f >= 0) kept[f] = 1;
    }
    const size_t cols = old_blocks > 0 ? pages->size() / old_blocks : 0;
    for (size_t i = 0; cols > 0 && i < pages->size(); ++i) {
      const size_t b = i / cols;
      if (cached && b < cached->size() && (*cached)[b] >= 0) continue;  // the cached block's
      if (!had || !kept[i % cols]) FreeIds(d, std::span(*pages).subspan(i, 1));
    }
    if (!had) pages->clear();
    return m;
  };
  std::vector<Move> entry_moves, seq_moves;
  for (size_t id = 0; id < entries_.size(); ++id) {
    if (!entries_[id].live) continue;
    FS_CHECK_MSG(new_rank[id] >= 0, "cached block {} is named by no live sequence", id);
    Tables& rows = entry_pages_[id];
    rows.resize(num_devices_);
    for (int d = 0; d < num_devices_; ++d) {
      const std::vector<int>& before = old.Of(d, old_rank[id]);
      const bool had = !before.empty() && rows[d].size() == before.size();
      entry_moves.push_back(
          plan_move(&rows[d], 1, 1, d, before, Slots(d, new_rank[id]), had, nullptr));
    }
  }
  for (const Sequence* s : live) {
    const SeqTables& t = seqs_[s->id];
    Tables& tables = tables_[s->id];
    tables.resize(num_devices_);
    const int rank = t.blocks == 0 && t.cached.empty() ? s->dp_rank : t.dp_rank;
    for (int d = 0; d < num_devices_; ++d) {
      const std::vector<int>& before = old.Of(d, rank);
      seq_moves.push_back(plan_move(&tables[d], t.blocks, s->kv_blocks, d, before,
                                    Slots(d, s->dp_rank), Keeps(t, *s, before), &t.cached));
    }
  }
  auto apply = [&](Move& m) {
    const size_t cols = m.from.size();
    const size_t old_cols = m.pages->empty() ? 0 : m.pages->size() / m.old_blocks;
    std::vector<int32_t> pages(cols * m.blocks);
    Pool& pool = PoolOf(m.device);
    for (int b = 0; b < m.blocks; ++b) {
      if (m.cached && b < static_cast<int>(m.cached->size()) && (*m.cached)[b] >= 0) {
        const std::vector<int32_t>& row = entry_pages_[(*m.cached)[b]][m.device];
        FS_CHECK(row.size() == cols);
        std::copy(row.begin(), row.end(), pages.begin() + b * cols);
        continue;
      }
      for (size_t j = 0; j < cols; ++j) {
        int32_t& page = pages[b * cols + j];
        if (m.from[j] >= 0) {
          page = (*m.pages)[b * old_cols + m.from[j]];
        } else if (!pool.free_ids.empty()) {
          page = pool.free_ids.back();
          pool.free_ids.pop_back();
        } else {
          page = pool.next_id++;
        }
      }
    }
    *m.pages = std::move(pages);
  };
  for (Move& m : entry_moves) apply(m);
  for (Move& m : seq_moves) apply(m);
  // Devices without a share hold nothing: their ids start afresh.
  for (int d = 0; d < num_devices_; ++d) {
    if (plan.IsActive(d)) continue;
    Pool& pool = PoolOf(d);
    FS_CHECK_MSG(static_cast<int64_t>(pool.free_ids.size()) == pool.next_id,
                 "device {} leaves the plan holding pages", d);
    pool = Pool();
  }
}

Status PagedKvBlockManager::CheckInvariants() const {
  FS_RETURN_IF_ERROR(KvBlockManager::CheckInvariants());
  for (const auto& [id, tables] : tables_) {
    if (!seqs_.count(id)) return Internal("sequence {} has tables but no record", id);
  }
  for (int d = 0; d < num_devices_; ++d) {
    static const Pool kNone;
    const Pool& p = d < static_cast<int>(pools_.size()) ? pools_[d] : kNone;
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
      const std::vector<int32_t>& pages = Table(id, d);
      const size_t cols = Slots(d, t.dp_rank).size();
      if (pages.size() != cols * static_cast<size_t>(t.blocks))
        return Internal("device {}: sequence {} has {} pages for {} blocks", d, id, pages.size(),
                        t.blocks);
      for (size_t i = 0; i < pages.size(); ++i) {
        const size_t b = i / cols;
        if (b < t.cached.size() && t.cached[b] >= 0) {
          // Names a cached block's page: that block owns it.
          const std::vector<int32_t>& row = entry_pages_[t.cached[b]][d];
          if (row.size() != cols || row[i % cols] != pages[i])
            return Internal("device {}: sequence {} block {} does not name its cached pages", d, id,
                            b);
          continue;
        }
        FS_RETURN_IF_ERROR(own(pages[i]));
      }
    }
    for (size_t i = 0; i < entries_.size(); ++i) {
      if (!entries_[i].live) continue;
      if (i >= entry_pages_.size() || entry_pages_[i].size() <= static_cast<size_t>(d))
        return Internal("device {}: cached block {} has no pages", d, i);
      for (int32_t page : entry_pages_[i][d]) FS_RETURN_IF_ERROR(own(page));
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
