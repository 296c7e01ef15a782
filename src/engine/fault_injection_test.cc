// Every error path of Engine::Step and Engine::Recover, driven through the
// fault-injecting wrapper around real worker processes: a step or plan change
// that fails is retried and the outputs do not change, or its requests end
// with the error; the engine never leaves a request without an outcome and
// keeps serving new requests afterwards.
#include "engine/fault_injection.h"
#include "common/scratch_dir.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>

#include "common/rng.h"
#include "engine/engine.h"
#include "engine/test_support.h"
#include "engine/worker_group.h"
#include "model/synthetic.h"

namespace failsafe {
namespace {

const std::string& Dir() { return TestModelDir("tiny-llama", 41); }

// An executor that records which of its methods were called, and can be
// killed (DeviceFaults).
class RecordingExecutor final : public Executor, public DeviceFaults {
 public:
  std::map<std::string, int> calls;
  const ModelConfig& config() const override { return Note("config"), config_; }
  const Plan& plan() const override { return Note("plan"), plan_; }
  Result<StepOutput> Step(const StepBatch&, StepTiming*) override {
    return Note("Step"), StepOutput{};
  }
  Status FreeSeqs(const std::vector<int64_t>&) override { return Note("FreeSeqs"), Status::Ok(); }
  std::vector<int64_t> kv_capacity_pages() const override {
    return Note("kv_capacity_pages"), std::vector<int64_t>{};
  }
  int block_size() const override { return Note("block_size"), 16; }
  bool supports_recovery() const override { return Note("supports_recovery"), true; }
  HostKvBackup* backup() override { return Note("backup"), nullptr; }
  std::vector<int> alive_devices() const override {
    return Note("alive_devices"), std::vector<int>{};
  }
  Status CheckHealth(int64_t) override { return Note("CheckHealth"), Status::Ok(); }
  Status DrainBackup() override { return Note("DrainBackup"), Status::Ok(); }
  Result<std::vector<int64_t>> KvCapacityFor(const Plan&) const override {
    return Note("KvCapacityFor"), std::vector<int64_t>{};
  }
  Result<ApplyReport> ApplyPlan(const Plan&, RecoveryMode, const DeviceRestores&) override {
    return Note("ApplyPlan"), ApplyReport{};
  }
  Status SpawnDevice(int, bool) override { return Note("SpawnDevice"), Status::Ok(); }
  DeviceLoss device_loss(int) const override { return Note("device_loss"), DeviceLoss{}; }
  int device_pid(int) const override { return Note("device_pid"), -1; }
  Status KillDevice(int) override { return Status::Ok(); }
  Status SetDeviceSpeed(int, double) override { return Status::Ok(); }

