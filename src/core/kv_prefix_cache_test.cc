// The block manager's prefix cache through the scheduler: shared blocks are
// computed once and counted once, a request always computes its last token,
// eviction frees only unreferenced blocks (tail first), counting-only mode
// makes the same decisions as page ids, a plan change keeps no sharing, and
// the router weighs a hit against load.
#include <gtest/gtest.h>

#include <unordered_map>

#include <map>
#include <set>

#include "common/rng.h"
#include "core/scheduler.h"
#include "core/scheduler_test_util.h"
#include "placement/replan.h"

namespace failsafe {
namespace {

std::unique_ptr<Sequence> Prompt(int64_t id, std::vector<int32_t> tokens, int out) {
  auto s = std::make_unique<Sequence>();
  s->id = id;
  s->prompt_len = static_cast<int>(tokens.size());
  s->tokens = std::move(tokens);
  s->max_new_tokens = out;
  return s;
}

// Tokens [from, from + n) of a sequence numbered `seed`.
std::vector<int32_t> Tokens(int n, int seed, int from = 0) {
  std::vector<int32_t> t;
  for (int i = from; i < from + n; ++i) t.push_back(1 + (seed * 7919 + i * 31) % 1000);
  return t;
}

std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

SchedulerConfig Cached() {
  SchedulerConfig cfg;
  cfg.prefix_cache = true;
  return cfg;
}

// The books after a step: page tables and all, or (counting only) the
// manager's own invariants.
void CheckBooks(const Scheduler& s, const StepPlan* p = nullptr) {
  if (s.config().kv_page_ids) {
    ExpectKvBooks(s, p);
  } else {
    const Status st = s.kv().CheckInvariants();
    EXPECT_TRUE(st.ok()) << st.ToString();
  }
}

// Steps until `id` has computed `tokens` tokens (checking the books).
void RunUntil(Scheduler& s, int64_t id, int tokens) {
  for (int i = 0; i < 1000; ++i) {
    const Sequence* q = s.Find(id);
    if (!q || q->num_computed >= tokens) return;
    StepPlan p = s.Schedule();
    CheckBooks(s, &p);
    s.Update(p, std::vector<int32_t>(p.seqs.size(), 7));
    CheckBooks(s);
    s.TakeFinished();
  }
  FAIL() << "sequence " << id << " never reached " << tokens << " tokens";
}

const ScheduledSeq* Scheduled(const StepPlan& p, int64_t id) {
  for (const ScheduledSeq& ss : p.seqs) {
    if (ss.seq_id == id) return &ss;
  }
  return nullptr;
}

TEST(PrefixCache, SharedBlocksAreComputedOnceAndCountedOnce) {
  auto c = Model();
  for (Policy policy : {Policy::kHybrid, Policy::kCyclic, Policy::kNonUniform}) {
    auto plan = *MakePlan(c, policy, 8, Range(7));
    Scheduler s(Cached(), plan, c, 16, std::vector<int64_t>(8, 1 << 20));
    const std::vector<int32_t> common = Tokens(96, 1);
    ASSERT_TRUE(s.Add(Prompt(1, Concat(common, Tokens(4, 2)), 50)).ok());
    RunUntil(s, 1, 100);
    const Sequence* a = s.Find(1);
    ASSERT_NE(a, nullptr);
    std::map<int, int64_t> before;
    for (int d : plan.active) before[d] = s.kv().used(d);
    ASSERT_TRUE(s.Add(Prompt(2, Concat(common, Tokens(20, 3)), 5)).ok());
    StepPlan p = s.Schedule();
    ExpectKvBooks(s, &p);
    const ScheduledSeq* b = Scheduled(p, 2);
    ASSERT_NE(b, nullptr) << PolicyName(policy);
    EXPECT_EQ(b->start, 96) << PolicyName(policy);  // six cached blocks
    if (plan.num_dp_heads_total() > 0) {
      EXPECT_EQ(b->dp_rank, a->dp_rank);  // where its DP KV is
    }
    EXPECT_EQ(s.kv().SharedBlocks(2), 6);
    for (int d : plan.active) {
      const size_t cols = s.kv().Slots(d, a->dp_rank).size();
      const std::vector<int32_t>& ta = s.kv().Table(1, d);
      const std::vector<int32_t>& tb = s.kv().Table(2, d);
      ASSERT_GE(tb.size(), 6 * cols);
      EXPECT_TRUE(std::equal(tb.begin(), tb.begin() + 6 * cols, ta.begin())) << d;
      // B's own blocks (6 and 7) and A's decode growth are all that is new.
      const int64_t grown = (s.kv().BlocksFor(a->num_computed + 1) - 7) * cols;
      EXPECT_EQ(s.kv().used(d) - before[d], 2 * static_cast<int64_t>(cols) + grown) << d;
    }
    const PrefixCacheStats st = s.prefix_cache_stats();
    EXPECT_EQ(st.lookup_blocks, 6 + 7);  // (100 - 1) / 16, then (116 - 1) / 16
    EXPECT_EQ(st.hit_blocks, 6);
    EXPECT_EQ(st.hit_tokens, 96);
    s.Update(p, std::vector<int32_t>(p.seqs.size(), 7));
    DriveResult r = Drive(s);
    EXPECT_EQ(r.outputs.size(), 2u);
  }
}

TEST(PrefixCache, AlwaysComputesTheLastToken) {
  auto c = Model();
  auto plan = *MakePlan(c, Policy::kCyclic, 8, Range(8));
  Scheduler s(Cached(), plan, c, 16, std::vector<int64_t>(8, 1 << 20));
  ASSERT_TRUE(s.Add(Prompt(1, Tokens(64, 1), 3)).ok());
  Drive(s);
  // The same prompt: three blocks cached, the fourth computed for logits.
  ASSERT_TRUE(s.Add(Prompt(2, Tokens(64, 1), 3)).ok());
  StepPlan p = s.Schedule();
  ASSERT_EQ(p.seqs.size(), 1u);
  EXPECT_EQ(p.seqs[0].start, 48);
  EXPECT_EQ(p.seqs[0].num_tokens, 16);
  EXPECT_TRUE(p.seqs[0].sample);
  s.Update(p, {7});
  Drive(s);
  // One token more: all four blocks hit, one token computed.
  ASSERT_TRUE(s.Add(Prompt(3, Concat(Tokens(64, 1), {9}), 3)).ok());
  p = s.Schedule();
  ASSERT_EQ(p.seqs.size(), 1u);
  EXPECT_EQ(p.seqs[0].start, 64);
  EXPECT_EQ(p.seqs[0].num_tokens, 1);
  s.Update(p, {7});
  Drive(s);
  // A different first block hits nothing, even with the same later tokens.
  std::vector<int32_t> other = Tokens(64, 1);
  other[3] += 1;
  ASSERT_TRUE(s.Add(Prompt(4, other, 3)).ok());
  p = s.Schedule();
  EXPECT_EQ(p.seqs[0].start, 0);
}

TEST(PrefixCache, EvictsOnlyUnreferencedBlocksTailFirst) {
  auto c = Model();
  auto plan = *MakePlan(c, Policy::kCyclic, 8, Range(8));
  // Room for 12 blocks of every slot per device.
  const int64_t pages = 12LL * plan.num_tp_heads_total(0);
  Scheduler s(Cached(), plan, c, 16, std::vector<int64_t>(8, pages));
  ASSERT_TRUE(s.Add(Prompt(1, Tokens(64, 1), 4)).ok());
  Drive(s);
  ASSERT_TRUE(s.Add(Prompt(2, Tokens(64, 2), 4)).ok());
  Drive(s);
  EXPECT_EQ(s.prefix_cache_stats().cached_blocks, 8);
  EXPECT_EQ(s.kv().free(0), s.kv().capacity(0));  // cached blocks count as free
  // Five blocks on four unused: one cached block goes, the tail of the least
  // recently used prompt.
  ASSERT_TRUE(s.Add(Prompt(3, Tokens(70, 3), 4)).ok());
  Drive(s);
  EXPECT_GE(s.prefix_cache_stats().evicted_blocks, 1);
  // Prompt 1 still finds the three blocks it looks up.
  const int64_t hits = s.prefix_cache_stats().hit_blocks;
  ASSERT_TRUE(s.Add(Prompt(4, Tokens(64, 1), 4)).ok());
  Drive(s);
  EXPECT_EQ(s.prefix_cache_stats().hit_blocks, hits + 3);
}

// Random shared-prefix traffic on tight memory (evictions, preemptions): the
// counting-only block manager (the simulator's) makes the same decisions as
// the one with page ids, every request finishes with its tokens, and the books
// hold after every step.
TEST(PrefixCache, CountingOnlyMatchesPageIdsUnderPressure) {
  auto c = Model();
  for (Policy policy : {Policy::kStandard, Policy::kNonUniform, Policy::kCyclic, Policy::kHybrid}) {
    for (PrefillPolicy pp : {PrefillPolicy::kFifo, PrefillPolicy::kAdaptive}) {
      auto plan = *MakePlan(c, policy, 8, Range(7));
      SchedulerConfig ids = Cached(), counts = Cached();
      ids.prefill = counts.prefill = pp;
      ids.max_batch_tokens = counts.max_batch_tokens = 256;
      counts.kv_page_ids = false;
      int64_t most = 0;
      for (int d : plan.active) most = std::max<int64_t>(most, plan.num_tp_heads_total(d));
      const std::vector<int64_t> cap(8, 40 * (most + plan.num_dp_heads_total()));
      Scheduler a(ids, plan, c, 16, cap), b(counts, plan, c, 16, cap);
      Rng rng(static_cast<uint64_t>(policy) * 10 + static_cast<uint64_t>(pp));
      std::map<int64_t, int> want, got;
      for (int i = 0; i < 60; ++i) {
        const int group = static_cast<int>(rng.Below(4));
        const int shared = 16 * static_cast<int>(rng.Below(8));
        const int own = 1 + static_cast<int>(rng.Below(100));
        const std::vector<int32_t> t = Concat(Tokens(shared, 100 + group), Tokens(own, i, shared));
        want[i] = 1 + static_cast<int>(rng.Below(30));
        ASSERT_TRUE(a.Add(Prompt(i, t, want[i])).ok());
        ASSERT_TRUE(b.Add(Prompt(i, t, want[i])).ok());
      }
      for (int step = 0; !a.idle() && step < 20000; ++step) {
        StepPlan pa = a.Schedule(), pb = b.Schedule();
        ExpectKvBooks(a, &pa);
        ASSERT_TRUE(b.kv().CheckInvariants().ok()) << b.kv().CheckInvariants().ToString();
        ASSERT_EQ(pa.seqs.size(), pb.seqs.size()) << "step " << step;
        for (size_t i = 0; i < pa.seqs.size(); ++i) {
          EXPECT_EQ(pa.seqs[i].seq_id, pb.seqs[i].seq_id);
          EXPECT_EQ(pa.seqs[i].start, pb.seqs[i].start);
          EXPECT_EQ(pa.seqs[i].num_tokens, pb.seqs[i].num_tokens);
        }
        for (int d : plan.active) {
          ASSERT_EQ(a.kv().used(d), b.kv().used(d)) << "step " << step << " device " << d;
          ASSERT_EQ(a.kv().evictable(d), b.kv().evictable(d)) << "step " << step;
        }
        a.Update(pa, std::vector<int32_t>(pa.seqs.size(), 7));
        b.Update(pb, std::vector<int32_t>(pb.seqs.size(), 7));
        ExpectKvBooks(a);
        for (auto& f : a.TakeFinished()) got[f->id] = f->output_len();
        b.TakeFinished();
      }
      EXPECT_EQ(got, want) << PolicyName(policy);
      const PrefixCacheStats st = a.prefix_cache_stats();
      EXPECT_GT(st.hit_blocks, 0) << PolicyName(policy);
      EXPECT_GT(st.evicted_blocks, 0) << PolicyName(policy);
      EXPECT_EQ(st.hit_blocks, b.prefix_cache_stats().hit_blocks);
    }
  }
}

// Two running sequences sharing four cached blocks: 1 computed them, 2
// attached them; both are 74 tokens long.
void AddTwoSharers(Scheduler& s) {
  const std::vector<int32_t> common = Tokens(64, 5);
  ASSERT_TRUE(s.Add(Prompt(1, Concat(common, Tokens(10, 6)), 40)).ok());
  RunUntil(s, 1, 74);
  ASSERT_TRUE(s.Add(Prompt(2, Concat(common, Tokens(10, 7)), 40)).ok());
  RunUntil(s, 2, 74);
  ASSERT_EQ(s.kv().SharedBlocks(2), 4);
}

// A plan change keeps sharing: two sequences sharing cached blocks both go
// on, on one DP rank, their tables naming the same moved pages; what the
// engine can restore decides who writes a shared block again.
TEST(PrefixCache, PlanChangeKeepsSharersWhereTheSharedBlocksAreRestored) {
  auto c = Model();
  enum Restore { kBoth, kFirstOnly, kNeither };
  for (bool page_ids : {true, false}) {
    for (Restore r : {kBoth, kFirstOnly, kNeither}) {
      auto plan = *MakePlan(c, Policy::kHybrid, 8, Range(8));
      SchedulerConfig cfg = Cached();
      cfg.kv_page_ids = page_ids;
      Scheduler s(cfg, plan, c, 16, std::vector<int64_t>(8, 1 << 20));
      AddTwoSharers(s);
      if (HasFatalFailure()) return;
      const int64_t cached = s.kv().cached_blocks();
      for (int round = 0; round < 2; ++round) {
        // Device 3, then the sharers' DP rank: they are routed on together.
        const int lost = round == 0 ? 3 : s.Find(1)->dp_rank;
        std::vector<int> alive = plan.active;
        std::erase(alive, lost);
        if (alive.size() == plan.active.size()) continue;
        auto next = *Replan(plan, c, alive);
        std::vector<int64_t> rerouted;
        EXPECT_TRUE(s.Reconfigure(next, std::vector<int64_t>(8, 1 << 20), &rerouted).empty());
        EXPECT_EQ(s.Find(1)->dp_rank, s.Find(2)->dp_rank) << "sharers go to one DP rank";
        EXPECT_EQ(s.kv().cached_blocks(), cached) << "the blocks they name stay cached";
        EXPECT_EQ(s.kv().SharedBlocks(1), 4) << "read-only now, whoever computed them";
        EXPECT_EQ(s.kv().SharedBlocks(2), 4);
        ASSERT_TRUE(s.kv().CheckInvariants().ok()) << s.kv().CheckInvariants().ToString();
        if (page_ids) {
          for (int d : next.active) {
            const size_t cols = s.kv().Slots(d, s.Find(1)->dp_rank).size();
            const std::vector<int32_t>& a = s.kv().Table(1, d);
            const std::vector<int32_t>& b = s.kv().Table(2, d);
            ASSERT_GE(a.size(), 4 * cols);
            EXPECT_TRUE(std::equal(a.begin(), a.begin() + 4 * cols, b.begin())) << "device " << d;
          }
        }
        plan = next;
      }
      // Sequence 2 computed nothing past the shared blocks that it could lose
      // without rewriting them, unless the engine restores them.
      std::unordered_map<int64_t, int> restore{{1, 74}, {2, 74}};
      if (r != kBoth) restore[2] = 20;
      if (r == kNeither) restore[1] = 30;
      const Scheduler::KeptSharing kept = s.KeepRestorableSharing(restore);
      const std::vector<int64_t>& preempted = kept.preempted;
      ASSERT_TRUE(s.kv().CheckInvariants().ok()) << s.kv().CheckInvariants().ToString();
      if (r == kBoth) {
        EXPECT_TRUE(preempted.empty());
        EXPECT_EQ(s.kv().SharedBlocks(2), 4);
        // Sequence 1 restores the four blocks; 2's restore starts past them.
        EXPECT_FALSE(kept.restore_from.count(1));
        EXPECT_EQ(kept.restore_from.at(2), 64);
      } else {
        EXPECT_FALSE(kept.restore_from.count(2));
        EXPECT_EQ(preempted, std::vector<int64_t>{2});
        // Sequence 1 restores the blocks (or, restoring 30 positions, takes
        // over those it writes again: blocks 1 to 3).
        EXPECT_EQ(s.kv().SharedBlocks(1), r == kFirstOnly ? 4 : 1);
      }
      for (const auto& [id, tokens] : restore) {
        if (s.Find(id) && s.Find(id)->state == SeqState::kRunning) s.RollBack(id, tokens);
      }
      if (!page_ids) continue;  // the books below read page tables
      ExpectKvBooks(s);
      EXPECT_EQ(Drive(s).outputs.size(), 2u);
    }
  }
}

// A plan that gains DP heads puts a cached block on one DP rank: its sharers
// move there while that rank's work stays within prefix_affinity_tokens of
// the least-loaded rank's, as the router weighs a hit; past the bound a
// sharer stops sharing (preempted, routed afresh) instead of piling every
// sharer of a common prefix onto one rank.
TEST(PrefixCache, APlanChangeWeighsSharingAgainstLoad) {
  auto c = Model();
  for (int64_t bound : {int64_t{1} << 30, int64_t{0}}) {
    auto plan = *MakePlan(c, Policy::kHybrid, 8, Range(8));
    ASSERT_EQ(plan.num_dp_heads_total(), 0);
    SchedulerConfig cfg = Cached();
    cfg.prefix_affinity_tokens = bound;
    Scheduler s(cfg, plan, c, 16, std::vector<int64_t>(8, 1 << 20));
    AddTwoSharers(s);
    if (HasFatalFailure()) return;
    ASSERT_NE(s.Find(1)->dp_rank, s.Find(2)->dp_rank) << "routed by load";
    std::vector<int> alive = plan.active;
    std::erase(alive, s.Find(1)->dp_rank == 3 || s.Find(2)->dp_rank == 3 ? 5 : 3);
    auto next = *Replan(plan, c, alive);
    ASSERT_GT(next.num_dp_heads_total(), 0);
    const std::vector<int64_t> preempted =
        s.Reconfigure(next, std::vector<int64_t>(8, 1 << 20), nullptr);
    ASSERT_TRUE(s.kv().CheckInvariants().ok()) << s.kv().CheckInvariants().ToString();
    if (bound > 0) {
      EXPECT_TRUE(preempted.empty());
      EXPECT_EQ(s.Find(1)->dp_rank, s.Find(2)->dp_rank);
      EXPECT_EQ(s.kv().SharedBlocks(2), 4);
    } else {
      EXPECT_EQ(preempted, std::vector<int64_t>{2});
      EXPECT_EQ(s.Find(2)->state, SeqState::kWaiting);
      EXPECT_EQ(s.Find(2)->dp_rank, -1) << "routed afresh when readmitted";
      EXPECT_EQ(s.kv().SharedBlocks(1), 4) << "the first sharer keeps the blocks";
    }
    EXPECT_TRUE(s.KeepRestorableSharing({{1, 74}, {2, 74}}).preempted.empty());
    ASSERT_TRUE(s.kv().CheckInvariants().ok()) << s.kv().CheckInvariants().ToString();
    ExpectKvBooks(s);
    const auto out = Drive(s).outputs;
    EXPECT_EQ(out.size(), 2u);
  }
}

// With DP heads a hit is on one DP rank: the router sends a request there
// unless that rank's pending work exceeds the least-loaded one's by more than
// prefix_affinity_tokens.
TEST(PrefixCache, RouterWeighsAHitAgainstLoad) {
  auto c = Model();
  auto plan = *MakePlan(c, Policy::kHybrid, 8, Range(7));
  ASSERT_GT(plan.num_dp_heads_total(), 0);
  for (int64_t bound : {int64_t{1} << 30, int64_t{0}}) {
    SchedulerConfig cfg = Cached();
    cfg.prefix_affinity_tokens = bound;
    Scheduler s(cfg, plan, c, 16, std::vector<int64_t>(8, 1 << 20));
    const std::vector<int32_t> common = Tokens(128, 9);
    ASSERT_TRUE(s.Add(Prompt(1, Concat(common, Tokens(8, 1)), 200)).ok());
    RunUntil(s, 1, 137);  // decoding: its rank has work pending
    const int rank = s.Find(1)->dp_rank;
    ASSERT_TRUE(s.Add(Prompt(2, Concat(common, Tokens(8, 2)), 5)).ok());
    StepPlan p = s.Schedule();
    const ScheduledSeq* b = Scheduled(p, 2);
    ASSERT_NE(b, nullptr);
    if (bound > 0) {
      EXPECT_EQ(b->dp_rank, rank);
      EXPECT_EQ(b->start, 128);
    } else {
      EXPECT_NE(b->dp_rank, rank);  // the least-loaded rank, without the hit
      EXPECT_EQ(b->start, 0);
    }
  }
}

}  // namespace
}  // namespace failsafe

