#include "sim/chaos.h"

#include <gtest/gtest.h>

#include "sim/cost_model.h"
#include "sim/instance.h"
#include "sim/profiles.h"

namespace failsafe {
namespace {

ChaosOptions Short(uint64_t seed) {
  ChaosOptions o;
  o.seed = seed;
  o.faults = 120;
  o.mean_fault_gap_s = 20;
  o.max_prompt = 1024;
  o.max_output = 96;
  return o;
}

TEST(Chaos, SeededFaultsFindNothingAndTheRunRepeatsBitForBit) {
  auto a = RunChaos(Short(11));
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->violations, 0) << a->ToText();
  EXPECT_GE(a->total_faults(), 100) << a->ToText();
  EXPECT_GT(a->faults["kill"], 0);
  EXPECT_GT(a->faults["rejoin"], 0);
  EXPECT_GT(a->faults["cascade"], 0);
  EXPECT_GT(a->faults["slow"], 0);
  EXPECT_GT(a->rebalances, 0) << "a slow device is measured and given a smaller share";
  EXPECT_GT(a->recoveries, 20) << a->ToText();
  EXPECT_GT(a->finished, 0);
  EXPECT_EQ(a->finished + a->failed, a->requests);  // admitted ones
  auto b = RunChaos(Short(11));
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(a->digest, b->digest);
  EXPECT_EQ(a->tokens, b->tokens);
  EXPECT_EQ(a->steps, b->steps);
  EXPECT_EQ(a->virtual_s, b->virtual_s);
  auto c = RunChaos(Short(12));
  ASSERT_TRUE(c.ok());
  EXPECT_NE(a->digest, c->digest);
  EXPECT_EQ(c->violations, 0) << c->ToText();
}

TEST(Chaos, EveryRecoveryModeAndAPartialBackupHoldTheInvariants) {
  for (RecoveryMode mode : {RecoveryMode::kRecompute, RecoveryMode::kHost}) {
    ChaosOptions o = Short(5);
    o.faults = 40;
    o.recovery = mode;
    auto r = RunChaos(o);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->violations, 0) << RecoveryModeName(mode) << ": " << r->ToText();
  }
  ChaosOptions o = Short(6);
  o.faults = 40;
  o.backup_bytes = int64_t{4} << 30;  // a few hundred blocks of the 70B model's KV
  o.page_ids = false;                 // the simulator's counting block manager
  auto r = RunChaos(o);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->violations, 0) << r->ToText();
}

// Sequences sharing cached blocks through every kind of fault: the block
// manager's and the backup's books hold after every step, with page ids and
// counted, and every request gets its tokens.
TEST(Chaos, SharedPrefixesHoldTheInvariantsThroughFaults) {
  for (bool page_ids : {true, false}) {
    ChaosOptions o = Short(21);
    o.faults = 80;
    o.prefix_cache = true;
    o.page_ids = page_ids;
    auto r = RunChaos(o);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->violations, 0) << r->ToText();
    EXPECT_GT(r->recoveries, 10) << r->ToText();
    EXPECT_GT(r->prefix_hit_blocks, 0) << r->ToText();
    EXPECT_GT(r->kept_sharing, 0) << r->ToText();
    EXPECT_EQ(r->finished + r->failed, r->requests);
  }
}

TEST(Chaos, RejectsBadOptions) {
  ChaosOptions o;
  o.mean_fault_gap_s = 0;
  EXPECT_FALSE(RunChaos(o).ok());
  o = ChaosOptions();
  o.model = "no-such-model";
  EXPECT_FALSE(RunChaos(o).ok());
}

// The backup budget is the engine's: KV past it is recomputed after a failure.
TEST(SimExecutor, AFullRecoveryRecomputesWhatTheBackupBudgetLeftOut) {
  auto m = *GetModelProfile("llama-3.1-70b");
  auto hw = *GetHardwareProfile("h100-sxm-80gb");
  int64_t recomputed[2] = {0, 0};
  for (int small = 0; small < 2; ++small) {
    InstanceConfig ic;
    ic.model = m;
    ic.hw = hw;
    ic.recovery = RecoveryMode::kFull;
    ic.backup_bytes = small ? int64_t{1} << 30 : 0;
    auto inst = SimInstance::Create(ic);
    ASSERT_TRUE(inst.ok()) << inst.status().ToString();
    for (int i = 0; i < 16; ++i) ASSERT_TRUE((*inst)->Submit({0, 3000, 200, false}).ok());
    (*inst)->RunUntil(2.0);
    auto rec = (*inst)->Fail(5);
    ASSERT_TRUE(rec.ok()) << rec.status().ToString();
    recomputed[small] = rec->tokens_recomputed;
    EXPECT_GT(rec->weight_pcie_bytes, 0);
    EXPECT_GT(rec->detect_s, 0);
    (*inst)->RunToCompletion(1e6);
    for (const auto& r : (*inst)->results()) EXPECT_EQ(r.tokens, 200);
  }
  EXPECT_EQ(recomputed[0], 0);
  EXPECT_GT(recomputed[1], 0);
}

// Re-planning is the coordinator's work: it costs the profile's modelled
// time on the virtual clock, and the engine's recovery report counts it as
// replanning (for a rejoin as for a failure).
TEST(SimExecutor, ReplanningCostsTheCoordinatorsModelledTime) {
  InstanceConfig ic;
  ic.model = *GetModelProfile("llama-3.1-70b");
  ic.hw = *GetHardwareProfile("h100-sxm-80gb");
  auto inst = SimInstance::Create(ic);
  ASSERT_TRUE(inst.ok()) << inst.status().ToString();
  for (int i = 0; i < 32; ++i) ASSERT_TRUE((*inst)->Submit({0, 1500, 400, false}).ok());
  (*inst)->RunUntil(3);
  const int running = (*inst)->scheduler().num_running();
  ASSERT_GT(running, 0);
  const double planning = ReplanSeconds(ic.hw, (*inst)->plan().shape, running);
  EXPECT_GT(planning, 1e-3);
  auto lost = (*inst)->Fail(5);
  ASSERT_TRUE(lost.ok()) << lost.status().ToString();
  // Replanning (no step failed, nothing aborted), then the plan change on the
  // devices: forming the new group (1 ms) before weights and KV.
  EXPECT_NEAR(lost->replan_s, planning, 1e-6);
  EXPECT_GT(lost->apply_s, 1e-3);
  EXPECT_GE(lost->apply_s + 1e-9, 1e-3 + std::max(lost->weights_s, lost->kv_s));
  (*inst)->RunUntil((*inst)->clock() + 1);  // a step closes the failure's report
  const double t0 = (*inst)->clock();
  const int before = (*inst)->scheduler().num_running();
  auto back = (*inst)->Rejoin(5);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_NEAR(back->replan_s, ReplanSeconds(ic.hw, (*inst)->plan().shape, before), 1e-6);
  EXPECT_NEAR((*inst)->clock() - t0, back->stall_s(), 1e-6);
}

}  // namespace
}  // namespace failsafe
