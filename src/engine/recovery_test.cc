// Surviving device failures with real processes and SIGKILL: every request
// completes exactly once and its output (greedy or seeded sampling) equals
// the fault-free run's.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>

#include "common/log.h"
#include "common/rng.h"
#include "common/scratch_dir.h"
#include "engine/engine.h"
#include "engine/faults.h"
#include "engine/kv_backup.h"
#include "engine/offline_run.h"
#include "engine/test_support.h"
#include "engine/worker_group.h"
#include "model/synthetic.h"

namespace failsafe {
namespace {

const std::string& Dir(const std::string& preset) { return TestModelDir(preset, 21); }

Workload MakeWorkload(int n, uint64_t seed) {
  Workload w;
  Rng rng(seed);
  for (int i = 0; i < n; ++i) {
    w.requests.push_back(
        {0.0005 * i, 4 + static_cast<int>(rng.Below(200)), 4 + static_cast<int>(rng.Below(40))});
  }
  return w;
}

struct Scenario {
  std::string preset = "tiny-llama";
  std::string model_dir;  // instead of the preset's (written with seed 21)
  int devices = 8;
  Policy policy = Policy::kHybrid;
  RecoveryMode mode = RecoveryMode::kFull;
  int64_t backup_bytes = 64 << 20;
  int backup_seqs = 64;  // sequences the backup tracks at once
  int64_t device_memory = 0;
  int64_t step_timeout_ms = 600000;
  CommKind comm = CommKind::kShm;
  bool prefix_cache = false;
  bool prefix_cache_host = false;  // the backup as the cache's host tier
  int64_t kv_pages = 0;            // per device; 0: what the device memory allows
  int block_size = 16;             // positions per KV page
  DType kv_dtype = DType::kF32;    // what the pages and the backup hold
  std::function<void(WorkerGroup*, int)> before_apply;
  std::function<Policy(int)> policy_for;  // EngineOptions::policy_for
  // After every step that ran.
  std::function<void(Engine&, const StepOutcome&)> on_step;
};

WorkerGroupOptions GroupOptions(const Scenario& s) {
  WorkerGroupOptions o;
  o.model_dir = s.model_dir.empty() ? Dir(s.preset) : s.model_dir;
  o.worker_binary = TestBinary();
  o.num_devices = s.devices;
  o.policy = s.policy;
  o.backup_bytes = s.backup_bytes;
  o.device_memory_bytes = s.device_memory;
  if (s.kv_pages > 0) o.kv_pages = s.kv_pages;
  o.block_size = s.block_size;
  o.kv_dtype = s.kv_dtype;
  o.max_step_tokens = 128;
  o.max_logits_rows = 64;
  o.max_seqs = s.backup_seqs;
  o.step_timeout_ms = s.step_timeout_ms;
  o.comm = s.comm;
  o.collective_timeout_ms = 10000;
  o.log_level = "warn";
  return o;
}

Result<RunSummary> RunScenario(const Scenario& s, const Workload& w,
                               const std::vector<FaultEvent>& faults) {
  FS_ASSIGN_OR_RETURN(auto group, WorkerGroup::Start(GroupOptions(s)));
  SchedulerConfig sc;
  sc.max_batch_tokens = 128;
  sc.max_num_seqs = 64;
  sc.max_model_len = 1024;
  sc.prefix_cache = s.prefix_cache;
  sc.prefix_cache_host = s.prefix_cache_host;
  EngineOptions eo;
  eo.recovery = s.mode;
  eo.policy_for = s.policy_for;
  WorkerGroup* g = group.get();
  if (s.before_apply) eo.before_apply = [&s, g](int attempt) { s.before_apply(g, attempt); };
  Engine engine(group.get(), sc, eo);
  OfflineRunOptions ro;
  ro.faults = faults;
  // Half the requests sample with their own seeds: their text too must not
  // change through failures.
  ro.sample_every = 2;
  if (s.on_step) ro.on_step = [&s, &engine](const StepOutcome& out) { s.on_step(engine, out); };
  return RunOffline(engine, w, ro);
}

const RunSummary& Reference(const std::string& preset, const Workload& w, uint64_t key) {
  static std::map<std::pair<std::string, uint64_t>, RunSummary> cache;
  auto k = std::make_pair(preset, key);
  if (!cache.count(k)) {
    Scenario s;
    s.preset = preset;
    auto r = RunScenario(s, w, {});
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    cache[k] = *r;
  }
  return cache[k];
}

void ExpectSameOutputs(const RunSummary& got, const RunSummary& want, int n) {
  EXPECT_EQ(got.requests_completed, n);
  EXPECT_EQ(got.requests_failed, 0) << got.failure;
  EXPECT_EQ(got.output_tokens, want.output_tokens);
  EXPECT_EQ(got.output_digest, want.output_digest);
}

FaultEvent Kill(int device, int step) { return {false, device, step, -1}; }
FaultEvent Back(int device, int step) { return {true, device, step, -1}; }

class ModeTest : public ::testing::TestWithParam<std::tuple<RecoveryMode, std::string>> {};

// One failure, then two at once, then both back.
TEST_P(ModeTest, FailuresAndRejoinsKeepEveryRequestAndOutput) {
  auto [mode, preset] = GetParam();
  Workload w = MakeWorkload(24, 1);
  const RunSummary& want = Reference(preset, w, 1);
  Scenario s;
  s.preset = preset;
  s.mode = mode;
  auto got = RunScenario(s, w, {Kill(3, 6), Kill(5, 14), Kill(6, 14), Back(3, 22), Back(6, 30)});
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ExpectSameOutputs(*got, want, 24);
  ASSERT_EQ(got->recoveries.size(), 4u);
  EXPECT_EQ(got->recoveries[0].failed_devices, std::vector<int>{3});
  EXPECT_EQ(got->recoveries[1].failed_devices, (std::vector<int>{5, 6}));
  EXPECT_EQ(got->recoveries[2].joined_devices, std::vector<int>{3});
  const RecoveryReport& first = got->recoveries[0];
  if (mode == RecoveryMode::kFull) {
    // Only the dead device's share moves: far less than a whole model. With
    // a head group per device its head becomes a DP head, gathered in pieces
    // (with fewer groups, a replica holds it already).
    if (SyntheticPresetConfig(preset)->num_kv_heads >= 8) {
      EXPECT_GT(first.weight_peer_bytes, 0);
    }
    EXPECT_GT(first.kv_restored_bytes, 0);
  }
  if (mode == RecoveryMode::kRecompute) {
    EXPECT_EQ(first.kv_restored_bytes, 0);
  } else {
    EXPECT_GT(first.kv_restored_bytes, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, ModeTest,
                         ::testing::Values(std::make_tuple(RecoveryMode::kFull, "tiny-llama"),
                                           std::make_tuple(RecoveryMode::kHost, "tiny-llama"),
                                           std::make_tuple(RecoveryMode::kRecompute, "tiny-llama"),
                                           std::make_tuple(RecoveryMode::kFull, "tiny-mixtral"),
                                           std::make_tuple(RecoveryMode::kFull, "tiny-qwen3"),
                                           std::make_tuple(RecoveryMode::kHost, "tiny-qwen2"),
                                           std::make_tuple(RecoveryMode::kFull, "tiny-qwen3-moe"),
                                           std::make_tuple(RecoveryMode::kHost, "tiny-qwen2-moe"),
                                           std::make_tuple(RecoveryMode::kFull, "tiny-phi3"),
                                           std::make_tuple(RecoveryMode::kFull, "tiny-gemma3"),
                                           std::make_tuple(RecoveryMode::kHost, "tiny-gemma2")));

// Gemma 3 as published with its vision tower (Gemma3ForConditionalGeneration,
// sharded): its language model serves through failures and rejoins exactly
// as the text checkpoint of the same weights does.
TEST(VisionLanguageTest, TheLanguageModelServesThroughFailures) {
  Workload w = MakeWorkload(16, 5);
  const RunSummary& want = Reference("tiny-gemma3", w, 5);
  SyntheticModelOptions o;
  o.preset = "tiny-gemma3";
  o.seed = 21;
  o.num_shards = 2;
  o.vision_language_prefix = "language_model.model.";
  Scenario s;
  s.preset = "tiny-gemma3";
  s.model_dir = ProcessScratchDir().Sub("tiny-gemma3-vision-language");
  ASSERT_TRUE(WriteSyntheticModel(s.model_dir, o).ok());
  auto got = RunScenario(s, w, {Kill(2, 5), Kill(6, 9), Back(2, 14)});
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ExpectSameOutputs(*got, want, 16);
  ASSERT_EQ(got->recoveries.size(), 3u);
  EXPECT_GT(got->recoveries[0].kv_restored_bytes, 0);
}

// More devices than head groups (stories260K's shape: 4 groups of 2 query
// heads on 8 devices): replicated groups (nonuniform, cyclic) or pure DP
// attention (hybrid), through failures (device 0 writes the backup of group 0
// in layer 0), down to whole groups on 4 devices, and rejoins back.
class ReplicaTest : public ::testing::TestWithParam<std::tuple<Policy, RecoveryMode>> {};

TEST_P(ReplicaTest, FailuresAndRejoinsKeepEveryRequestAndOutput) {
  auto [policy, mode] = GetParam();
  Workload w = MakeWorkload(16, 9);
  const RunSummary& want = Reference("stories-260k", w, 9);
  Scenario s;
  s.preset = "stories-260k";
  s.policy = policy;
  s.mode = mode;
  auto got = RunScenario(
      s, w, {Kill(0, 4), Kill(3, 8), Kill(5, 8), Kill(6, 12), Back(6, 16), Back(0, 20)});
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ExpectSameOutputs(*got, want, 16);
  std::vector<int> joined;
  for (const RecoveryReport& r : got->recoveries)
    joined.insert(joined.end(), r.joined_devices.begin(), r.joined_devices.end());
  EXPECT_EQ(joined, (std::vector<int>{6, 0}));
  const RecoveryReport& first = got->recoveries[0];
  EXPECT_EQ(first.failed_devices, std::vector<int>{0});
  if (policy != Policy::kHybrid && mode == RecoveryMode::kFull) {
    // Device 0's head group lives on: its replica already caches the KV and
    // only takes device 0's query heads from the host.
    EXPECT_EQ(first.kv_restored_bytes, 0);
    EXPECT_GT(first.weight_host_bytes, 0);
  } else {
    // Pure DP attention: requests whose DP rank was device 0 move with their
    // KV; host mode restores every device's KV.
    EXPECT_GT(first.kv_restored_bytes, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(MoreDevicesThanHeadGroups, ReplicaTest,
                         ::testing::Values(std::make_tuple(Policy::kNonUniform,
                                                           RecoveryMode::kFull),
                                           std::make_tuple(Policy::kCyclic, RecoveryMode::kFull),
                                           std::make_tuple(Policy::kHybrid, RecoveryMode::kFull),
                                           std::make_tuple(Policy::kCyclic, RecoveryMode::kHost)),
                         [](const auto& info) {
                           return std::string(PolicyName(std::get<0>(info.param))) + "_" +
                                  RecoveryModeName(std::get<1>(info.param));
                         });

// The placement policy chosen by device count (EngineOptions::policy_for):
// hybrid attention on 7 or more devices, cyclic placement below, through
// failures and rejoins that cross between them both ways. With 8 head groups
// (tiny-llama) the DP head becomes a TP head and back; with 4 on 8 devices
// (stories-260k) pure DP attention becomes replicated groups and back.
class PolicyChangeTest : public ::testing::TestWithParam<std::tuple<std::string, RecoveryMode>> {};

TEST_P(PolicyChangeTest, EveryRequestOnceSameOutputs) {
  auto [preset, mode] = GetParam();
  Workload w = MakeWorkload(20, 12);
  const RunSummary& want = Reference(preset, w, 12);
  Scenario s;
  s.preset = preset;
  s.mode = mode;
  std::vector<Policy> policies;
  s.policy_for = [&policies](int alive) {
    policies.push_back(alive >= 7 ? Policy::kHybrid : Policy::kCyclic);
    return policies.back();
  };
  auto got = RunScenario(s, w, {Kill(3, 5), Kill(5, 10), Kill(6, 10), Back(3, 16), Back(6, 22)});
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ExpectSameOutputs(*got, want, 20);
  ASSERT_EQ(got->recoveries.size(), 4u);
  EXPECT_NE(std::find(policies.begin(), policies.end(), Policy::kCyclic), policies.end());
  EXPECT_EQ(policies.back(), Policy::kHybrid);
}

INSTANTIATE_TEST_SUITE_P(ByDeviceCount, PolicyChangeTest,
                         ::testing::Values(std::make_tuple("tiny-llama", RecoveryMode::kFull),
                                           std::make_tuple("tiny-llama", RecoveryMode::kHost),
                                           std::make_tuple("stories-260k", RecoveryMode::kFull)),
                         [](const auto& info) {
                           std::string name = std::get<0>(info.param) + "_" +
                                              RecoveryModeName(std::get<1>(info.param));
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

TEST(Recovery, FullModeMovesOnlyTheDeadDevicesShare) {
  Workload w = MakeWorkload(12, 2);
  Scenario full, host;
  host.mode = RecoveryMode::kHost;
  auto a = RunScenario(full, w, {Kill(2, 8)});
  auto b = RunScenario(host, w, {Kill(2, 8)});
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->recoveries.size(), 1u);
  ASSERT_EQ(b->recoveries.size(), 1u);
  // Host mode reloads every device's share; full loads about one device's worth.
  EXPECT_LT(a->recoveries[0].weight_host_bytes * 3, b->recoveries[0].weight_host_bytes);
  EXPECT_LT(a->recoveries[0].kv_restored_bytes, b->recoveries[0].kv_restored_bytes);
}

// Collectives over TCP (gloo): a dead peer closes its connections.
TEST(Recovery, GlooGroupsRecoverToo) {
  Workload w = MakeWorkload(12, 8);
  const RunSummary& want = Reference("tiny-llama", w, 8);
  Scenario s;
  s.devices = 5;
  s.comm = CommKind::kGloo;
  auto got = RunScenario(s, w, {Kill(2, 6), Back(2, 14)});
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ExpectSameOutputs(*got, want, 12);
  EXPECT_EQ(got->recoveries.size(), 2u);
}

// A second device dies while the first recovery is being applied.
TEST(Recovery, FailureDuringRecovery) {
  Workload w = MakeWorkload(16, 3);
  const RunSummary& want = Reference("tiny-llama", w, 3);
  Scenario s;
  bool killed = false;
  s.before_apply = [&killed](WorkerGroup* g, int attempt) {
    if (!killed) {
      killed = true;
      (void)g->KillDevice(6);
    }
  };
  auto got = RunScenario(s, w, {Kill(1, 12)});
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ExpectSameOutputs(*got, want, 16);
  ASSERT_GE(got->recoveries.size(), 1u);
  EXPECT_GE(got->recoveries[0].attempts + static_cast<int>(got->recoveries.size()), 2);
}

// Three failures, and the DP rank of a request in the middle of its prefill.
TEST(Recovery, ThreeFailuresIncludingADpRankMidPrefill) {
  Workload w = MakeWorkload(6, 4);
  w.requests[0].input_len = 700;  // prefilled over several steps of 128 tokens
  const RunSummary& want = Reference("tiny-llama", w, 4);
  Scenario s;
  // With 8 devices there are no DP heads; after one failure (7 devices) there
  // are, and request 1 (the long one) is routed first: to device 0.
  auto got = RunScenario(s, w, {Kill(7, 1), Kill(0, 3), Kill(4, 4)});
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ExpectSameOutputs(*got, want, 6);
  EXPECT_EQ(got->recoveries.size(), 3u);
}

// The backup cannot hold everything: requests without backup recompute.
TEST(Recovery, BackupBehindOrFullRecomputesTheRest) {
  Workload w = MakeWorkload(16, 5);
  const RunSummary& want = Reference("tiny-llama", w, 5);
  Scenario s;
  s.backup_bytes = 20 * 4 * 8 * 2 * 16 * 16 * 4;  // 20 blocks of 16 tokens: a fraction of the KV
  auto got = RunScenario(s, w, {Kill(2, 15)});
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ExpectSameOutputs(*got, want, 16);
  ASSERT_EQ(got->recoveries.size(), 1u);
  EXPECT_GT(got->recoveries[0].tokens_recomputed, 0);
}

// More requests run than the backup tracks: the later ones get their backup
// slot only when others finish, mid-prefill or mid-decode, so the backup
// lacks their first positions. A recovery that leaves such a request where it
// is (pure DP attention: another device died) must not count those positions
// as backed up, or a later failure of its DP rank restores them from backup
// blocks that were never written (other text).
TEST(Recovery, RequestsThatGotTheirBackupLateRestoreOnlyWhatItHolds) {
  Workload w;
  for (int i = 0; i < 24; ++i) w.requests.push_back({0.0, 8 + i, 10 + 4 * i});
  const RunSummary& want = Reference("stories-260k", w, 41);
  Scenario s;
  s.preset = "stories-260k";
  s.backup_seqs = 6;
  // The rejoin moves nothing (pure DP attention on 8 devices); down to 4
  // devices every head group becomes a TP group and every request's KV moves.
  auto got = RunScenario(
      s, w, {Kill(7, 4), Back(7, 40), Kill(1, 44), Kill(2, 46), Kill(3, 48), Kill(4, 50)});
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ExpectSameOutputs(*got, want, 24);
  EXPECT_EQ(got->recoveries.size(), 6u);
}

// A device that dies while the engine frees finished requests fails that
// step; the requests are freed again at the next one, so their backup blocks
// (and slots) come back rather than leak until new requests find none.
TEST(Recovery, RequestsFreedAcrossAFailureReturnTheirBackup) {
  Scenario sc;
  auto group = WorkerGroup::Start(GroupOptions(sc));
  ASSERT_TRUE(group.ok()) << group.status().ToString();
  SchedulerConfig config;
  config.max_batch_tokens = 128;
  config.max_num_seqs = 64;
  config.max_model_len = 1024;
  Engine engine(group->get(), config, EngineOptions());
  for (int i = 0; i < 6; ++i) {
    RequestSpec r;
    for (int t = 0; t < 20 + i; ++t) r.prompt.push_back(3 + (7 * t + i) % 500);
    r.max_new_tokens = 2 + 3 * i;
    ASSERT_TRUE(engine.Submit(r).ok());
  }
  bool killed = false;
  for (int step = 0; step < 200 && !engine.scheduler().idle(); ++step) {
    auto out = engine.Step();
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    bool finished = false;
    for (const TokenEvent& e : out->events) finished |= e.finished;
    // The next step frees the finished request first: on a dead device.
    if (finished && !killed) {
      ASSERT_TRUE((*group)->KillDevice(3).ok());
      killed = true;
    }
  }
  ASSERT_TRUE(killed);
  ASSERT_TRUE(engine.scheduler().idle());
  ASSERT_TRUE(engine.Step().ok());  // frees the last finished requests
  ASSERT_EQ(engine.recoveries().size(), 1u);
  EXPECT_EQ(engine.executor().backup()->blocks_in_use(), 0);
}

// Below what the model needs: requests wait for a rejoin, or fail clearly.
TEST(Recovery, TooFewDevicesWaitForRejoinOrFail) {
  Workload w;
  for (int i = 0; i < 8; ++i) w.requests.push_back({0.0005 * i, 10 + 11 * i, 5 + 4 * i});
  const RunSummary& want = Reference("tiny-llama", w, 6);
  Scenario s;
  s.devices = 4;
  s.device_memory = 6 << 20;  // one device's share is too big for two devices
  auto waited =
      RunScenario(s, w, {Kill(1, 5), Kill(2, 6), Kill(3, 7), Back(2, 1000), Back(3, 1000)});
  ASSERT_TRUE(waited.ok()) << waited.status().ToString();
  ExpectSameOutputs(*waited, want, 8);
  auto failed = RunScenario(s, w, {Kill(1, 5), Kill(2, 6), Kill(3, 7)});
  ASSERT_TRUE(failed.ok()) << failed.status().ToString();
  EXPECT_EQ(failed->requests_completed + failed->requests_failed, 8);
  EXPECT_GT(failed->requests_failed, 0);
  EXPECT_NE(failed->failure.find("cannot serve"), std::string::npos) << failed->failure;
}

// A worker that stops answering (SIGSTOP) misses the step deadline and is
// treated as dead.
TEST(Recovery, HungWorkerIsDeclaredDead) {
  Workload w = MakeWorkload(8, 7);
  const RunSummary& want = Reference("tiny-llama", w, 7);
  WorkerGroupOptions o;
  o.model_dir = Dir("tiny-llama");
  o.worker_binary = TestBinary();
  o.num_devices = 5;
  o.backup_bytes = 64 << 20;
  o.step_timeout_ms = 1500;
  auto group = WorkerGroup::Start(o);
  ASSERT_TRUE(group.ok());
  const pid_t victim = (*group)->device_pid(2);
  ASSERT_GT(victim, 0);  // kill(-1, ...) would signal every process
  ::kill(victim, SIGSTOP);
  SchedulerConfig sc;
  sc.max_model_len = 1024;
  Engine engine(group->get(), sc);
  auto got = RunOffline(engine, w, {});
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->requests_completed, 8);
  ASSERT_EQ(got->recoveries.size(), 1u);
  EXPECT_EQ(got->recoveries[0].failed_devices, std::vector<int>{2});
  (void)want;
}

TEST(Faults, SpecsAndBadInput) {
  auto f = ParseFaults({"device=3@step=40", "device=2@t=2.5s", "rejoin=3@step=90"}, 8);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ((*f)[0].at_step, 40);
  EXPECT_DOUBLE_EQ((*f)[1].at_s, 2.5);
  EXPECT_TRUE((*f)[2].rejoin);
  EXPECT_EQ(ParseFaults({"device=9@step=1"}, 8).status().code(), StatusCode::kOutOfRange);
  EXPECT_NE(ParseFaults({"rejoin=2@step=1"}, 8).status().message().find("rejoins while alive"),
            std::string::npos);
  EXPECT_NE(ParseFaults({"device=2@step=1", "device=2@step=5"}, 8)
                .status()
                .message()
                .find("removed twice"),
            std::string::npos);
  EXPECT_FALSE(ParseFaults({"device=2"}, 8).ok());
  EXPECT_FALSE(ParseFaults({"gpu=2@step=1"}, 8).ok());
  EXPECT_FALSE(ParseFaults({"device=x@step=1"}, 8).ok());
  auto trace = std::filesystem::temp_directory_path() / ("fs_trace_" + std::to_string(::getpid()));
  { std::ofstream(trace) << "1000,remove,nodeA\n2000,remove,nodeA\n"; }
  EXPECT_NE(ParseFaults({"trace=" + trace.string()}, 8).status().message().find("removed twice"),
            std::string::npos);
  { std::ofstream(trace) << "1000,remove,3\n3000,add,3\n"; }
  auto t = ParseFaults({"trace=" + trace.string()}, 8);
  ASSERT_TRUE(t.ok());
  EXPECT_DOUBLE_EQ((*t)[1].at_s, 3.0);
  std::filesystem::remove(trace);
}

}  // namespace
}  // namespace failsafe

namespace failsafe {
namespace {

// Seeded chaos: random SIGKILLs at random moments, with rejoins, on a running
// workload. Every request completes exactly once, with the fault-free outputs.
class ChaosTest : public ::testing::TestWithParam<uint64_t> {};

TEST_P(ChaosTest, EveryRequestOnceSameOutputs) {
  const uint64_t seed = GetParam();
  Workload w = MakeWorkload(80, 100 + seed);
  const RunSummary& want = Reference("tiny-llama", w, 100 + seed);
  Scenario s;
  s.policy = seed % 2 ? Policy::kHybrid : Policy::kCyclic;
  s.mode = seed % 3 == 0 ? RecoveryMode::kHost : RecoveryMode::kFull;
  // Some seeds also kill a device in the middle of a recovery.
  Rng rng(seed);
  s.before_apply = [&rng](WorkerGroup* g, int attempt) {
    if (attempt == 1 && rng.Below(4) == 0) {
      const auto alive = g->alive_devices();
      if (alive.size() > 3) (void)g->KillDevice(alive[rng.Below(alive.size())]);
    }
  };
  auto faults = ChaosSchedule(seed, 8, 3, 24, 4);
  auto got = RunScenario(s, w, faults);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ExpectSameOutputs(*got, want, 80);
  EXPECT_GE(got->recoveries.size(), 12u);
}

INSTANTIATE_TEST_SUITE_P(Seeds, ChaosTest, ::testing::Range<uint64_t>(1, 7));

// The same chaos on prompts that share prefixes, with the prefix cache on;
// the fault-free reference computes every prompt (cache off).
class PrefixChaosTest : public ::testing::TestWithParam<uint64_t> {};

TEST_P(PrefixChaosTest, EveryRequestOnceSameOutputsAsWithoutTheCache) {
  const uint64_t seed = GetParam();
  Workload w = SharedPrefixWorkload(80, 200 + seed);
  const RunSummary& want = Reference("tiny-llama", w, 200 + seed);
  EXPECT_EQ(want.prefix.hit_blocks, 0);
  Scenario s;
  s.prefix_cache = true;
  s.policy = seed % 2 ? Policy::kHybrid : Policy::kCyclic;
  s.mode = seed % 3 == 0 ? RecoveryMode::kHost : RecoveryMode::kFull;
  auto faults = ChaosSchedule(seed, 8, 3, 24, 4);
  auto got = RunScenario(s, w, faults);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ExpectSameOutputs(*got, want, 80);
  EXPECT_GT(got->prefix.hit_blocks, 0);
  EXPECT_GE(got->recoveries.size(), 12u);
}

// Seed 2: cyclic, full recovery; seed 3: hybrid, host recovery.
INSTANTIATE_TEST_SUITE_P(Seeds, PrefixChaosTest, ::testing::Values<uint64_t>(2, 3));

// Checks, after every step, the block manager's and the backup's books, and
// (after draining the devices' backup writers) that every sequence the step
// ran has all its computed KV in the backup on every device writing its
// slots: those that started from a prefix hit too.
struct BackupWatch {
  int steps = 0;
  int seqs = 0;      // sequences checked to be backed up in full
  int sharers = 0;   // of which started from cached blocks
  std::string bad;   // the first violation
  bool full = true;  // the budget holds every block: check the coverage

  void Check(Engine& e, const StepOutcome& out) {
    ++steps;
    HostKvBackup* b = e.executor().backup();
    if (Status st = b->CheckInvariants(); !st.ok() && bad.empty()) bad = st.ToString();
    if (Status st = e.scheduler().kv().CheckInvariants(); !st.ok() && bad.empty())
      bad = st.ToString();
    if (b->blocks_in_use() + b->available_blocks() != b->capacity_blocks() && bad.empty())
      bad = fmt::format("backup: {} blocks in use + {} available of {}", b->blocks_in_use(),
                        b->available_blocks(), b->capacity_blocks());
    if (!full || !e.executor().DrainBackup().ok()) return;  // a device died: the next step fails
    const Plan& plan = e.executor().plan();
    const ModelConfig& c = e.executor().config();
    for (const ScheduledSeq& ss : out.plan.seqs) {
      const Sequence* q = e.scheduler().Find(ss.seq_id);
      if (!q || q->finish != FinishReason::kNone) continue;
      for (int l = 0; l < c.num_layers; ++l) {
        for (int h = 0; h < c.num_kv_heads; ++h) {
          const int w = plan.KvWriter(l, h, q->dp_rank);
          if (w >= 0 && b->Restorable(q->id, w) < q->num_computed && bad.empty())
            bad = fmt::format("sequence {} ({} shared blocks): device {} backed up {} of {}", q->id,
                              e.scheduler().kv().SharedBlocks(q->id), w, b->Restorable(q->id, w),
                              q->num_computed);
        }
      }
      ++seqs;
      sharers += e.scheduler().kv().SharedBlocks(q->id) > 0;
    }
  }
};

// Shared prefixes are backed up once and restored: a sequence that starts
// from cached blocks names their backup blocks and copies only the rest, so
// it is backed up as fully as one that computed them, through SIGKILLed
// devices and rejoins; outputs equal the run without the cache.
class BackupSharingTest : public ::testing::TestWithParam<Policy> {};

TEST_P(BackupSharingTest, SharersAreBackedUpInFullAndOutputsDoNotChange) {
  const Policy policy = GetParam();
  Workload w = SharedPrefixWorkload(40, 300, 16, 2);
  const RunSummary& want = Reference("tiny-llama", w, 300);
  Scenario s;
  s.prefix_cache = true;
  s.policy = policy;
  BackupWatch watch;
  s.on_step = [&watch](Engine& e, const StepOutcome& out) { watch.Check(e, out); };
  auto got = RunScenario(s, w, {Kill(2, 5), Kill(6, 9), Back(2, 14)});
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ExpectSameOutputs(*got, want, 40);
  EXPECT_EQ(watch.bad, "");
  EXPECT_GT(watch.sharers, 0);
  EXPECT_GT(got->backup.shared_blocks, 0);
  EXPECT_GT(got->prefix.hit_blocks, 0);
  ASSERT_GE(got->recoveries.size(), 2u);  // a death while recovering joins that recovery
  EXPECT_GT(got->recoveries[0].kv_restored_bytes, 0);
}

INSTANTIATE_TEST_SUITE_P(Policies, BackupSharingTest,
                         ::testing::Values(Policy::kHybrid, Policy::kCyclic, Policy::kStandard),
                         [](const auto& info) { return std::string(PolicyName(info.param)); });

// A backup of a few blocks: indexed blocks nobody names are evicted for new
// sequences, the books stay right after every step, and outputs do not
// change through failures (what the backup lacks is recomputed).
TEST(BackupSharingTest, ATinyBudgetKeepsItsBooksAndTheOutputs) {
  Workload w = SharedPrefixWorkload(40, 301, 16, 2);
  const RunSummary& want = Reference("tiny-llama", w, 301);
  Scenario s;
  s.prefix_cache = true;
  s.backup_bytes = 24 * 65536;  // 24 blocks of tiny-llama's 64 KiB
  BackupWatch watch;
  watch.full = false;
  s.on_step = [&watch](Engine& e, const StepOutcome& out) { watch.Check(e, out); };
  auto got = RunScenario(s, w, {Kill(3, 6), Kill(5, 12), Back(3, 16)});
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ExpectSameOutputs(*got, want, 40);
  EXPECT_EQ(watch.bad, "");
  EXPECT_GT(watch.steps, 0);
  EXPECT_GT(got->backup.evicted_blocks, 0);
  EXPECT_EQ(got->backup_capacity_blocks, 24);
}

// Host-tier prefix hits: with device memory tight enough that the device
// tier evicts shared blocks, new requests copy them back from the backup
// instead of computing them. Outputs equal the run without any cache on one
// device and on five under every placement; the books (backup and block
// manager) hold after every step, and every sequence is backed up in full.
struct HostTierCase {
  const char* name;
  int devices;
  Policy policy;
  int64_t kv_pages;
};

class HostTierTest : public ::testing::TestWithParam<HostTierCase> {};

TEST_P(HostTierTest, HostHitsHappenAndChangeNoOutput) {
  const HostTierCase c = GetParam();
  Workload w = SharedPrefixWorkload(40, 310, 16, 2);
  const RunSummary& want = Reference("tiny-llama", w, 310);
  Scenario s;
  s.prefix_cache = true;
  s.prefix_cache_host = true;
  s.devices = c.devices;
  s.policy = c.policy;
  s.kv_pages = c.kv_pages;
  BackupWatch watch;
  s.on_step = [&watch](Engine& e, const StepOutcome& out) { watch.Check(e, out); };
  auto got = RunScenario(s, w, {});
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ExpectSameOutputs(*got, want, 40);
  EXPECT_EQ(watch.bad, "");
  EXPECT_GT(got->prefix.evicted_blocks, 0);  // the device tier evicted
  EXPECT_GT(got->prefix.host_hit_blocks, 0);
  EXPECT_EQ(got->prefix.host_hit_tokens, got->prefix.host_hit_blocks * 16);
}

// Hybrid placement needs more pages: a DP rank holds a sequence's DP head
// groups too (16 slots a block on tiny-llama's DP rank, 13 blocks for the
// longest request).
INSTANTIATE_TEST_SUITE_P(Placements, HostTierTest,
                         ::testing::Values(HostTierCase{"one_device", 1, Policy::kNonUniform, 640},
                                           HostTierCase{"standard", 5, Policy::kStandard, 300},
                                           HostTierCase{"nonuniform", 5, Policy::kNonUniform, 160},
                                           HostTierCase{"cyclic", 5, Policy::kCyclic, 160},
                                           HostTierCase{"hybrid", 5, Policy::kHybrid, 240}),
                         [](const auto& info) { return std::string(info.param.name); });

// SIGKILLed devices while requests start from host-tier hits (hybrid
// placement: DP heads): every request once, outputs unchanged, books right
// after every step. With pages of 16 positions, and of 5 and 64 against the
// same reference (pages of 16): the page size changes no output through
// prefix-cache hits on the devices and from the host tier, preemptions and
// the restores, which all move whole pages.
class KilledDuringHostHitsTest : public ::testing::TestWithParam<int> {};

TEST_P(KilledDuringHostHitsTest, EveryRequestOnceWhateverThePageSize) {
  const int block_size = GetParam();
  Workload w = SharedPrefixWorkload(40, 311, 32, 2);
  const RunSummary& want = Reference("tiny-llama", w, 311);
  Scenario s;
  s.prefix_cache = true;
  s.prefix_cache_host = true;
  s.devices = 5;
  s.policy = Policy::kHybrid;
  s.block_size = block_size;
  // About as tight as 240 pages of 16: the same positions, and 16 pages
  // more for the part of a sequence's last pages it does not fill
  // (preemptions still happen, checked below).
  s.kv_pages = 240 * 16 / block_size + 16;
  BackupWatch watch;
  s.on_step = [&watch](Engine& e, const StepOutcome& out) { watch.Check(e, out); };
  auto got = RunScenario(s, w, {Kill(3, 20), Back(3, 35), Kill(1, 50)});
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ExpectSameOutputs(*got, want, 40);
  EXPECT_EQ(watch.bad, "");
  EXPECT_GT(got->prefix.hit_blocks, 0);
  EXPECT_GT(got->prefix.host_hit_blocks, 0);
  EXPECT_GT(got->preemptions, 0);
  EXPECT_GE(got->recoveries.size(), 2u);
}

INSTANTIATE_TEST_SUITE_P(PageSizes, KilledDuringHostHitsTest, ::testing::Values(16, 5, 64));

// A bf16 KV cache (pages and host backup of half the bytes): SIGKILLed
// devices, restores from the backup, a rejoin and host-tier prefix hits on
// five devices change no output of the same cache on eight devices without
// any of them; its outputs are not the f32 cache's (the pages held bf16).
TEST(Recovery, Bf16KvCacheKeepsEveryRequestAndOutputThroughFailures) {
  Workload w = SharedPrefixWorkload(40, 311, 32, 2);
  Scenario ref;
  ref.kv_dtype = DType::kBF16;
  auto want = RunScenario(ref, w, {});
  ASSERT_TRUE(want.ok()) << want.status().ToString();
  EXPECT_NE(want->output_digest, Reference("tiny-llama", w, 311).output_digest);
  Scenario s = ref;
  s.prefix_cache = true;
  s.prefix_cache_host = true;
  s.devices = 5;
  s.policy = Policy::kHybrid;
  s.kv_pages = 256;
  BackupWatch watch;
  s.on_step = [&watch](Engine& e, const StepOutcome& out) { watch.Check(e, out); };
  auto got = RunScenario(s, w, {Kill(3, 20), Back(3, 35), Kill(1, 50)});
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ExpectSameOutputs(*got, *want, 40);
  EXPECT_EQ(watch.bad, "");
  EXPECT_GT(got->prefix.host_hit_blocks, 0);
  ASSERT_GE(got->recoveries.size(), 2u);
  EXPECT_GT(got->recoveries[0].kv_restored_bytes, 0);
}

}  // namespace
}  // namespace failsafe