 private:
  void Note(const std::string& m) const { ++const_cast<RecordingExecutor*>(this)->calls[m]; }
  ModelConfig config_;
  Plan plan_;
};

// Every Executor method called through a stack of wrappers reaches the
// executor underneath once (a wrapper that dropped one, as the fault
// injector once dropped ChargePlanning, would leave it uncalled), and the
// executor's fault interface is found through them.
TEST(ExecutorWrapper, WrappersForwardEveryMethod) {
  RecordingExecutor inner;
  ExecutorWrapper middle(&inner);
  FaultInjectingExecutor top(&middle);
  Executor& e = top;
  Plan plan;
  (void)e.config();
  (void)e.plan();
  (void)e.Step(StepBatch{}, nullptr);
  (void)e.FreeSeqs({});
  (void)e.kv_capacity_pages();
  (void)e.block_size();
  (void)e.supports_recovery();
  (void)e.backup();
  (void)e.alive_devices();
  (void)e.CheckHealth(1);
  (void)e.DrainBackup();
  (void)e.KvCapacityFor(plan);
  (void)e.ApplyPlan(plan, RecoveryMode::kFull, {});
  (void)e.SpawnDevice(0, true);
  (void)e.device_loss(0);
  (void)e.device_pid(0);
  const std::vector<std::string> methods = {"config",
                                            "plan",
                                            "Step",
                                            "FreeSeqs",
                                            "kv_capacity_pages",
                                            "block_size",
                                            "supports_recovery",
                                            "backup",
                                            "alive_devices",
                                            "CheckHealth",
                                            "DrainBackup",
                                            "KvCapacityFor",
                                            "ApplyPlan",
                                            "SpawnDevice",
                                            "device_loss",
                                            "device_pid"};
  for (const std::string& m : methods) EXPECT_EQ(inner.calls[m], 1) << m;
  EXPECT_EQ(inner.calls.size(), methods.size());
  EXPECT_EQ(FaultsOf(&top), static_cast<DeviceFaults*>(&inner));
}

std::vector<RequestSpec> Requests(int n, uint64_t seed) {
  Rng rng(seed);
  std::vector<RequestSpec> out;
  for (int i = 0; i < n; ++i) {
    RequestSpec r;
    const int len = 5 + static_cast<int>(rng.Below(40));
    for (int k = 0; k < len; ++k) r.prompt.push_back(static_cast<int32_t>(rng.Below(512)));
    r.max_new_tokens = 6 + static_cast<int>(rng.Below(10));
    out.push_back(r);
  }
  return out;
}

struct Outcome {
  std::vector<int32_t> tokens;
  bool done = false;
  FinishReason reason = FinishReason::kNone;
  Status error;
};

// Submits the requests and steps until each has an outcome. A Step error
// (the engine cannot serve) stops early: the caller looks at the state.
std::vector<Outcome> Drive(Engine& e, const std::vector<RequestSpec>& reqs,
                           Status* step_error = nullptr,
                           const std::function<void(int step)>& before_step = {}) {
  std::map<int64_t, size_t> index;
  std::vector<Outcome> out(reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    auto id = e.Submit(reqs[i]);
    EXPECT_TRUE(id.ok()) << id.status().ToString();
    if (id.ok()) index[*id] = i;
  }
  auto take = [&](const std::vector<TokenEvent>& events) {
    for (const TokenEvent& ev : events) {
      auto it = index.find(ev.id);
      if (it == index.end()) continue;
      Outcome& o = out[it->second];
      EXPECT_FALSE(o.done) << "an event after the request finished";
      if (ev.token >= 0) o.tokens.push_back(ev.token);
      if (ev.finished) {
        o.done = true;
        o.reason = ev.reason;
        o.error = ev.error;
      }
    }
  };
  // Bounded: a request without an outcome fails the test instead of hanging it.
  for (int steps = 0; steps < 3000 && !e.idle(); ++steps) {
    if (before_step) before_step(steps);
    auto r = e.Step();
    if (!r.ok()) {
      if (step_error) *step_error = r.status();
      return out;
    }
    take(r->events);
  }
  EXPECT_TRUE(e.idle()) << "requests still without an outcome";
  return out;
}

struct Rig {
  std::unique_ptr<WorkerGroup> group;
  std::unique_ptr<FaultInjectingExecutor> faults;
  std::unique_ptr<Engine> engine;

