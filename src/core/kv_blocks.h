// The KV block manager: the one owner of every device's KV pages.
//
// A page holds block_size positions of one (layer, KV head) slot of one
// sequence. On device d a sequence caches the slots plan.KvSlots(d, dp_rank)
// (its TP head groups on every device holding them, its DP head groups on its
// DP rank only), so one block of a sequence takes KvSlots(d, rank).size()
// pages on d: a device holding more head groups (nonuniform) fills sooner;
// cyclic placement evens it out.
//
// Two classes. KvBlockManager keeps the books in pages: admission, growth,
// re-plans (which slots each device gains), the prefix cache. That is all
// the simulator needs: it has no devices to tell where to write, and its
// models hold tens of pages per block and device. PagedKvBlockManager adds
// the page ids: it hands them out per device and keeps each sequence's
// block table per device: [block][position of the slot in KvSlots] -> page
// id. The devices are page stores: the engine sends them the tables (each
// step the blocks it added) and they write where they are told. Both run
// the one set of books; the paged one only names the pages it counts.
//
// Check, then commit: CanGrow/Fits/FitsAlone have no side effects; Grow cannot
// fail (the caller checked); Release frees every page of a sequence.
// Page ids (PagedKvBlockManager) on a device are reused most recently freed
// first and never exceed the largest number of pages the device ever held at
// once, so they stay below its capacity (and its pool's size).
//
// Prefix cache (EnablePrefixCache): a full block whose KV is computed is
// registered under a hash chained over the tokens of every block up to it and
// a seed naming what else changes the KV (the model). The block then belongs
// to the cache, which holds its pages on every device (with DP heads: its TP
// pages on every device and its DP pages on the DP rank of the sequence that
// computed it, so a hit needs that DP rank); a sequence using it holds a
// reference. A new sequence attaches the longest cached prefix of its tokens
// (AttachPrefix: never its last token, so one token is computed and sampled),
// and its table names the cached pages: they are read-only for it (its
// first SharedBlocks() blocks), since only full blocks, whose KV no sequence
// writes again, are cached. A block nobody references stays cached and is
// evicted, least recently used first, only when a device runs out of free
// pages: for admission it counts as free (free(), CanGrow, Fits).
// A plan change keeps the cached blocks running sequences name (their pages
// move with the plan as a sequence's do, once for all their sharers) and
// frees the rest (DropUnreferencedCache).
//
// Thread-safety: none; the scheduler's thread only.
#pragma once

#include <cstdint>
#include <list>
#include <span>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "core/sequence.h"
#include "placement/plan.h"

namespace failsafe {

class KvBlockManager {
 public:
  KvBlockManager() = default;
  // capacity_pages: [device id] -> pages the device may hold (0 without a pool).
  KvBlockManager(const Plan& plan, int block_size, std::vector<int64_t> capacity_pages);
  virtual ~KvBlockManager() = default;
  KvBlockManager(const KvBlockManager&) = default;
  KvBlockManager& operator=(const KvBlockManager&) = default;

  int block_size() const { return block_size_; }
  int BlocksFor(int tokens) const { return (tokens + block_size_ - 1) / block_size_; }
  // Pages one block of a sequence with DP rank `dp_rank` takes on a device.
  int64_t PagesPerBlock(int device, int dp_rank) const {
    return static_cast<int64_t>(tp_slots_[device].size()) + (device == dp_rank ? dp_extra_ : 0);
  }
  // The slots a sequence with DP rank `dp_rank` caches on `device`
  // (Plan::KvSlots, cached).
  const std::vector<int>& Slots(int device, int dp_rank) const {
    return device == dp_rank ? rank_slots_[device] : tp_slots_[device];
  }

  bool CanGrow(const Sequence& s, int tokens, int64_t keep_free_pages = 0) const;
  // Would a sequence on `dp_rank` holding `blocks` blocks fit `tokens` tokens,
  // given `pending` pages already promised per device in this step and
  // `keep_free` pages per device left over?
  bool Fits(int dp_rank, int blocks, int tokens, const std::vector<int64_t>& pending,
            const std::vector<int64_t>& keep_free) const;
  void AddPending(int dp_rank, int blocks, int tokens, std::vector<int64_t>* pending) const;
  // Would `tokens` tokens fit on empty devices (the sequence alone)?
  bool FitsAlone(int dp_rank, int tokens) const;
  // Gives the sequence pages for `tokens` tokens on every device (s.dp_rank
  // must be set and the growth checked).
  void Grow(Sequence& s, int tokens);
  // Frees every page of the sequence.
  void Release(Sequence& s);

