#include "core/scheduler.h"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <tuple>

#include "common/rng.h"
#include "core/scheduler_test_util.h"
#include "core/step_cost.h"
#include "model/synthetic.h"
#include "placement/replan.h"

namespace failsafe {
namespace {

TEST(Scheduler, CompletesEveryRequestExactlyOnce) {
  auto c = Model();
  auto plan = *MakePlan(c, Policy::kHybrid, 8, Range(7));
  for (PrefillPolicy pp : {PrefillPolicy::kFifo, PrefillPolicy::kAdaptive}) {
    SchedulerConfig cfg;
    cfg.prefill = pp;
    cfg.max_batch_tokens = 512;
    Scheduler s(cfg, plan, c, 16, std::vector<int64_t>(8, 1 << 20));
    Rng rng(1);
    std::map<int64_t, int> want;
    for (int i = 0; i < 40; ++i) {
      const int prompt = 1 + static_cast<int>(rng.Below(900));
      want[i] = 1 + static_cast<int>(rng.Below(40));
      ASSERT_TRUE(s.Add(Req(i, prompt, want[i])).ok());
    }
    DriveResult r = Drive(s);
    EXPECT_TRUE(s.idle());
    EXPECT_EQ(r.outputs, want);
  }
}

// Requests asking for prompt logprobs get a row for every prompt position
// (exactly once, through preemptions), never take a cached prefix, and the
// step's rows stay within max_num_seqs whatever else runs.
TEST(Scheduler, PromptLogprobRowsOncePerPositionWithinTheRows) {
  auto c = Model();
  auto plan = *MakePlan(c, Policy::kHybrid, 8, Range(7));
  for (PrefillPolicy pp : {PrefillPolicy::kFifo, PrefillPolicy::kAdaptive}) {
    SchedulerConfig cfg;
    cfg.prefill = pp;
    cfg.max_batch_tokens = 256;
    cfg.max_num_seqs = 8;
    cfg.prefix_cache = true;
    // Little KV: requests are preempted and computed again.
    Scheduler s(cfg, plan, c, 16, std::vector<int64_t>(8, 1200));
    Rng rng(3);
    std::map<int64_t, std::vector<int>> rows_at;  // [id] -> rows per prompt position
    for (int i = 0; i < 30; ++i) {
      const int prompt = 2 + static_cast<int>(rng.Below(300));
      auto r = Req(i, prompt, 1 + static_cast<int>(rng.Below(20)));
      if (i % 2 == 0) {
        r->prompt_logits_from = 0;
        rows_at[i].assign(prompt - 1, 0);
      }
      ASSERT_TRUE(s.Add(std::move(r)).ok());
    }
    int steps = 0, preempted = 0;
    while (!s.idle() && steps++ < 100000) {
      StepPlan p = s.Schedule();
      preempted += static_cast<int>(p.preempted.size());
      int rows = 0;
      for (const ScheduledSeq& ss : p.seqs) {
        rows += ss.logits_rows;
        const Sequence* q = s.Find(ss.seq_id);
        if (!rows_at.count(ss.seq_id) || q->prompt_logits_from < 0) continue;
        EXPECT_EQ(ss.host_blocks, 0);
        const int end = ss.start + ss.num_tokens;
        for (int pos = end - ss.logits_rows; pos < end; ++pos) {
          if (pos >= q->prompt_logits_from && pos < q->prompt_len - 1) rows_at[ss.seq_id][pos]++;
        }
      }
      EXPECT_LE(rows, cfg.max_num_seqs);
      s.Update(p, std::vector<int32_t>(p.seqs.size(), 7));
      s.TakeFinished();
    }
    EXPECT_TRUE(s.idle());
    EXPECT_GT(preempted, 0);
    for (const auto& [id, at] : rows_at) {
      for (size_t pos = 0; pos < at.size(); ++pos)
        ASSERT_EQ(at[pos], 1) << "request " << id << " position " << pos;
    }
  }
}

// Disaggregated decode: a sequence arrives with its prompt's KV computed and
// its first token sampled. It is admitted only when its whole KV fits (never
// as a one-token "prefill"), so admission never overcommits the devices.
TEST(Scheduler, MigratedSequencesAdmittedWholeWithinCapacity) {
  auto c = Model();
  auto plan = *MakePlan(c, Policy::kHybrid, 8, Range(7));
  for (PrefillPolicy pp : {PrefillPolicy::kFifo, PrefillPolicy::kAdaptive}) {
    SchedulerConfig cfg;
    cfg.prefill = pp;
    cfg.router = RouterPolicy::kLoadAware;
    cfg.max_batch_tokens = 4096;
    Scheduler s(cfg, plan, c, 16, std::vector<int64_t>(8, 20000));
    std::map<int64_t, int> want;
    for (int i = 0; i < 60; ++i) {
      auto r = Req(i, 700 + 13 * i, 30);
      r->tokens.push_back(7);
      r->num_computed = r->prompt_len;
      want[i] = 30;
      ASSERT_TRUE(s.Add(std::move(r)).ok());
    }
    StepPlan first = s.Schedule();
    EXPECT_EQ(first.prefill_tokens, 0);  // admitted with their KV: decode only
    EXPECT_GT(first.decode_tokens, 0);
    EXPECT_LT(s.num_running(), 60);  // capacity bounds admission
    for (int d : s.kv().devices()) EXPECT_LE(s.kv().used(d), s.kv().capacity(d));
    s.Update(first, std::vector<int32_t>(first.seqs.size(), 7));
    DriveResult r = Drive(s);
    // Growth may preempt some later (they then recompute), but every one
    // finishes with exactly its budget: the token it came with and 29 more.
    for (auto& [id, n] : r.outputs) EXPECT_EQ(n, 30) << id;
  }
  // Malformed migrations are refused.
  SchedulerConfig cfg;
  Scheduler s(cfg, plan, c, 16, std::vector<int64_t>(8, 20000));
  auto bad = Req(1, 100, 5);
  bad->num_computed = 50;
  EXPECT_FALSE(s.Add(std::move(bad)).ok());
}

TEST(Scheduler, PreemptsWhenKvRunsOutAndStillFinishes) {
  auto c = Model();
  auto plan = *MakePlan(c, Policy::kCyclic, 8, Range(8));
  SchedulerConfig cfg;
  // Room for about 8 blocks of every slot per device.
  const int64_t pages = 8LL * plan.num_tp_heads_total(0);
  Scheduler s(cfg, plan, c, 16, std::vector<int64_t>(8, pages));
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(s.Add(Req(i, 30, 60)).ok());
  DriveResult r = Drive(s);
  EXPECT_EQ(r.outputs.size(), 6u);
  EXPECT_GT(r.preemptions, 0);
  for (auto& [id, n] : r.outputs) EXPECT_EQ(n, 60);
}

// Equal memory per device: nonuniform fills device 0 (two heads per layer)
// first; cyclic spreads the extra head and holds more sequences.
TEST(Scheduler, CyclicHoldsMoreSequencesThanNonuniform) {
  auto c = Model();
  std::map<Policy, int> concurrency;
  for (Policy p : {Policy::kNonUniform, Policy::kCyclic, Policy::kHybrid}) {
    auto plan = *MakePlan(c, p, 8, Range(7));
    SchedulerConfig cfg;
    cfg.max_num_seqs = 1000;
    Scheduler s(cfg, plan, c, 16, std::vector<int64_t>(8, 20000));
    for (int i = 0; i < 400; ++i) ASSERT_TRUE(s.Add(Req(i, 200, 20)).ok());
    concurrency[p] = Drive(s).max_running;
  }
  EXPECT_GT(concurrency[Policy::kCyclic], concurrency[Policy::kNonUniform] * 3 / 2);
  EXPECT_GT(concurrency[Policy::kHybrid], concurrency[Policy::kNonUniform] * 3 / 2);
}

TEST(Scheduler, DpBlocksOnlyOnTheDpRank) {
  auto c = Model();
  auto plan = *MakePlan(c, Policy::kHybrid, 8, Range(7));
  Scheduler s({}, plan, c, 16, std::vector<int64_t>(8, 1 << 20));
  ASSERT_TRUE(s.Add(Req(1, 64, 4)).ok());
  StepPlan p = s.Schedule();
  ASSERT_EQ(p.seqs.size(), 1u);
  const int rank = p.seqs[0].dp_rank;
  const int64_t blocks = 4;
  for (int d : plan.active) {
    int64_t want =
        blocks * (plan.num_tp_heads_total(d) + (d == rank ? plan.num_dp_heads_total() : 0));
    EXPECT_EQ(s.kv().used(d), want) << d;
  }
}

TEST(Scheduler, LoadAwareRoutingBalancesTokensRoundRobinCycles) {
  auto c = Model();
  auto plan = *MakePlan(c, Policy::kHybrid, 8, Range(7));
  for (RouterPolicy rp : {RouterPolicy::kRoundRobin, RouterPolicy::kLoadAware}) {
    SchedulerConfig cfg;
    cfg.router = rp;
    cfg.prefill = PrefillPolicy::kFifo;
    cfg.max_batch_tokens = 1 << 20;
    Scheduler s(cfg, plan, c, 16, std::vector<int64_t>(8, 1 << 24));
    // Every seventh request is long: round-robin over seven devices piles them
    // all onto one device.
    for (int i = 0; i < 98; ++i) ASSERT_TRUE(s.Add(Req(i, i % 7 == 0 ? 4000 : 100, 10)).ok());
    s.Schedule();
    auto load = s.DpLoad();
    int64_t lo = INT64_MAX, hi = 0;
    for (int d : plan.active) {
      lo = std::min(lo, load[d]);
      hi = std::max(hi, load[d]);
    }
    if (rp == RouterPolicy::kLoadAware) {
      EXPECT_LT(static_cast<double>(hi) / lo, 1.3);
    } else {
      EXPECT_GT(static_cast<double>(hi) / lo, 2.0);
    }
  }
}

// Long prompts queued behind each other: FIFO gives the first one the whole
// budget, so one DP rank does all the DP work; adaptive spreads the tokens
// over ranks and gets more tokens per estimated second.
TEST(Scheduler, AdaptivePrefillSpreadsTokensOverDpRanks) {
  auto c = Model();
  auto plan = *MakePlan(c, Policy::kHybrid, 8, Range(7));
  std::map<PrefillPolicy, StepPlan> plans;
  for (PrefillPolicy pp : {PrefillPolicy::kFifo, PrefillPolicy::kAdaptive}) {
    SchedulerConfig cfg;
    cfg.prefill = pp;
    cfg.max_batch_tokens = 2048;
    cfg.max_model_len = 16384;
    Scheduler s(cfg, plan, c, 16, std::vector<int64_t>(8, 1 << 24));
    for (int i = 0; i < 14; ++i) ASSERT_TRUE(s.Add(Req(i, 8000, 10)).ok());
    plans[pp] = s.Schedule();
  }
  const StepPlan& fifo = plans[PrefillPolicy::kFifo];
  const StepPlan& adaptive = plans[PrefillPolicy::kAdaptive];
  EXPECT_EQ(fifo.seqs.size(), 1u);
  std::set<int> ranks;
  for (auto& ss : adaptive.seqs) ranks.insert(ss.dp_rank);
  EXPECT_EQ(ranks.size(), 7u);
  EXPECT_GT(adaptive.num_tokens() / adaptive.estimated_time,
            1.05 * fifo.num_tokens() / fifo.estimated_time);
}

// Long prompts admitted chunk by chunk can fill memory while all are still in
// prefill; the scheduler must preempt to make progress, not stall.
TEST(Scheduler, NoDeadlockWhenEveryRunningSequenceIsInPrefill) {
  auto c = Model();
  auto plan = *MakePlan(c, Policy::kHybrid, 8, Range(7));
  for (PrefillPolicy pp : {PrefillPolicy::kFifo, PrefillPolicy::kAdaptive}) {
    SchedulerConfig cfg;
    cfg.prefill = pp;
    cfg.max_batch_tokens = 64;
    cfg.admit_watermark = 0;
    // Room for 10 blocks of every TP and DP slot.
    Scheduler s(
        cfg, plan, c, 16,
        std::vector<int64_t>(8, 10 * (plan.num_tp_heads_total(0) + plan.num_dp_heads_total())));
    for (int i = 0; i < 4; ++i) ASSERT_TRUE(s.Add(Req(i, 150, 2)).ok());
    DriveResult r = Drive(s, 10000);
    EXPECT_EQ(r.outputs.size(), 4u) << PrefillPolicyName(pp);
  }
}

TEST(Scheduler, SameInputsSamePlans) {
  auto c = Model();
  auto plan = *MakePlan(c, Policy::kHybrid, 8, Range(6));
  auto run = [&] {
    Scheduler s({}, plan, c, 16, std::vector<int64_t>(8, 50000));
    Rng rng(4);
    for (int i = 0; i < 30; ++i) (void)s.Add(Req(i, 1 + static_cast<int>(rng.Below(3000)), 5));
    std::vector<std::tuple<int64_t, int, int, int>> trace;
    while (!s.idle()) {
      StepPlan p = s.Schedule();
      for (auto& ss : p.seqs) trace.emplace_back(ss.seq_id, ss.start, ss.num_tokens, ss.dp_rank);
      s.Update(p, std::vector<int32_t>(p.seqs.size(), 3));
      s.TakeFinished();
    }
    return trace;
  };
  EXPECT_EQ(run(), run());
}

TEST(Scheduler, RefusesBadRequests) {
  auto c = Model();
  auto plan = *MakePlan(c, Policy::kHybrid, 8, Range(8));
  SchedulerConfig cfg;
  cfg.max_model_len = 4096;
  Scheduler s(cfg, plan, c, 16, std::vector<int64_t>(8, 64));
  EXPECT_EQ(s.Add(Req(1, 0, 5)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.Add(Req(1, 5, 0)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.Add(Req(1, 4000, 100)).code(), StatusCode::kOutOfRange);
  auto bad = Req(1, 3, 3);
  bad->tokens[1] = c.vocab_size;
  EXPECT_EQ(s.Add(std::move(bad)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.Add(Req(1, 2000, 100)).code(),
            StatusCode::kResourceExhausted);  // never fits 64 pages
  ASSERT_TRUE(s.Add(Req(1, 16, 1)).ok());
  EXPECT_EQ(s.Add(Req(1, 16, 1)).code(), StatusCode::kInvalidArgument);  // duplicate id
}

TEST(Scheduler, ReconfigureReroutesAndPreempts) {
  auto c = Model();
  auto plan8 = *MakePlan(c, Policy::kHybrid, 8, Range(8));
  Scheduler s({}, plan8, c, 16, std::vector<int64_t>(8, 1 << 20));
  for (int i = 0; i < 16; ++i) ASSERT_TRUE(s.Add(Req(i, 100, 50)).ok());
  for (int k = 0; k < 3; ++k) {
    StepPlan p = s.Schedule();
    s.Update(p, std::vector<int32_t>(p.seqs.size(), 1));
  }
  auto plan7 = *MakePlan(c, Policy::kHybrid, 8, {0, 1, 2, 4, 5, 6, 7});
  std::vector<int64_t> rerouted;
  auto preempted = s.Reconfigure(plan7, std::vector<int64_t>(8, 1 << 20), &rerouted);
  EXPECT_TRUE(preempted.empty());
  EXPECT_FALSE(rerouted.empty());
  for (const Sequence* q : s.Running()) EXPECT_NE(q->dp_rank, 3);
  // Much less memory: some sequences must go.
  preempted = s.Reconfigure(plan7, std::vector<int64_t>(8, 2000), &rerouted);
  EXPECT_FALSE(preempted.empty());
  EXPECT_FALSE(s.kv().OverCapacity());
  ExpectKvBooks(s);
  DriveResult r = Drive(s);
  EXPECT_EQ(r.outputs.size(), 16u);
}

// A plan change that reroutes a sequence off a lost DP rank and then has to
// drop or preempt it releases its KV where it was counted (the old rank), in
// both page-id and counting modes: a long sequence rerouted onto a rank
// holding little must not take that rank's count below zero (the simulator
// aborted on it when a node lost most of its devices).
TEST(Scheduler, ReconfigureReleasesReroutedSequencesWhereTheyWereCounted) {
  auto c = Model();
  auto plan7 = *MakePlan(c, Policy::kHybrid, 8, Range(7));  // DP heads
  auto plan6 = *MakePlan(c, Policy::kHybrid, 8, {0, 1, 2, 4, 5, 6});
  for (bool ids : {true, false}) {
    for (int64_t capacity : {3000, 4000, 5000, 6000, 8000}) {
      SCOPED_TRACE(std::string(ids ? "ids " : "counting ") + std::to_string(capacity));
      SchedulerConfig cfg;
      cfg.kv_page_ids = ids;
      cfg.router = RouterPolicy::kRoundRobin;  // sequence i on rank i
      cfg.max_batch_tokens = 1 << 16;
      Scheduler s(cfg, plan7, c, 16, std::vector<int64_t>(8, 1 << 20));
      for (int i = 0; i < 7; ++i) ASSERT_TRUE(s.Add(Req(i, i == 3 ? 3000 : 20, 200)).ok());
      for (int k = 0; k < 8; ++k) {
        StepPlan p = s.Schedule();
        s.Update(p, std::vector<int32_t>(p.seqs.size(), 1));
      }
      ASSERT_EQ(s.num_running(), 7);
      std::vector<int64_t> rerouted;
      auto preempted = s.Reconfigure(plan6, std::vector<int64_t>(8, capacity), &rerouted);
      EXPECT_EQ(rerouted, std::vector<int64_t>{3});
      EXPECT_FALSE(s.kv().OverCapacity());
      if (ids) ExpectKvBooks(s);
      const auto need = s.kv().PagesUnder(plan6, s.Running());
      for (int d : plan6.active) EXPECT_EQ(s.kv().used(d), need[d]) << d;
      // The long one no longer fits six devices' memory alone: it ends with
      // an error; the short ones give way or stay, and all finish.
      auto ended = s.TakeFinished();
      ASSERT_EQ(ended.size(), 1u);
      EXPECT_EQ(ended[0]->id, 3);
      EXPECT_EQ(ended[0]->finish, FinishReason::kError);
      int finished = 0;
      for (int k = 0; k < 10000 && !s.idle(); ++k) {
        StepPlan q = s.Schedule();
        s.Update(q, std::vector<int32_t>(q.seqs.size(), 1));
        finished += static_cast<int>(s.TakeFinished().size());
      }
      EXPECT_EQ(finished, 6);
    }
  }
}

// The capacity a plan keeps (the server's failsafe_capacity_fraction): the
// reference step of the full plan over a smaller plan's, less than 1 and
// falling with every device lost; the same plan gives exactly 1.
TEST(StepCost, ReferenceStepTimeGrowsAsDevicesAreLost) {
  const ModelConfig c = Model();
  const DeviceSpeed speed;
  const double full =
      ReferenceStepTime(*MakePlan(c, Policy::kHybrid, 8, Range(8)), c, speed, 64, 1024);
  EXPECT_EQ(full,
            ReferenceStepTime(*MakePlan(c, Policy::kHybrid, 8, Range(8)), c, speed, 64, 1024));
  double previous = full;
  for (int alive = 7; alive >= 2; --alive) {
    const double t =
        ReferenceStepTime(*MakePlan(c, Policy::kHybrid, 8, Range(alive)), c, speed, 64, 1024);
    EXPECT_GT(t, previous) << alive << " devices";
    previous = t;
  }
  EXPECT_LT(full / previous, 0.5);  // 2 of 8 devices keep well under half
}

// A plan change moves block tables: a slot a device keeps keeps its pages
// (its KV stays in place); a slot it gains gets new pages and is listed as
// gained; a device that left holds nothing, and one that joins starts afresh.
TEST(Scheduler, ReconfigureMovesBlockTables) {
  auto c = Model();
  auto plan4 = *MakePlan(c, Policy::kHybrid, 4, Range(4));
  Scheduler s({}, plan4, c, 16, std::vector<int64_t>(4, 1 << 20));
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(s.Add(Req(i, 70, 20)).ok());
  for (int k = 0; k < 3; ++k) {
    StepPlan p = s.Schedule();
    s.Update(p, std::vector<int32_t>(p.seqs.size(), 1));
  }
  ExpectKvBooks(s);
  // Pages of every (sequence, device, slot) before.
  auto pages_of = [&](const Plan& plan) {
    std::map<std::tuple<int64_t, int, int>, std::vector<int32_t>> out;
    for (const Sequence* q : s.Running()) {
      for (int d : plan.active) {
        const std::vector<int>& slots = s.kv().Slots(d, q->dp_rank);
        const std::vector<int32_t>& t = s.kv().Table(q->id, d);
        for (size_t i = 0; i < slots.size(); ++i) {
          auto& v = out[{q->id, d, slots[i]}];
          for (int b = 0; b < q->kv_blocks; ++b) v.push_back(t[b * slots.size() + i]);
        }
      }
    }
    return out;
  };
  const auto before = pages_of(plan4);
  auto plan3 = *Replan(plan4, c, {0, 2, 3});
  std::vector<int64_t> rerouted;
  ASSERT_TRUE(s.Reconfigure(plan3, std::vector<int64_t>(4, 1 << 20), &rerouted).empty());
  ExpectKvBooks(s);
  const auto after = pages_of(plan3);
  int kept = 0, gained = 0;
  for (const auto& [key, pages] : after) {
    const auto [id, d, slot] = key;
    const std::vector<int> g = s.kv().GainedSlots(id, d);
    const bool is_gained = std::count(g.begin(), g.end(), slot) > 0;
    auto it = before.find(key);
    if (it == before.end()) {
      EXPECT_TRUE(is_gained) << id << " " << d << " " << slot;
      ++gained;
    } else if (!is_gained) {
      EXPECT_EQ(pages, it->second) << id << " " << d << " " << slot;
      ++kept;
    }
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(gained, 0);
  for (const Sequence* q : s.Running()) EXPECT_TRUE(s.kv().Table(q->id, 1).empty());
  EXPECT_EQ(s.kv().used(1), 0);
  // Device 1 rejoins: it gains every slot, from page 0 on.
  auto plan4b = *Replan(plan3, c, {0, 1, 2, 3});
  ASSERT_TRUE(s.Reconfigure(plan4b, std::vector<int64_t>(4, 1 << 20), &rerouted).empty());
  ExpectKvBooks(s);
  int64_t on_one = 0;
  for (const Sequence* q : s.Running()) {
    EXPECT_EQ(s.kv().GainedSlots(q->id, 1), s.kv().Slots(1, q->dp_rank));
    for (int32_t page : s.kv().Table(q->id, 1)) EXPECT_LT(page, s.kv().used(1));
    on_one += static_cast<int64_t>(s.kv().Table(q->id, 1).size());
  }
  EXPECT_GT(on_one, 0);
  EXPECT_EQ(Drive(s).outputs.size(), 6u);
}

// The simulator's scheduler counts pages without ids: it must decide exactly
// as the engine's does, step by step, through preemptions and a plan change.
TEST(Scheduler, CountingPagesDecidesAsPageIdsDo) {
  auto c = Model();
  auto plan = *MakePlan(c, Policy::kHybrid, 8, Range(8));
  SchedulerConfig with_ids, counting;
  with_ids.max_batch_tokens = counting.max_batch_tokens = 1024;
  counting.kv_page_ids = false;
  // Tight capacity: preemptions happen.
  Scheduler a(with_ids, plan, c, 16, std::vector<int64_t>(8, 6000));
  Scheduler b(counting, plan, c, 16, std::vector<int64_t>(8, 6000));
  Rng rng(5);
  for (int i = 0; i < 40; ++i) {
    const int prompt = 50 + static_cast<int>(rng.Below(600)),
              out = 5 + static_cast<int>(rng.Below(60));
    ASSERT_TRUE(a.Add(Req(i, prompt, out)).ok());
    ASSERT_TRUE(b.Add(Req(i, prompt, out)).ok());
  }
  int steps = 0, preempted = 0;
  auto smaller = *Replan(plan, c, {0, 1, 2, 4, 5, 7});
  int gained = 0;
  while (!a.idle() && steps < 20000) {
    if (steps == 30 || steps == 45) {
      // A loss, then a rejoin: the same sequences move, and each device
      // gains the same slots of each (what the simulator restores).
      const Plan next = steps == 30 ? smaller : *Replan(smaller, c, Range(8));
      std::vector<int64_t> ra, rb;
      EXPECT_EQ(a.Reconfigure(next, std::vector<int64_t>(8, 6000), &ra),
                b.Reconfigure(next, std::vector<int64_t>(8, 6000), &rb));
      EXPECT_EQ(ra, rb);
      for (const Sequence* q : a.Running()) {
        for (int d = 0; d < 8; ++d) {
          EXPECT_EQ(a.kv().GainedSlots(q->id, d), b.kv().GainedSlots(q->id, d))
              << "sequence " << q->id << " device " << d << " step " << steps;
          gained += static_cast<int>(a.kv().GainedSlots(q->id, d).size());
        }
      }
    }
    StepPlan pa = a.Schedule(), pb = b.Schedule();
    ASSERT_EQ(pa.seqs.size(), pb.seqs.size()) << steps;
    for (size_t i = 0; i < pa.seqs.size(); ++i) {
      EXPECT_EQ(pa.seqs[i].seq_id, pb.seqs[i].seq_id);
      EXPECT_EQ(pa.seqs[i].start, pb.seqs[i].start);
      EXPECT_EQ(pa.seqs[i].num_tokens, pb.seqs[i].num_tokens);
    }
    EXPECT_EQ(pa.preempted, pb.preempted);
    preempted += static_cast<int>(pa.preempted.size());
    for (int d = 0; d < 8; ++d) EXPECT_EQ(a.kv().used(d), b.kv().used(d)) << d << " " << steps;
    a.Update(pa, std::vector<int32_t>(pa.seqs.size(), 7));
    b.Update(pb, std::vector<int32_t>(pb.seqs.size(), 7));
    (void)a.TakeFinished();
    (void)b.TakeFinished();
    ++steps;
  }
  EXPECT_TRUE(a.idle() && b.idle());
  EXPECT_GT(preempted, 0);
  EXPECT_GT(gained, 0);
  EXPECT_TRUE(b.kv().CheckInvariants().ok());
  for (int d = 0; d < 8; ++d) EXPECT_EQ(b.kv().used(d), 0);
}

}  // namespace
}  // namespace failsafe
