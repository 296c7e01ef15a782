#include "sim/sim_executor.h"

#include <gtest/gtest.h>

#include "engine/engine.h"
#include "engine/fault_injection.h"
#include "sim/cost_model.h"
#include "sim/profiles.h"

namespace failsafe {
namespace {

struct Rig {
  FakeClock clock;
  std::unique_ptr<SimExecutor> exec;
};

std::unique_ptr<Rig> MakeRig(int num_devices = 8) {
  auto rig = std::make_unique<Rig>();
  SimExecutorOptions o;
  o.model = *GetModelProfile("llama-3.1-70b");
  o.hw = *GetHardwareProfile("h100-sxm-80gb");
  o.num_devices = num_devices;
  auto made = SimExecutor::Create(o, &rig->clock);
  EXPECT_TRUE(made.ok()) << made.status().ToString();
  if (made.ok()) rig->exec = std::move(*made);
  return rig;
}

// Adds positions [start, start + n) of `seq` on DP rank `rank` to `batch`,
// backed up as the engine asks (HostKvBackup::Prepare).
void AddSeq(SimExecutor& e, StepBatch* batch, int64_t seq, int start, int n, int rank) {
  StepSeq st;
  st.seq_id = seq;
  st.start_pos = start;
  st.num_tokens = n;
  st.dp_rank = rank;
  st.token_offset = batch->num_tokens();
  st.logits_row = batch->num_logits_rows++;
  e.backup()->Prepare(seq, start, start + n, &st, &batch->backup_blocks);
  batch->seqs.push_back(st);
  batch->tokens.insert(batch->tokens.end(), n, 1);
}

// The modelled backup writers copy as the devices' do: a step's KV extends
// what a slot holds only when it starts within it, so a sequence that skips
// ahead of its backup (positions the backup never got) claims nothing past
// what it holds. KV a request arrives with (its first step starts past 0:
// a decode instance's prefilled prompt) is copied as it arrives.
TEST(SimExecutor, BackupProgressOnlyGrowsFromWhatTheBackupHolds) {
  auto rig = MakeRig();
  ASSERT_TRUE(rig->exec);
  SimExecutor& e = *rig->exec;
  const int rank = e.plan().active[0];
  StepBatch first;
  AddSeq(e, &first, 1, 0, 32, rank);
  AddSeq(e, &first, 2, 48, 16, rank);  // arrives with the KV of 48 positions
  ASSERT_TRUE(e.Step(first, nullptr).ok());
  int writers = 0;
  for (int d : e.plan().active) {
    const int p = e.backup()->Progress(1, d);
    if (p == 0) continue;  // not a writer of the rank's slots
    ++writers;
    EXPECT_EQ(p, 32) << d;
    EXPECT_EQ(e.backup()->Progress(2, d), 64) << d;
  }
  EXPECT_GT(writers, 0);
  StepBatch gap;
  AddSeq(e, &gap, 1, 40, 1, rank);  // positions 32-39 never reached the backup
  ASSERT_TRUE(e.Step(gap, nullptr).ok());
  for (int d : e.plan().active) {
    EXPECT_LE(e.backup()->Progress(1, d), 32) << "device " << d << " claims KV it never copied";
    EXPECT_LE(e.backup()->Restorable(1, d), 32) << d;
  }
  StepBatch next;
  AddSeq(e, &next, 1, 32, 9, rank);  // continues from what it holds
  ASSERT_TRUE(e.Step(next, nullptr).ok());
  for (int d : e.plan().active) {
    const int p = e.backup()->Progress(1, d);
    EXPECT_TRUE(p == 0 || p == 41) << d << ": " << p;
  }
}

// Two devices down at once, the later one found first: the step in flight
// fails when the first loss is found, not when the last one is, and only the
// device found by then is missing from the alive ones.
TEST(SimExecutor, AStepFailsAtTheEarliestDetection) {
  auto rig = MakeRig();
  ASSERT_TRUE(rig->exec);
  SimExecutor& e = *rig->exec;
  const int64_t t0 = rig->clock.NowNanos();
  ASSERT_TRUE(e.HangDevice(1, 10.0).ok());  // found after 10 s
  ASSERT_TRUE(e.KillDevice(5).ok());        // found after the profile's detection delay
  StepBatch b;
  AddSeq(e, &b, 1, 0, 4, e.plan().active[0]);
  EXPECT_FALSE(e.Step(b, nullptr).ok());
  const int64_t kill_found = e.device_loss(5).detected_ns;
  EXPECT_GT(kill_found, t0);
  EXPECT_EQ(rig->clock.NowNanos(), kill_found);
  const std::vector<int> alive = e.alive_devices();
  EXPECT_EQ(std::count(alive.begin(), alive.end(), 5), 0);
  EXPECT_EQ(std::count(alive.begin(), alive.end(), 1), 1) << "the hang is not found yet";
}

// A DP rank outside the plan's devices is bad input: a clear error from a
// step and from a plan change, never an index past the executor's tables
// (on a plan without DP heads as well, where no rank is checked for being
// active).
TEST(SimExecutor, ADpRankOutsideThePlanIsAnError) {
  auto rig = MakeRig();
  ASSERT_TRUE(rig->exec);
  SimExecutor& e = *rig->exec;
  ASSERT_EQ(e.plan().num_dp_heads_total(), 0);  // eight devices: every head is TP
  for (int rank : {-1, 8, 1000}) {
    StepBatch b;
    StepSeq st;
    st.seq_id = 1;
    st.start_pos = 0;
    st.num_tokens = 4;
    st.dp_rank = rank;
    st.logits_row = b.num_logits_rows++;
    b.seqs.push_back(st);
    b.tokens.assign(4, 1);
    const auto r = e.Step(b, nullptr);
    ASSERT_FALSE(r.ok()) << rank;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << rank;
    EXPECT_NE(r.status().message().find("DP rank"), std::string::npos) << r.status().ToString();
    DeviceRestores restores(8);
    SeqRestore sr;
    sr.seq_id = 1;
    sr.dp_rank = rank;
    sr.restore_tokens = 4;
    restores[0].push_back(sr);
    const auto applied = e.ApplyPlan(e.plan(), RecoveryMode::kFull, restores);
    ASSERT_FALSE(applied.ok()) << rank;
    EXPECT_EQ(applied.status().code(), StatusCode::kInvalidArgument) << rank;
  }
  EXPECT_TRUE(e.held().empty());
}

// An engine over the simulated devices, through a wrapper as the chaos runs
// have it, is told of them only by Configure: a recovery's replanning time
// is the modelled one on the virtual clock, and prefilled requests are
// accepted (an engine not so configured refuses them).
TEST(SimExecutor, ConfigureChargesPlanningAndAcceptsPrefilledRequests) {
  auto rig = MakeRig();
  FaultInjectingExecutor faulty(rig->exec.get());
  EngineOptions eo;
  rig->exec->Configure(&eo);
  SchedulerConfig sc;
  sc.kv_page_ids = false;
  Engine engine(&faulty, sc, eo);
  for (int i = 0; i < 4; ++i) {
    RequestSpec spec;
    spec.prompt.assign(300, 7);
    spec.max_new_tokens = 50;
    if (i == 3) spec.prefilled_output = {5};
    ASSERT_TRUE(engine.Submit(spec).ok()) << i;
  }
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(engine.Step().ok());
  ASSERT_TRUE(FaultsOf(&faulty)->KillDevice(3).ok());
  for (int i = 0; i < 50 && engine.recoveries().empty(); ++i) (void)engine.Step();
  ASSERT_FALSE(engine.recoveries().empty());
  const RecoveryReport& r = engine.recoveries().front();
  const double charged_ms =
      ReplanSeconds(*GetHardwareProfile("h100-sxm-80gb"), rig->exec->plan().shape, 4) * 1e3;
  EXPECT_GT(charged_ms, 0);
  EXPECT_GE(r.replan_ms, charged_ms * 0.5) << "the modelled planning time is on the clock";

  Engine plain(rig->exec.get(), sc);
  RequestSpec prefilled;
  prefilled.prompt = {1, 2, 3};
  prefilled.prefilled_output = {5};
  EXPECT_EQ(plain.Submit(prefilled).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace failsafe