  int64_t capacity(int device) const { return capacity_[device]; }
  // Pages holding KV: sequences' and cached blocks' (unreferenced ones too).
  int64_t used(int device) const { return used_[device]; }
  // Pages of cached blocks no sequence references (evicted when needed).
  int64_t evictable(int device) const { return evictable_[device]; }
  // Pages a sequence may still get: the unused ones and the evictable ones.
  int64_t free(int device) const { return capacity_[device] - held(device); }
  const std::vector<int>& devices() const { return devices_; }
  // Devices over capacity (after a plan change).
  bool OverCapacity() const;

  // The sequence's block table on `device`: [block][slot position] -> page
  // id, Slots(device, dp_rank).size() entries per block (empty if it holds
  // none there, and always here: this manager only counts pages).
  virtual const std::vector<int32_t>& Table(int64_t seq_id, int device) const;
  // Blocks the devices have not been sent yet (the first one); marks them
  // sent. A step carries the tables from there on.
  int TakeUnsent(int64_t seq_id);
  // The devices may have missed the sequence's last tables (a failed step):
  // send the whole table again.
  void MarkUnsent(int64_t seq_id);

  // Pages per device the sequences would take under `plan` (their current
  // blocks and DP ranks; a cached block they share counted once).
  std::vector<int64_t> PagesUnder(const Plan& plan, const std::vector<const Sequence*>& seqs) const;
  // Moves to a new plan and capacities. `live` (with their DP ranks under the
  // new plan; sequences sharing a cached block on one rank) keep their
  // blocks; every other sequence's pages are freed. A slot a device held
  // under the old plan and still holds keeps its pages (its KV stays in
  // place); every other slot gets new pages, and GainedSlots() lists it (its
  // KV must be restored or recomputed). A cached block moves once, and every
  // table naming it names its new pages. The caller has made the live
  // sequences fit (PagesUnder) and dropped the unreferenced cache. Every
  // table counts as sent (the plan change carries them whole), and a
  // sequence's leading cached blocks count as shared (read-only) from now
  // on, whoever computed them.
  void Reconfigure(const Plan& plan, std::vector<int64_t> capacity_pages,
                   const std::vector<const Sequence*>& live);
  // Slots of the sequence that `device` did not hold before the last
  // Reconfigure, ascending (also when counting pages only).
  std::vector<int> GainedSlots(int64_t seq_id, int device) const;

  // ---- Prefix cache (kv_prefix_cache.cc) ----
  // Turns the cache on. `seed` names what else than the tokens changes the
  // KV (model and its configuration).
  void EnablePrefixCache(uint64_t seed);
  bool prefix_cache() const { return cache_on_; }
  // Chained hashes of the first `max_blocks` full blocks of `tokens`.
  std::vector<uint64_t> BlockHashes(std::span<const int32_t> tokens, int max_blocks) const;
  // Leading blocks of `tokens` (with their `hashes`) cached for a sequence on
  // `dp_rank`.
  int CachedPrefix(std::span<const int32_t> tokens, std::span<const uint64_t> hashes,
                   int dp_rank) const;
  // Attaches the sequence (s.dp_rank set, no blocks yet) to its first
  // `blocks` cached blocks (CachedPrefix), if the unreferenced ones among
  // them fit every device next to `pending` pages; else to the longest prefix
  // that does. Sets s.kv_blocks (the caller sets s.num_computed). Returns the
  // blocks attached.
  int AttachPrefix(Sequence& s, std::span<const uint64_t> hashes, int blocks,
                   const std::vector<int64_t>& pending);
  // Registers the sequence's full blocks whose KV is computed (up to
  // s.num_computed) in the cache. A block whose hash is cached already (two
  // sequences computed it side by side) stays the sequence's own.
  void CacheComputed(const Sequence& s);
  // Leading blocks of the sequence's tables that are cached pages attached at
  // admission (read-only for it).
  int SharedBlocks(int64_t seq_id) const;
  // Chained hashes of the sequence's leading full computed blocks (the
  // attached ones first); empty with the cache off, and again after a plan
  // change until its blocks are registered anew.
  std::span<const uint64_t> Hashes(int64_t seq_id) const;
  // Before a plan change: frees the cached blocks no sequence names (their
  // KV would have to be restored to stay useful; the host tier keeps it).
  void DropUnreferencedCache();
  // The cached block each of the sequence's leading hashed blocks is (-1:
  // its own), as CachedBlockRefs counts them.
  std::span<const int32_t> CachedIds(int64_t seq_id) const;
  // Sequences naming cached block `id`.
  int CachedBlockRefs(int32_t id) const { return entries_[id].refs; }
  // After a plan change rolled the sequence back to block `block`: its
  // cached blocks from there on, which it will write again, become its own
  // (their hashes forgotten: recomputed, they are registered anew). Each
  // must be named by it alone (CachedBlockRefs 1).
  void OwnFrom(int64_t seq_id, int block);
  int64_t cached_blocks() const { return static_cast<int64_t>(index_.size()); }
  int64_t evicted_blocks() const { return evicted_blocks_; }

