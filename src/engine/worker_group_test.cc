// The distributed engine against the single-device engine: for 1 to 8 device
// processes (12 for a model with 4 head groups), every placement policy, dense
// and MoE, shared memory and gloo, f32 weights and bf16 / f16 weights held
// 16-bit on every device, the logits are bit for bit those of the single
// device (exact partial sums, batch-invariant kernels: the placement changes
// nothing). Plus
// failure behaviour: a killed device fails the step fast and the coordinator
// lives on.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

#include "backend/backend.h"
#include "common/clock.h"
#include "common/rng.h"
#include "common/row_error.h"
#include "common/scratch_dir.h"
#include "engine/device_process.h"
#include "engine/executor.h"
#include "engine/host_cpus.h"
#include "engine/kv_tables.h"
#include "engine/local_executor.h"
#include "engine/test_support.h"
#include "engine/worker_group.h"
#include "model/synthetic.h"
#include "placement/plan_stats.h"

namespace failsafe {
namespace {

std::string Binary() { return TestBinary(); }

// A synthetic model: "preset" (f32 weights) or "preset@bf16" / "preset@f16".
const std::string& ModelDir(const std::string& name) {
  const size_t at = name.find('@');
  const std::string type = at == std::string::npos ? "" : name.substr(at + 1);
  return TestModelDir(name.substr(0, at), 3,
                      type == "bf16"  ? DType::kBF16
                      : type == "f16" ? DType::kF16
                                      : DType::kF32);
}

// Three sequences with chunked prefills and decodes, DP ranks spread over
// the active devices. Decode tokens are the reference's greedy choices.
struct Scenario {
  struct Seq {
    int64_t id;
    std::vector<int32_t> tokens;
    int done = 0;
    int dp_slot;
  };
  std::vector<Seq> seqs;
  explicit Scenario(int vocab) {
    Rng rng(9);
    int lens[] = {37, 20, 9};
    for (int i = 0; i < 3; ++i) {
      Seq s{i + 1, {}, 0, i};
      for (int k = 0; k < lens[i]; ++k) s.tokens.push_back(static_cast<int32_t>(rng.Below(vocab)));
      seqs.push_back(s);
    }
  }
  // The next batch: prefill chunks of at most 20 tokens, then decodes.
  StepBatch Next(const std::vector<int>& active) {
    StepBatch b;
    for (auto& s : seqs) {
      int remaining = static_cast<int>(s.tokens.size()) - s.done;
      int n = std::min(remaining, 20);
      StepSeq ss;
      ss.seq_id = s.id;
      ss.start_pos = s.done;
      ss.num_tokens = n;
      ss.dp_rank = active[(s.dp_slot * 3) % active.size()];
      ss.token_offset = b.num_tokens();
      ss.logits_row = s.done + n == static_cast<int>(s.tokens.size()) ? b.num_logits_rows++ : -1;
      b.seqs.push_back(ss);
      b.tokens.insert(b.tokens.end(), s.tokens.begin() + s.done, s.tokens.begin() + s.done + n);
    }
    return b;
  }
  void Advance(const StepBatch& b, const float* ref_logits, int vocab) {
    for (size_t i = 0; i < b.seqs.size(); ++i) {
      seqs[i].done += b.seqs[i].num_tokens;
      if (b.seqs[i].logits_row >= 0) {
        const float* row = ref_logits + static_cast<int64_t>(b.seqs[i].logits_row) * vocab;
        seqs[i].tokens.push_back(static_cast<int32_t>(std::max_element(row, row + vocab) - row));
      }
    }
  }
};

DirectKvTables Tables(const Executor& e) {
  return DirectKvTables(e.plan(), e.block_size(), e.kv_capacity_pages());
}

void ExpectParity(const std::string& preset, int devices, Policy policy, CommKind comm) {
  const std::string& dir = ModelDir(preset);
  auto local = LocalExecutor::Create(dir, {});
  ASSERT_TRUE(local.ok()) << local.status().ToString();
  WorkerGroupOptions o;
  o.model_dir = dir;
  o.worker_binary = Binary();
  o.num_devices = devices;
  o.policy = policy;
  o.comm = comm;
  o.max_logits_rows = 8;
  auto group = WorkerGroup::Start(o);
  ASSERT_TRUE(group.ok()) << group.status().ToString();
  const int vocab = (*local)->config().vocab_size;
  Scenario sc(vocab);
  // Each executor's pages, as an engine's scheduler would hand them out.
  DirectKvTables local_kv = Tables(**local), group_kv = Tables(**group);
  double worst = 0;
  for (int step = 0; step < 10; ++step) {
    StepBatch b = sc.Next((*group)->plan().active);
    StepBatch one = b;
    ASSERT_TRUE(local_kv.Fill(&one).ok());
    ASSERT_TRUE(group_kv.Fill(&b).ok());
    auto want = (*local)->Step(one, nullptr);
    ASSERT_TRUE(want.ok()) << want.status().ToString();
    std::vector<float> ref(want->logits,
                           want->logits + static_cast<size_t>(b.num_logits_rows) * vocab);
    StepTiming timing;
    auto got = (*group)->Step(b, &timing);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    for (int r = 0; r < b.num_logits_rows; ++r) {
      const float* g = got->logits + static_cast<int64_t>(r) * vocab;
      const float* w = ref.data() + static_cast<int64_t>(r) * vocab;
      worst = std::max(worst, RowError(g, w, vocab));
      // Bit for bit: partial sums are exact and every kernel batch-invariant.
      ASSERT_TRUE(std::equal(g, g + vocab, w)) << "logits differ at step " << step << " row " << r;
    }
    EXPECT_EQ(timing.devices.size(), (*group)->plan().active.size());
    EXPECT_GT(timing.emulated_ns, 0);
    sc.Advance(b, ref.data(), vocab);
  }
  EXPECT_EQ(worst, 0.0);
}

class ParityTest : public ::testing::TestWithParam<std::tuple<std::string, int, Policy>> {};

TEST_P(ParityTest, MatchesSingleDevice) {
  auto [preset, devices, policy] = GetParam();
  ExpectParity(preset, devices, policy, CommKind::kShm);
}

std::string Name(const ::testing::TestParamInfo<ParityTest::ParamType>& info) {
  std::string p = std::get<0>(info.param);
  std::replace(p.begin(), p.end(), '-', '_');
  std::replace(p.begin(), p.end(), '@', '_');
  return p + "_" + std::to_string(std::get<1>(info.param)) + "dev_" +
         PolicyName(std::get<2>(info.param));
}

INSTANTIATE_TEST_SUITE_P(AllConfigs, ParityTest,
                         ::testing::Combine(::testing::Values("tiny-llama", "tiny-mixtral"),
                                            ::testing::Range(1, 9),
                                            ::testing::Values(Policy::kStandard,
                                                              Policy::kNonUniform, Policy::kCyclic,
                                                              Policy::kHybrid)),
                         Name);

// 16-bit weights, held 16-bit on every device: the same exactness.
INSTANTIATE_TEST_SUITE_P(SixteenBit, ParityTest,
                         ::testing::Combine(::testing::Values("tiny-llama@bf16",
                                                              "tiny-mixtral@bf16",
                                                              "tiny-mixtral@f16"),
                                            ::testing::Values(1, 3, 5),
                                            ::testing::Values(Policy::kCyclic, Policy::kHybrid)),
                         Name);

// More devices than head groups, with real worker processes: stories260K's
// shape (4 groups of 2 query heads) on 5, 8 and 12 devices. Every count from
// 1 to 12 on models with 1, 2, 3, 4 and 8 groups runs in-process in
// src/worker/device_parity_test.cc.
INSTANTIATE_TEST_SUITE_P(MoreDevicesThanHeadGroups, ParityTest,
                         ::testing::Combine(::testing::Values("stories-260k"),
                                            ::testing::Values(5, 8, 12),
                                            ::testing::Values(Policy::kStandard,
                                                              Policy::kNonUniform, Policy::kCyclic,
                                                              Policy::kHybrid)),
                         Name);

TEST(GlooParity, HybridAndCyclicOverTcp) {
  ExpectParity("tiny-llama", 3, Policy::kHybrid, CommKind::kGloo);
  ExpectParity("tiny-mixtral", 5, Policy::kCyclic, CommKind::kGloo);
}

// A sequence's logits do not depend on its company or its chunking: prefilled
// in one chunk alone, or in three chunks beside other sequences; decoded
// alone, or beside seven others; on one device or on four. Bit for bit.
TEST(BatchInvariance, ASequencesLogitsDoNotDependOnItsCompany) {
  const std::string& dir = ModelDir("tiny-llama");
  const int vocab = 512;
  Rng rng(77);
  std::vector<int32_t> a(45), other(60);
  for (auto& t : a) t = static_cast<int32_t>(rng.Below(vocab));
  for (auto& t : other) t = static_cast<int32_t>(rng.Below(vocab));
  auto seq = [](int64_t id, int start, int n, int offset, int row, int dp = 0) {
    StepSeq s;
    s.seq_id = id;
    s.start_pos = start;
    s.num_tokens = n;
    s.token_offset = offset;
    s.logits_row = row;
    s.dp_rank = dp;
    return s;
  };
  // Logits of sequence 1's last row in each step, after the same tokens.
  auto run = [&](Executor& e, bool crowded) {
    std::vector<std::vector<float>> rows;
    DirectKvTables kv = Tables(e);
    auto step = [&](StepBatch b, int row) {
      b.num_logits_rows = 0;
      for (const StepSeq& s : b.seqs) b.num_logits_rows += s.logits_row >= 0;
      EXPECT_TRUE(kv.Fill(&b).ok());
      auto l = e.Step(b, nullptr);
      EXPECT_TRUE(l.ok()) << l.status().ToString();
      rows.emplace_back(l->logits + static_cast<int64_t>(row) * vocab,
                        l->logits + (row + 1) * vocab);
    };
    const std::vector<int> active = e.plan().active;
    auto dp = [&](int i) { return active[i % active.size()]; };
    if (!crowded) {
      StepBatch b;
      b.seqs = {seq(1, 0, 45, 0, 0, dp(0))};
      b.tokens = a;
      step(b, 0);
    } else {
      // Chunks of 20, 20 and 5 with other sequences in the same steps.
      for (int c = 0; c < 3; ++c) {
        StepBatch b;
        const int start = 20 * c, n = c < 2 ? 20 : 5;
        b.seqs = {seq(100 + c, 0, 10 + 5 * c, 0, 0, dp(c + 1)),
                  seq(1, start, n, 10 + 5 * c, c == 2 ? 1 : -1, dp(0))};
        b.tokens.assign(other.begin(), other.begin() + 10 + 5 * c);
        b.tokens.insert(b.tokens.end(), a.begin() + start, a.begin() + start + n);
        if (c == 2) step(b, 1);
        if (c < 2) {
          b.num_logits_rows = 1;
          EXPECT_TRUE(kv.Fill(&b).ok());
          EXPECT_TRUE(e.Step(b, nullptr).ok());
        }
      }
    }
    for (int d = 0; d < 4; ++d) {
      const int32_t tok = static_cast<int32_t>((7 * d + 3) % vocab);
      StepBatch b;
      int row = 0;
      if (crowded) {
        for (int o = 0; o < 7; ++o) {
          b.seqs.push_back(seq(200 + o, d, 1, o, o, dp(o)));
          b.tokens.push_back(other[o]);
        }
        row = 7;
      }
      b.seqs.push_back(seq(1, 45 + d, 1, row, row, dp(0)));
      b.tokens.push_back(tok);
      step(b, row);
    }
    return rows;
  };
  auto local = LocalExecutor::Create(dir, {});
  ASSERT_TRUE(local.ok());
  const auto want = run(**local, false);
  WorkerGroupOptions o;
  o.model_dir = dir;
  o.worker_binary = Binary();
  o.num_devices = 4;
  o.policy = Policy::kHybrid;
  o.max_logits_rows = 16;
  auto group = WorkerGroup::Start(o);
  ASSERT_TRUE(group.ok()) << group.status().ToString();
  auto local2 = LocalExecutor::Create(dir, {});
  ASSERT_TRUE(local2.ok());
  EXPECT_EQ(run(**local2, true), want) << "one device, crowded";
  EXPECT_EQ(run(**group, true), want) << "four devices, crowded";
}

TEST(WorkerGroup, KilledDeviceFailsTheStepFastAndTheCoordinatorLivesOn) {
  WorkerGroupOptions o;
  o.model_dir = ModelDir("tiny-llama");
  o.worker_binary = Binary();
  o.num_devices = 4;
  o.policy = Policy::kHybrid;
  auto group = WorkerGroup::Start(o);
  ASSERT_TRUE(group.ok()) << group.status().ToString();
  // A long prefill, so that the kill lands mid-step.
  StepBatch b;
  b.seqs.push_back({1, 0, 4000, 0, 0, 0});
  b.tokens.assign(4000, 7);
  b.num_logits_rows = 1;
  ASSERT_TRUE(Tables(**group).Fill(&b).ok());
  std::thread killer([&] {
    ::usleep(20000);
    (void)(*group)->KillDevice(2);
  });
  int64_t t0 = MonotonicNanos();
  auto r = (*group)->Step(b, nullptr);
  killer.join();
  const double secs = (MonotonicNanos() - t0) * 1e-9;
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(r.status().message().find("2"), std::string::npos);
  EXPECT_EQ((*group)->dead_devices(), std::vector<int>{2});
  EXPECT_LT(secs, 10.0);
  // The survivors are alive and answer.
  EXPECT_TRUE((*group)->FreeSeq(1).ok());
  for (int d : {0, 1, 3}) EXPECT_EQ(::kill((*group)->device_pid(d), 0), 0);
}

TEST(WorkerGroup, BadInputFailsBeforeAnyProcessStarts) {
  WorkerGroupOptions o;
  o.model_dir = ModelDir("tiny-llama");
  o.worker_binary = "/nonexistent";
  o.num_devices = 4;
  o.alive = {0, 4};
  EXPECT_EQ(WorkerGroup::Start(o).status().code(), StatusCode::kOutOfRange);
  o.alive = {};
  o.num_devices = 0;
  EXPECT_EQ(WorkerGroup::Start(o).status().code(), StatusCode::kInvalidArgument);
  // Weights that do not fit the device memory: refused before spawning.
  o.num_devices = 7;
  o.policy = Policy::kNonUniform;
  o.device_memory_bytes = 1 << 20;
  auto st = WorkerGroup::Start(o).status();
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(st.message().find("device 0 needs"), std::string::npos) << st.message();
}

// One device in this process keeps the budget a device process keeps: the
// KV pool is what the weights and a step's activations leave of it.
TEST(LocalExecutor, KeepsItsDeviceMemory) {
  const std::string& dir = ModelDir("tiny-llama");
  auto open = LocalExecutor::Create(dir, {});
  ASSERT_TRUE(open.ok()) << open.status().ToString();
  const Executor& unlimited = **open;
  const int64_t weights = PlanCosts(unlimited.plan(), unlimited.config())[0].weight_bytes;
  LocalExecutorOptions o;
  o.max_step_tokens = 256;
  const int64_t reserve = ActivationReserveBytes(unlimited.config(), o.max_step_tokens);
  o.device_memory_bytes = weights + reserve + 1000 * unlimited.kv_page_bytes();
  auto budgeted = LocalExecutor::Create(dir, o);
  ASSERT_TRUE(budgeted.ok()) << budgeted.status().ToString();
  EXPECT_EQ((*budgeted)->kv_capacity_pages()[0], 1000);
  EXPECT_LT((*budgeted)->kv_capacity_pages()[0], unlimited.kv_capacity_pages()[0]);
  o.device_memory_bytes = weights;  // no room for a step, let alone KV
  EXPECT_EQ(LocalExecutor::Create(dir, o).status().code(), StatusCode::kResourceExhausted);
}

// Worker processes wait passively where the host's devices' threads
// outnumber its CPUs, and as OpenMP does by default elsewhere.
TEST(WorkerEnvironment, PassiveOnlyWhereThreadsOutnumberCpus) {
  const std::vector<std::string> passive = {"OMP_WAIT_POLICY=passive"};
  EXPECT_EQ(WorkerEnvironment(2, 2, 2, false), passive);
  EXPECT_EQ(WorkerEnvironment(8, 2, 4, false), passive);
  EXPECT_TRUE(WorkerEnvironment(1, 2, 2, false).empty());
  EXPECT_TRUE(WorkerEnvironment(2, 2, 4, false).empty());
  EXPECT_TRUE(WorkerEnvironment(8, 1, 2, false).empty());  // one thread: no waits
  EXPECT_TRUE(WorkerEnvironment(2, 2, 2, true).empty());   // the operator's choice
  EXPECT_GE(HostCpus(), 1);
}

// A worker process gets our environment with the variables given added or
// replacing ours.
TEST(DeviceProcess, SpawnAddsAndReplacesEnvironmentVariables) {
  struct Unset {
    ~Unset() {
      ::unsetenv("FAILSAFE_SPAWN_TEST");
      ::unsetenv("FAILSAFE_SPAWN_REPLACED");
    }
  } unset;
  ASSERT_EQ(::setenv("FAILSAFE_SPAWN_TEST", "ours", 1), 0);
  ASSERT_EQ(::setenv("FAILSAFE_SPAWN_REPLACED", "ours", 1), 0);
  auto p = DeviceProcess::Spawn(Binary(), "warn",
                                {"FAILSAFE_SPAWN_REPLACED=theirs", "FAILSAFE_SPAWN_ADDED=1"});
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  const std::string proc = "/proc/" + std::to_string((*p)->pid());
  auto read = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  // Until its exec the child runs our program, with our environment. The
  // kernel points /proc/<pid>/exe at the new program before it has laid out
  // the new environment, and /proc/<pid>/environ reads empty in between: wait
  // for both.
  const std::filesystem::path program = std::filesystem::canonical(Binary());
  std::string env;
  auto running = [&] {
    std::error_code ec;
    if (std::filesystem::read_symlink(proc + "/exe", ec) != program) return false;
    env = read(proc + "/environ");
    return !env.empty();
  };
  const int64_t deadline = MonotonicNanos() + 10'000'000'000LL;
  while (!running() && MonotonicNanos() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ASSERT_FALSE(env.empty()) << "the worker did not start " << program;
  std::vector<std::string> vars;
  for (size_t at = 0; at < env.size();) {
    const size_t end = env.find('\0', at);
    vars.push_back(env.substr(at, end - at));
    at = end == std::string::npos ? env.size() : end + 1;
  }
  auto count = [&](const std::string& v) { return std::count(vars.begin(), vars.end(), v); };
  EXPECT_EQ(count("FAILSAFE_SPAWN_TEST=ours"), 1);
  EXPECT_EQ(count("FAILSAFE_SPAWN_REPLACED=theirs"), 1);
  EXPECT_EQ(count("FAILSAFE_SPAWN_REPLACED=ours"), 0);
  EXPECT_EQ(count("FAILSAFE_SPAWN_ADDED=1"), 1);
}

// A fenced worker's process is reaped once it has exited, which a rejoin
// waits for (what it held, a GPU's memory too, is freed only then); a
// running one is not.
TEST(DeviceProcess, WaitExitReapsAKilledWorker) {
  auto p = DeviceProcess::Spawn(Binary(), "warn");
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  const pid_t pid = (*p)->pid();
  EXPECT_FALSE((*p)->WaitExit(50));    // it waits for its requests
  ASSERT_EQ(::kill(pid, SIGSTOP), 0);  // hung, as a fenced device may be
  (*p)->Kill();
  EXPECT_TRUE((*p)->WaitExit(10000));
  EXPECT_TRUE((*p)->Reap());
  EXPECT_NE(::kill(pid, 0), 0);  // reaped: gone
}

}  // namespace
}  // namespace failsafe