  explicit Rig(int devices = 3) {
    WorkerGroupOptions o;
    o.model_dir = Dir();
    o.worker_binary = TestBinary();
    o.num_devices = devices;
    o.backup_bytes = 32 << 20;
    o.max_step_tokens = 64;
    o.max_logits_rows = 16;
    o.max_seqs = 16;
    auto g = WorkerGroup::Start(o);
    EXPECT_TRUE(g.ok()) << g.status().ToString();
    group = std::move(g).value();
    faults = std::make_unique<FaultInjectingExecutor>(group.get());
    SchedulerConfig sc;
    sc.max_batch_tokens = 64;
    sc.max_num_seqs = 16;
    sc.max_model_len = 512;
    engine = std::make_unique<Engine>(faults.get(), sc);
  }
};

const std::vector<RequestSpec>& Workload() {
  static const std::vector<RequestSpec> w = Requests(6, 5);
  return w;
}

// The fault-free outputs (the scheduler is deterministic: the same requests
// on an idle engine batch the same way every time).
const std::vector<Outcome>& Reference() {
  static const std::vector<Outcome> ref = [] {
    Rig rig;
    return Drive(*rig.engine, Workload());
  }();
  return ref;
}

void ExpectSameAsReference(const std::vector<Outcome>& got) {
  const auto& want = Reference();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_TRUE(got[i].done) << i;
    EXPECT_EQ(got[i].reason, FinishReason::kLength) << i << ": " << got[i].error.ToString();
    EXPECT_EQ(got[i].tokens, want[i].tokens) << i;
  }
}

TEST(FaultInjection, StepErrorsAreRetriedOnAFreshGroup) {
  Rig rig;
  int scenarios = 0;
  for (StatusCode code : {StatusCode::kInternal, StatusCode::kAborted,
                          StatusCode::kDeadlineExceeded, StatusCode::kUnavailable}) {
    for (bool after : {false, true}) {
      // Two failures in a row are retried (a third would fail the step).
      rig.faults->Inject(ExecutorCall::kStep, {Status(code, "injected"), 3, 2, after});
      ExpectSameAsReference(Drive(*rig.engine, Workload()));
      EXPECT_EQ(rig.faults->injected(ExecutorCall::kStep), 2 * ++scenarios);
    }
  }
  // Every retry ran on a fresh group: a recovery without failed devices.
  const auto& recs = rig.engine->recoveries();
  ASSERT_EQ(recs.size(), static_cast<size_t>(scenarios));  // the retries of one step share one
  for (const RecoveryReport& r : recs) {
    EXPECT_TRUE(r.failed_devices.empty());
    EXPECT_EQ(r.attempts, 2);
    EXPECT_TRUE(r.resumed());
  }
}

TEST(FaultInjection, AStepThatKeepsFailingFailsOnlyItsRequests) {
  Rig rig;
  rig.faults->Inject(ExecutorCall::kStep,
                     {Status(StatusCode::kInternal, "device 1: malformed step reply"), 12, 3});
  auto got = Drive(*rig.engine, Workload());
  int failed = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(got[i].done) << i;
    if (got[i].reason == FinishReason::kError) {
      ++failed;
      EXPECT_EQ(got[i].error.code(), StatusCode::kInternal);
      EXPECT_NE(got[i].error.message().find("malformed"), std::string::npos);
    } else {
      EXPECT_EQ(got[i].tokens, Reference()[i].tokens) << i;
    }
  }
  EXPECT_GT(failed, 0);
  EXPECT_LT(failed, static_cast<int>(got.size()));
  // The engine keeps serving.
  rig.faults->Clear(ExecutorCall::kStep);
  ExpectSameAsReference(Drive(*rig.engine, Workload()));
}

TEST(FaultInjection, FreeErrorsResynchroniseTheDevices) {
  Rig rig;
  rig.faults->Inject(ExecutorCall::kFreeSeqs, {Status(StatusCode::kInternal, "injected"), 0, 1});
  ExpectSameAsReference(Drive(*rig.engine, Workload()));
  rig.faults->Inject(ExecutorCall::kFreeSeqs,
                     {Status(StatusCode::kInternal, "injected"), 0, 1, /*after=*/true});
  ExpectSameAsReference(Drive(*rig.engine, Workload()));
  EXPECT_EQ(rig.faults->injected(ExecutorCall::kFreeSeqs), 2);
}