  // Checks the books: used = the sequences' own pages + the cached blocks'
  // <= capacity, reference counts = the blocks naming each cached block,
  // evictable = the pages of the unreferenced ones (and, with page ids, more:
  // PagedKvBlockManager::CheckInvariants).
  virtual Status CheckInvariants() const;

 protected:
  struct SeqTables {
    int dp_rank = -1;
    int blocks = 0;
    int sent = 0;                              // blocks the devices have been sent
    std::vector<std::vector<int32_t>> gained;  // [device] -> slots gained at the last plan change
    // Prefix cache: [block] -> cached block it is (-1: its own), for the
    // blocks hashed so far; chained hashes of its full computed blocks.
    std::vector<int32_t> cached;
    std::vector<uint64_t> hashes;
    int shared = 0;  // leading blocks attached from the cache (read-only)
  };
  struct CachedBlock {
    uint64_t hash = 0;    // chained over the tokens up to and with this block
    uint64_t parent = 0;  // the hash of the block before (the seed for block 0)
    int dp_rank = -1;     // where its DP pages are; -1: the plan has no DP heads
    int refs = 0;         // sequences whose tables name it
    bool live = false;    // false: a free entry
    // In index_ under CacheKey(hash, dp_rank). After a plan change two
    // blocks may fall on one key (the same prefix computed on two DP ranks,
    // and the new plan has none): the second is not indexed, and is freed
    // as soon as nobody names it.
    bool indexed = true;
    std::vector<int32_t> tokens;       // [block_size], checked on a hit
    std::list<int32_t>::iterator lru;  // in lru_ while refs == 0
  };
  // What a plan change keeps: the slots each device held before it.
  struct OldSlots {
    std::vector<int> active;
    std::vector<std::vector<int>> tp, rank;
    const std::vector<int>& Of(int device, int dp_rank) const;
  };

  // Hooks for the page ids (PagedKvBlockManager); the books call each after
  // counting what it names. Growth by `add` blocks (t still has the blocks
  // before it).
  virtual void OnGrow(int64_t /*seq_id*/, const SeqTables& /*t*/, int /*add*/) {}
  // The sequence goes: its own blocks' pages are free (cached[b]: block b is
  // the cache's).
  virtual void OnRelease(int64_t /*seq_id*/, const SeqTables& /*t*/,
                         const std::vector<char>& /*cached*/) {}
  // The sequence (no pages yet) names the cached blocks `ids`.
  virtual void OnAttach(int64_t /*seq_id*/, std::span<const int32_t> /*ids*/) {}
  // Block `block` of the sequence became cached block `id`: it holds its pages.
  virtual void OnCacheBlock(int32_t /*id*/, int64_t /*seq_id*/, const SeqTables& /*t*/,
                            int /*block*/) {}
  // Cached block `id` is gone: its pages are free, or (`free` false) its
  // sharer's own now.
  virtual void OnEntryGone(int32_t /*id*/, bool /*free*/) {}
  // A plan change (Reconfigure): the new plan is set, the live sequences'
  // records still hold their old ranks and blocks, `old` the slots before,
  // `new_rank`/`old_rank` each cached block's sharers' rank after and before.
  virtual void OnReplan(const Plan& /*plan*/, const OldSlots& /*old*/,
                        const std::vector<const Sequence*>& /*live*/,
                        const std::vector<int>& /*new_rank*/,
                        const std::vector<int>& /*old_rank*/) {}