namespace failsafe {
namespace {

// A host tier holding a fixed set of block hashes.
class FakeHostTier : public PrefixHostTier {
 public:
  int HeldPrefix(std::span<const uint64_t> hashes, std::span<const int32_t>) const override {
    int b = 0;
    while (b < static_cast<int>(hashes.size()) && held.count(hashes[b])) ++b;
    return b;
  }
  std::set<uint64_t> held;
};

// Blocks the host tier holds are copied, not computed: the step says which
// (past the device-tier hit, never the last token), the budget counts only
// the computed tokens, the pages count them all, and the copied blocks then
// serve device-tier hits. With DP heads the host hit works on every DP rank.
TEST(PrefixCache, HostTierHitsAreCopiedIntoFreshPages) {
  auto c = Model();
  for (int devices : {8, 7}) {
    auto plan = *MakePlan(c, Policy::kHybrid, devices, Range(devices));
    SchedulerConfig cfg = Cached();
    cfg.prefix_cache_host = true;
    cfg.max_batch_tokens = 20;
    Scheduler s(cfg, plan, c, 16, std::vector<int64_t>(devices, 1 << 20));
    FakeHostTier host;
    s.SetHostTier(&host);
    const std::vector<int32_t> a = Tokens(64, 1);
    // Device tier: blocks 0 and 1 of `a`, computed by a request of 40 tokens.
    ASSERT_TRUE(s.Add(Prompt(1, std::vector<int32_t>(a.begin(), a.begin() + 40), 2)).ok());
    RunUntil(s, 1, 40);
    // Host tier: blocks 0..2 of `a` (the device holds 0 and 1).
    host.held.clear();
    for (uint64_t h : s.kv().BlockHashes(a, 3)) host.held.insert(h);
    ASSERT_TRUE(s.Add(Prompt(2, a, 2)).ok());
    StepPlan p = s.Schedule();
    CheckBooks(s, &p);
    const ScheduledSeq* ss = Scheduled(p, 2);
    ASSERT_NE(ss, nullptr) << devices;
    EXPECT_EQ(ss->host_first_block, 2);
    EXPECT_EQ(ss->host_blocks, 1);
    EXPECT_EQ(ss->start, 48);  // device 32 + host 16: the last block is computed
    EXPECT_EQ(ss->num_tokens, 16);
    EXPECT_LE(p.num_tokens(), cfg.max_batch_tokens);
    EXPECT_EQ(s.Find(2)->kv_blocks, 4);  // pages for the copied block too
    s.Update(p, std::vector<int32_t>(p.seqs.size(), 7));
    CheckBooks(s);
    PrefixCacheStats st = s.prefix_cache_stats();
    EXPECT_EQ(st.host_hit_blocks, 1);
    EXPECT_EQ(st.host_hit_tokens, 16);
    EXPECT_EQ(st.hit_blocks, 2);
    Drive(s);
    // The copied block entered the device tier: a third request finds all
    // three blocks there (on its DP rank), the host tier unused.
    host.held.clear();
    ASSERT_TRUE(
        s.Add(Prompt(3, Concat(std::vector<int32_t>(a.begin(), a.begin() + 48), Tokens(20, 9)), 2))
            .ok());
    Drive(s);
    st = s.prefix_cache_stats();
    EXPECT_EQ(st.hit_blocks, 2 + 3) << devices;
    EXPECT_EQ(st.host_hit_blocks, 1);
  }
}

// Copied blocks take pages: a request copies only as many as fit with one
// computed token, so a copy never keeps it waiting; with the host tier off
// nothing is copied.
TEST(PrefixCache, HostTierHitsTakeOnlyThePagesThatFit) {
  auto c = Model();
  auto plan = *MakePlan(c, Policy::kCyclic, 8, Range(8));
  const std::vector<int32_t> a = Tokens(160, 4);
  for (bool on : {true, false}) {
    SchedulerConfig cfg = Cached();
    cfg.prefix_cache_host = on;
    // Room for 12 blocks per device; the first request holds 8 of them.
    const int64_t pages = 12LL * plan.num_tp_heads_total(0);
    Scheduler s(cfg, plan, c, 16, std::vector<int64_t>(8, pages));
    FakeHostTier host;
    for (uint64_t h : s.kv().BlockHashes(a, 9)) host.held.insert(h);
    s.SetHostTier(&host);
    ASSERT_TRUE(s.Add(Prompt(1, Tokens(120, 5), 40)).ok());
    RunUntil(s, 1, 121);
    ASSERT_TRUE(s.Add(Prompt(2, a, 2)).ok());
    StepPlan p = s.Schedule();
    CheckBooks(s, &p);
    // Its first chunk fits in the free blocks, the copied ones included:
    // fewer are copied than the host holds, the rest computed.
    const ScheduledSeq* ss = Scheduled(p, 2);
    ASSERT_NE(ss, nullptr);
    EXPECT_EQ(ss->host_first_block, 0);
    if (on) {
      EXPECT_GT(ss->host_blocks, 0);
      EXPECT_LT(ss->host_blocks, 9);
    } else {
      EXPECT_EQ(ss->host_blocks, 0);
    }
    EXPECT_EQ(ss->start, ss->host_blocks * 16);
    const int64_t copied = ss->host_blocks;
    s.Update(p, std::vector<int32_t>(p.seqs.size(), 7));
    Drive(s);
    EXPECT_EQ(s.prefix_cache_stats().host_hit_blocks, copied);
  }
}

// Two 4-block prompts computed and cached (evictable once finished), on DP
// ranks a and b (-1: routed); then two requests, on the same ranks, each
// hitting one of the prefixes and needing 4 more blocks on every device,
// which fit only if the other prefix gives way: both are served.
void ExpectBothServedThoughEachNeedsTheOthersPrefix(Scheduler& s, int a, int b,
                                                    const std::string& what) {
  auto on = [](std::unique_ptr<Sequence> q, int rank) {
    if (rank >= 0) q->dp_rank = rank;
    return q;
  };
  ASSERT_TRUE(s.Add(on(Prompt(1, Tokens(64, 1), 1), a)).ok());
  ASSERT_TRUE(s.Add(on(Prompt(2, Tokens(64, 2), 1), b)).ok());
  EXPECT_EQ(Drive(s).outputs.size(), 2u) << what;
  ASSERT_TRUE(s.Add(on(Prompt(3, Concat(Tokens(64, 1), Tokens(64, 3)), 2), a)).ok());
  ASSERT_TRUE(s.Add(on(Prompt(4, Concat(Tokens(64, 2), Tokens(64, 4)), 2), b)).ok());
  EXPECT_EQ(Drive(s, 200).outputs.size(), 2u) << what;
  EXPECT_TRUE(s.idle()) << what;
  EXPECT_GT(s.prefix_cache_stats().hit_blocks, 0) << what;
}

// A request queued behind does not keep the one before it waiting by holding
// its cached prefix: two requests, each fitting only if the other's cached
// prefix is evicted, are both served (with both prefixes held while the
// first waited for pages, adaptive prefill admitted neither, step after
// step).
TEST(PrefixCache, WaitingRequestsDoNotHoldEachOthersPrefixes) {
  auto c = Model();
  auto plan = *MakePlan(c, Policy::kCyclic, 8, Range(8));
  for (PrefillPolicy pp : {PrefillPolicy::kAdaptive, PrefillPolicy::kFifo}) {
    SchedulerConfig cfg = Cached();
    cfg.prefill = pp;
    // Ten blocks of every slot per device.
    Scheduler s(cfg, plan, c, 16, std::vector<int64_t>(8, 10LL * plan.num_tp_heads_total(0)));
    ExpectBothServedThoughEachNeedsTheOthersPrefix(s, -1, -1, PrefillPolicyName(pp));
  }
}

// The admission watermark keeps room for running sequences to grow; with
// none running, a request that fits the devices alone is admitted though it
// takes the watermark too: here its cached prefix and first chunk fill the
// devices (it waited forever).
TEST(PrefixCache, ARequestThatFitsAloneIsAdmittedIntoTheWatermark) {
  auto c = Model();
  auto plan = *MakePlan(c, Policy::kCyclic, 8, Range(8));
  for (PrefillPolicy pp : {PrefillPolicy::kAdaptive, PrefillPolicy::kFifo}) {
    SchedulerConfig cfg = Cached();
    cfg.prefill = pp;
    cfg.admit_watermark = 0.05;
    // 100 blocks of every slot per device; the request needs all of them.
    Scheduler s(cfg, plan, c, 16, std::vector<int64_t>(8, 100LL * plan.num_tp_heads_total(0)));
    ASSERT_TRUE(s.Add(Prompt(1, Tokens(98 * 16, 1), 1)).ok());
    EXPECT_EQ(Drive(s, 1000).outputs.size(), 1u);
    // Hits 98 cached blocks, needs the last 2.
    ASSERT_TRUE(s.Add(Prompt(2, Concat(Tokens(98 * 16, 1), Tokens(31, 2)), 1)).ok());
    EXPECT_EQ(Drive(s, 1000).outputs.size(), 1u) << PrefillPolicyName(pp);
    EXPECT_TRUE(s.idle());
    EXPECT_EQ(s.prefix_cache_stats().hit_blocks, 98);
  }
}

// The same on DP ranks, where the adaptive policy tries the least-loaded
// rank's request first, not the queue's head: a blocked request queued after
// the head, tried first, kept its prefix while the head waited for those
// pages, and neither was ever admitted (a real engine run on the Mooncake
// trace with the host tier stopped there for good after a failure). Both
// orders of the two requests, so that either rank may be tried first.
TEST(PrefixCache, WaitingRequestsOnOtherRanksDoNotHoldEachOthersPrefixes) {
  auto c = Model();
  auto plan = *MakePlan(c, Policy::kHybrid, 8, Range(7));
  ASSERT_GT(plan.num_dp_heads_total(), 0);
  const KvBlockManager probe(plan, 16, std::vector<int64_t>(8, 1 << 20));
  // Ten blocks per device of the rank that takes most pages there.
  std::vector<int64_t> capacity(8, 0);
  for (int d : plan.active)
    for (int r : plan.active) capacity[d] = std::max(capacity[d], 10 * probe.PagesPerBlock(d, r));
  // A slower rank (more of the model's items on its device) and a faster one.
  StepCost cost(plan, c, DeviceSpeed{});
  cost.Reset();
  int slow = plan.active.front(), fast = slow;
  for (int r : plan.active) {
    if (cost.DeviceTime(r) > cost.DeviceTime(slow)) slow = r;
    if (cost.DeviceTime(r) < cost.DeviceTime(fast)) fast = r;
  }
  ASSERT_GT(cost.DeviceTime(slow), cost.DeviceTime(fast));
  for (bool head_on_slow : {true, false}) {
    SchedulerConfig cfg = Cached();
    cfg.prefill = PrefillPolicy::kAdaptive;
    Scheduler s(cfg, plan, c, 16, capacity);
    ExpectBothServedThoughEachNeedsTheOthersPrefix(
        s, head_on_slow ? slow : fast, head_on_slow ? fast : slow,
        head_on_slow ? "head on the slower rank" : "head on the faster rank");
  }
}

}  // namespace
}  // namespace failsafe