// Real device deaths, with the recovery's own calls failing.
TEST(FaultInjection, RecoveryRetriesFailedPlanChangesAndBackupDrains) {
  Rig rig(5);
  rig.faults->Inject(ExecutorCall::kDrainBackup, {Status(StatusCode::kInternal, "injected"), 0, 1});
  rig.faults->Inject(ExecutorCall::kApplyPlan, {Status(StatusCode::kInternal, "injected"), 0, 1});
  auto kill_at = [&](int step, int device) {
    return [&rig, step, device](int s) {
      if (s == step) {
        ASSERT_TRUE(rig.group->KillDevice(device).ok());
      }
    };
  };
  ExpectSameAsReference(Drive(*rig.engine, Workload(), nullptr, kill_at(5, 2)));
  ASSERT_EQ(rig.engine->recoveries().size(), 1u);
  const RecoveryReport& first = rig.engine->recoveries()[0];
  EXPECT_EQ(first.failed_devices, std::vector<int>{2});
  EXPECT_EQ(first.attempts, 2);
  EXPECT_TRUE(first.resumed());
  EXPECT_EQ(rig.faults->injected(ExecutorCall::kDrainBackup), 1);
  // A plan change whose reply is lost after the devices applied it.
  rig.faults->Inject(ExecutorCall::kApplyPlan,
                     {Status(StatusCode::kDeadlineExceeded, "injected"), 0, 1, /*after=*/true});
  ExpectSameAsReference(Drive(*rig.engine, Workload(), nullptr, kill_at(3, 4)));
  ASSERT_EQ(rig.engine->recoveries().size(), 2u);
  EXPECT_EQ(rig.engine->recoveries()[1].failed_devices, std::vector<int>{4});
  EXPECT_EQ(rig.engine->recoveries()[1].attempts, 2);
  EXPECT_EQ(rig.faults->injected(ExecutorCall::kApplyPlan), 2);
}

// Lost replies of plan changes, at every point of a run: each device dies in
// turn at a different step and comes back, and the reply of the plan change
// after each loss and each rejoin is lost after the devices applied it. The
// retry must restore only what the backup held under the plan before.
TEST(FaultInjection, LostPlanChangeRepliesNeverChangeOutputs) {
  Rig rig(4);
  for (int round = 0; round < 6; ++round) {
    const int device = 1 + round % 3, step = 1 + round;
    rig.faults->Inject(ExecutorCall::kApplyPlan,
                       {Status(StatusCode::kDeadlineExceeded, "injected"), 0, 1, /*after=*/true});
    ExpectSameAsReference(Drive(*rig.engine, Workload(), nullptr, [&](int s) {
      if (s == step) {
        ASSERT_TRUE(rig.group->KillDevice(device).ok());
      }
    }));
    rig.faults->Inject(ExecutorCall::kApplyPlan,
                       {Status(StatusCode::kDeadlineExceeded, "injected"), 0, 1, /*after=*/true});
    ASSERT_TRUE(rig.engine->Rejoin(device).ok()) << round;
  }
  EXPECT_EQ(rig.faults->injected(ExecutorCall::kApplyPlan), 12);
  for (const RecoveryReport& r : rig.engine->recoveries()) EXPECT_GT(r.recovered_ns, 0);
}

// A plan change that keeps failing leaves the engine unable to serve: its
// requests wait (Step says why), fail when asked to, and the next health
// check that finds the devices able to change plan brings it back.
TEST(FaultInjection, APlanChangeThatKeepsFailingDegradesUntilAHealthCheckSucceeds) {
  Rig rig(4);
  rig.faults->Inject(ExecutorCall::kApplyPlan, {Status(StatusCode::kInternal, "injected"), 0, -1});
  Status step_error;
  auto got = Drive(*rig.engine, Workload(), &step_error, [&](int s) {
    if (s == 4) {
      ASSERT_TRUE(rig.group->KillDevice(1).ok());
    }
  });
  EXPECT_EQ(step_error.code(), StatusCode::kUnavailable);
  EXPECT_TRUE(rig.engine->degraded());
  EXPECT_NE(rig.engine->degraded_reason().find("injected"), std::string::npos);
  EXPECT_FALSE(rig.engine->recoveries().back().resumed());
  // Still failing: the health check tries again and says so.
  EXPECT_FALSE(rig.engine->CheckHealth().ok() && !rig.engine->degraded());
  EXPECT_TRUE(rig.engine->degraded());
  rig.faults->Clear(ExecutorCall::kApplyPlan);
  ASSERT_TRUE(rig.engine->CheckHealth().ok());
  EXPECT_FALSE(rig.engine->degraded());
  // The requests that waited complete with the same outputs.
  for (int s = 0; s < 3000 && !rig.engine->idle(); ++s) {
    auto r = rig.engine->Step();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    for (const TokenEvent& e : r->events) {
      Outcome& o = got[e.id - 1];
      if (e.token >= 0) o.tokens.push_back(e.token);
      if (e.finished) {
        o.done = true;
        o.reason = e.reason;
      }
    }
  }
  ExpectSameAsReference(got);
  const RecoveryReport& r = rig.engine->recoveries().back();
  EXPECT_EQ(r.failed_devices, std::vector<int>{1});
  EXPECT_GE(r.attempts, 4);
  EXPECT_TRUE(r.resumed());
  ExpectSameAsReference(Drive(*rig.engine, Workload()));
}