  // For each slot of `after` (ascending), the position of the same slot in
  // `before` when the device keeps its KV there, -1 for a slot it gains.
  // `had` false: every slot is gained. The one rule for what a plan change
  // keeps, for the tables and for the gained slots.
  static std::vector<int> KeptColumns(const std::vector<int>& before, const std::vector<int>& after,
                                      bool had);
  // Whether the sequence's record keeps its KV through a plan change (its
  // blocks unchanged and slots on the device before it).
  static bool Keeps(const SeqTables& t, const Sequence& s, const std::vector<int>& before) {
    return t.blocks > 0 && t.blocks == s.kv_blocks && !before.empty();
  }
  int64_t held(int device) const { return used_[device] - evictable_[device]; }
  uint64_t CacheKey(uint64_t hash, int dp_rank) const;
  int CacheRank(int dp_rank) const { return dp_extra_ > 0 ? dp_rank : -1; }
  int64_t EntryPages(const CachedBlock& e, int device) const;
  // Frees cached blocks, least recently used first, until every device has
  // `need[d]` unused pages.
  void EvictFor(const std::vector<int64_t>& need);
  void FreeEntry(int32_t id);
  void Unref(int32_t id);
  Status CheckCache() const;
  // Leading blocks of a table that are cached blocks.
  static int LeadingCached(const SeqTables& t);
  // After a plan change: each cached block's DP rank is its sharers' new one
  // (new_rank, by id), and the index is rebuilt under it.
  void RekeyCache(const std::vector<int>& new_rank);
  void SetPlan(const Plan& plan, std::vector<int64_t> capacity_pages);

  int block_size_ = 16;
  int num_devices_ = 0;
  std::vector<int> devices_;                  // active devices
  std::vector<std::vector<int>> tp_slots_;    // [device] -> KvSlots(device, another rank)
  std::vector<std::vector<int>> rank_slots_;  // [device] -> KvSlots(device, device)
  int64_t dp_extra_ = 0;                      // DP slots (over all layers)
  std::vector<int64_t> capacity_, used_, evictable_;
  std::unordered_map<int64_t, SeqTables> seqs_;
  // Prefix cache.
  bool cache_on_ = false;
  uint64_t seed_ = 0;
  std::vector<CachedBlock> entries_;
  std::vector<int32_t> free_entries_;
  std::unordered_map<uint64_t, int32_t> index_;  // CacheKey -> entry
  std::list<int32_t> lru_;                       // unreferenced entries, least recent first
  int64_t evicted_blocks_ = 0;
};

// The books of KvBlockManager, and the page id of every page they count.
class PagedKvBlockManager final : public KvBlockManager {
 public:
  PagedKvBlockManager() = default;
  PagedKvBlockManager(const Plan& plan, int block_size, std::vector<int64_t> capacity_pages)
      : KvBlockManager(plan, block_size, std::move(capacity_pages)) {}

  const std::vector<int32_t>& Table(int64_t seq_id, int device) const override;
  // The books, and: every page of a device owned once (by one sequence's own
  // block or one cached block; sequences referencing a cached block name its
  // pages) and below the device's id high-water mark, owned + free ids = the
  // mark, owned pages = used, every table of the right size.
  Status CheckInvariants() const override;

 private:
  struct Pool {
    std::vector<int32_t> free_ids;  // freed ids, reused last-in first-out
    int32_t next_id = 0;            // ids [0, next_id) have been handed out
  };
  using Tables = std::vector<std::vector<int32_t>>;  // [device] -> [block][slot position]

  void OnGrow(int64_t seq_id, const SeqTables& t, int add) override;
  void OnRelease(int64_t seq_id, const SeqTables& t, const std::vector<char>& cached) override;
  void OnAttach(int64_t seq_id, std::span<const int32_t> ids) override;
  void OnCacheBlock(int32_t id, int64_t seq_id, const SeqTables& t, int block) override;
  void OnEntryGone(int32_t id, bool free) override;
  void OnReplan(const Plan& plan, const OldSlots& old, const std::vector<const Sequence*>& live,
                const std::vector<int>& new_rank, const std::vector<int>& old_rank) override;
  Pool& PoolOf(int device);
  void FreeIds(int device, std::span<const int32_t> ids);

  std::vector<Pool> pools_;                     // [device]
  std::unordered_map<int64_t, Tables> tables_;  // by sequence
  std::vector<Tables> entry_pages_;             // [cached block] -> [device] -> [slot position]
};

}  // namespace failsafe