// No plan could be made for the alive devices (an executor error, not a lack
// of memory): the engine degrades and retries at the health check; while it
// cannot serve, failing every request reports kUnavailable with the reason.
TEST(FaultInjection, NoPlanForTheDevicesFailsRequestsWithTheReason) {
  Rig rig(4);
  rig.faults->Inject(ExecutorCall::kKvCapacityFor,
                     {Status(StatusCode::kInternal, "injected capacity"), 0, -1});
  Status step_error;
  Drive(*rig.engine, Workload(), &step_error, [&](int s) {
    if (s == 2) {
      ASSERT_TRUE(rig.group->KillDevice(3).ok());
    }
  });
  EXPECT_EQ(step_error.code(), StatusCode::kUnavailable);
  ASSERT_TRUE(rig.engine->degraded());
  auto events = rig.engine->FailAll(Unavailable("{}", rig.engine->degraded_reason()));
  EXPECT_EQ(events.size(), Workload().size());
  for (const TokenEvent& e : events) {
    EXPECT_TRUE(e.finished);
    EXPECT_EQ(e.reason, FinishReason::kError);
    EXPECT_EQ(e.error.code(), StatusCode::kUnavailable);
    EXPECT_NE(e.error.message().find("injected capacity"), std::string::npos);
  }
  EXPECT_TRUE(rig.engine->idle());
  rig.faults->Clear(ExecutorCall::kKvCapacityFor);
  ASSERT_TRUE(rig.engine->CheckHealth().ok());
  EXPECT_FALSE(rig.engine->degraded());
  ExpectSameAsReference(Drive(*rig.engine, Workload()));
}

TEST(FaultInjection, HealthCheckAndRejoinErrorsAreReported) {
  Rig rig(3);
  rig.faults->Inject(ExecutorCall::kCheckHealth, {Status(StatusCode::kInternal, "injected"), 0, 1});
  EXPECT_EQ(rig.engine->CheckHealth().code(), StatusCode::kInternal);
  EXPECT_TRUE(rig.engine->CheckHealth().ok());
  ASSERT_TRUE(rig.group->KillDevice(0).ok());
  ASSERT_TRUE(rig.engine->CheckHealth().ok());
  EXPECT_EQ(rig.engine->executor().alive_devices(), (std::vector<int>{1, 2}));
  rig.faults->Inject(ExecutorCall::kSpawnDevice,
                     {Status(StatusCode::kUnavailable, "injected spawn"), 0, 1});
  EXPECT_EQ(rig.engine->Rejoin(0).code(), StatusCode::kUnavailable);
  ExpectSameAsReference(Drive(*rig.engine, Workload()));
  ASSERT_TRUE(rig.engine->Rejoin(0).ok());
  EXPECT_EQ(rig.engine->executor().plan().active, (std::vector<int>{0, 1, 2}));
  ExpectSameAsReference(Drive(*rig.engine, Workload()));
}

}  // namespace
}  // namespace failsafe
