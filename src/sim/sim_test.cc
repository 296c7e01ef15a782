#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "common/rng.h"
#include "common/scratch_dir.h"
#include "sim/cost_model.h"
#include "sim/experiments.h"
#include "sim/experiments_internal.h"
#include "sim/fit.h"
#include "trace/workload.h"

namespace failsafe {
namespace {

std::vector<int> Range(int n) {
  std::vector<int> v(n);
  for (int i = 0; i < n; ++i) v[i] = i;
  return v;
}

// A step of `n` decodes at context `ctx`, spread over the plan's devices.
StepPlan Decodes(const Plan& plan, int n, int ctx) {
  StepPlan s;
  for (int i = 0; i < n; ++i) {
    s.seqs.push_back({i + 1, ctx, 1, plan.active[i % plan.active.size()], true});
  }
  s.decode_tokens = n;
  return s;
}

StepPlan Prefill(const Plan& plan, int tokens) {
  StepPlan s;
  s.seqs.push_back({1, 0, tokens, plan.active[0], true});
  s.prefill_tokens = tokens;
  return s;
}

std::string TempDir(const std::string& tag = "") {
  std::string d = ProcessScratchDir().Sub(
      ::testing::UnitTest::GetInstance()->current_test_info()->name() + tag);
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

ExperimentOptions Quick(const std::string& out) {
  ExperimentOptions o;
  o.out_dir = out;
  o.quick = true;
  return o;
}

}  // namespace

TEST(CostModel, StepTimeGrowsWithWorkAndShrinksWithDevices) {
  auto m = *GetModelProfile("llama-3.1-70b");
  auto hw = *GetHardwareProfile("h100-sxm-80gb");
  auto tp4 = *MakePlan(m, Policy::kStandard, 8, Range(4));
  auto tp8 = *MakePlan(m, Policy::kStandard, 8, Range(8));
  ClusterCostModel c4(tp4, m, hw), c8(tp8, m, hw);
  // Decode is weight-bound at small batch: 140 GB over four devices' HBM.
  const double d1 = c4.StepSeconds(Decodes(tp4, 1, 1000));
  EXPECT_GT(d1, 141e9 / 4 / hw.hbm_bytes_per_s);
  EXPECT_LT(d1, 141e9 / 4 / hw.hbm_bytes_per_s / 0.5);
  EXPECT_LT(d1, c4.StepSeconds(Decodes(tp4, 64, 1000)));
  EXPECT_LT(c4.StepSeconds(Decodes(tp4, 64, 1000)), c4.StepSeconds(Decodes(tp4, 64, 8000)));
  // Prefill is compute-bound: about 2 x 70e9 FLOPs per token, at most peak.
  const double p4 = c4.StepSeconds(Prefill(tp4, 8192));
  EXPECT_GT(p4, 8192 * 2 * 70e9 / (4 * hw.peak_flops));
  const double p8 = c8.StepSeconds(Prefill(tp8, 8192));
  EXPECT_GT(p4 / p8, 1.4);
  EXPECT_LT(p4 / p8, 2.05);
  // KV capacity: eight devices hold more than four, by more than 2x (the
  // weights take less of each).
  auto k4 = c4.KvCapacityPages(16, 8192), k8 = c8.KvCapacityPages(16, 8192);
  EXPECT_GT(k8[0] * 8, 2 * k4[0] * 4);
}

TEST(CostModel, HybridBalancesAnIrregularGroup) {
  auto m = *GetModelProfile("llama-3.1-70b");
  auto hw = *GetHardwareProfile("h100-sxm-80gb");
  auto nu = *MakePlan(m, Policy::kNonUniform, 8, Range(7));
  auto hy = *MakePlan(m, Policy::kHybrid, 8, Range(7));
  ClusterCostModel cn(nu, m, hw), ch(hy, m, hw);
  // Long-context decode: attention dominates; nonuniform's device with two
  // head groups sets the pace, hybrid spreads the DP heads by request.
  const StepPlan sn = Decodes(nu, 256, 16000), sh = Decodes(hy, 256, 16000);
  EXPECT_LT(ch.StepSeconds(sh), cn.StepSeconds(sn));
  auto per = ch.DeviceSeconds(sh);
  double lo = 1e9, hi = 0;
  for (int d : hy.active) {
    lo = std::min(lo, per[d]);
    hi = std::max(hi, per[d]);
  }
  EXPECT_LT(hi / lo, 1.05);
}

// Seven of eight devices started at time 0: the eighth is down, not alive,
// so a failure of one of the seven is a failure (and a recovery to six).
TEST(SimInstance, ADeviceNotStartedIsNotAlive) {
  auto m = *GetModelProfile("llama-3.1-70b");
  auto hw = *GetHardwareProfile("h100-sxm-80gb");
  auto made = MakeInstance(m, hw, FailsafeTp(7), RecoveryMode::kFull);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  auto inst = std::move(*made);
  ASSERT_TRUE(inst->Submit(SimRequest{0, 1000, 50, false}).ok());
  inst->RunUntil(0.5);
  auto fail = inst->Fail(3);
  ASSERT_TRUE(fail.ok()) << fail.status().ToString();
  EXPECT_EQ(inst->plan().active.size(), 6u);
  inst->RunToCompletion(1e6);
  ASSERT_EQ(inst->results().size(), 1u);
  EXPECT_GE(inst->results()[0].first_token, 0);
}

// A decode instance's request arrives with its first token: with one output
// token in all it is complete on arrival (no token sampled here), and with
// more it gets exactly the rest.
TEST(SimInstance, APrefilledRequestGetsExactlyItsOutputTokens) {
  auto m = *GetModelProfile("llama-3.1-70b");
  auto hw = *GetHardwareProfile("h100-sxm-80gb");
  auto made = MakeInstance(m, hw, FailsafeTp(8), RecoveryMode::kFull);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  auto inst = std::move(*made);
  for (int out : {1, 2, 5}) ASSERT_TRUE(inst->Submit(SimRequest{0, 300, out, true}).ok());
  EXPECT_FALSE(inst->Submit(SimRequest{0, 300, 0, true}).ok());
  inst->RunToCompletion(1e6);
  ASSERT_EQ(inst->results().size(), 3u);
  EXPECT_EQ(inst->results()[0].tokens, 0);
  EXPECT_EQ(inst->results()[0].finish, 0);
  EXPECT_EQ(inst->results()[1].tokens, 1);
  EXPECT_EQ(inst->results()[2].tokens, 4);
  EXPECT_EQ(inst->tokens_out(), 5);
  // The engine itself refuses a prefilled request with nothing to generate.
  RequestSpec spec;
  spec.prompt.assign(10, 0);
  spec.prefilled_output = {0};
  spec.max_new_tokens = 1;
  const auto id = inst->engine().Submit(spec);
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.status().code(), StatusCode::kInvalidArgument);
}

// A saturated instance whose workload it would finish within the warm-up
// (short prompts on a fast instance) keeps its queue topped up: the window
// measures a rate, not nothing.
TEST(SaturatedThroughput, AFastInstanceNeverRunsDry) {
  auto m = *GetModelProfile("mixtral-8x22b");
  auto hw = *GetHardwareProfile("h100-sxm-80gb");
  std::vector<SimRequest> reqs;
  for (int i = 0; i < 40; ++i) reqs.push_back({0, 300 + 10 * i, 200, false});
  for (Phase phase : {Phase::kPrefill, Phase::kDecode}) {
    auto thr = SaturatedThroughput(m, hw, Tp8(), phase, reqs, 50);
    ASSERT_TRUE(thr.ok()) << thr.status().ToString();
    EXPECT_GT(*thr, 0);
  }
}

// The placement chosen by device count (InstanceConfig::policy_for): hybrid
// attention down to 6 devices, cyclic placement on 5, through failures and
// rejoins; every request completes.
TEST(SimInstance, ThePlacementFollowsTheDeviceCount) {
  InstanceConfig ic;
  ic.model = *GetModelProfile("llama-3.1-70b");
  ic.hw = *GetHardwareProfile("h100-sxm-80gb");
  ic.sched = GpuSchedulerConfig(ic.model, FailsafeTp(8));
  ic.policy_for = [](int n) { return n <= 5 ? Policy::kCyclic : Policy::kHybrid; };
  auto made = SimInstance::Create(ic);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  auto inst = std::move(*made);
  Rng rng(11);
  for (int i = 0; i < 80; ++i) {
    SimRequest r{0.05 * i, 500 + static_cast<int>(rng.Below(6000)),
                 20 + static_cast<int>(rng.Below(300)), false};
    ASSERT_TRUE(inst->Submit(r).ok());
  }
  inst->RunUntil(1.0);
  ASSERT_TRUE(inst->Fail(3).ok());
  EXPECT_EQ(inst->plan().policy, Policy::kHybrid);
  inst->RunUntil(2.0);
  ASSERT_TRUE(inst->Fail(std::vector<int>{5, 6}).ok());
  EXPECT_EQ(inst->plan().policy, Policy::kCyclic);
  EXPECT_EQ(inst->plan().num_dp_heads_total(), 0);
  inst->RunUntil(3.0);
  ASSERT_TRUE(inst->Rejoin(3).ok());
  EXPECT_EQ(inst->plan().policy, Policy::kHybrid);
  EXPECT_GT(inst->plan().num_dp_heads_total(), 0);
  inst->RunToCompletion(1e6);
  ASSERT_EQ(inst->results().size(), 80u);
  for (const auto& r : inst->results()) EXPECT_GT(r.finish, 0);
}

// FailSafe's choice at TP5 for Llama-3.1-70B: hybrid attention for prefill
// (the attention projections balance over 5 devices), cyclic placement for
// decode (the DP head groups' replicated weights would take its KV room).
TEST(ChoosePlacement, HybridForPrefillCyclicForDecodeAtTp5) {
  auto m = *GetModelProfile("llama-3.1-70b");
  auto hw = *GetHardwareProfile("h100-sxm-80gb");
  std::vector<SimRequest> reqs;
  Rng rng(5);
  for (int i = 0; i < 300; ++i) {
    reqs.push_back({0, 2000 + static_cast<int>(rng.Below(30000)),
                    100 + static_cast<int>(rng.Below(600)), false});
  }
  double h = 0, c = 0;
  auto pre = ChoosePlacement(m, hw, FailsafeTp(5), Phase::kPrefill, reqs, 30, &h, &c);
  ASSERT_TRUE(pre.ok()) << pre.status().ToString();
  EXPECT_EQ(pre->policy, Policy::kHybrid);
  EXPECT_GT(h, c);
  EXPECT_FALSE(pre->choose_placement);
  auto dec = ChoosePlacement(m, hw, FailsafeTp(5), Phase::kDecode, reqs, 30, &h, &c);
  ASSERT_TRUE(dec.ok()) << dec.status().ToString();
  EXPECT_EQ(dec->policy, Policy::kCyclic);
  EXPECT_GT(c, h);
}

TEST(SimInstance, EveryRequestCompletesThroughFailureAndRejoin) {
  auto m = *GetModelProfile("llama-3.1-70b");
  auto hw = *GetHardwareProfile("h100-sxm-80gb");
  for (RecoveryMode mode : {RecoveryMode::kRecompute, RecoveryMode::kFull}) {
    auto made = MakeInstance(m, hw, FailsafeTp(8), mode);
    ASSERT_TRUE(made.ok()) << made.status().ToString();
    auto inst = std::move(*made);
    Rng rng(7);
    for (int i = 0; i < 60; ++i) {
      SimRequest r{0.05 * i, 500 + static_cast<int>(rng.Below(4000)),
                   20 + static_cast<int>(rng.Below(200)), false};
      ASSERT_TRUE(inst->Submit(r).ok());
    }
    inst->RunUntil(1.0);
    auto fail = inst->Fail(3);
    ASSERT_TRUE(fail.ok()) << fail.status().ToString();
    EXPECT_EQ(inst->plan().active.size(), 7u);
    EXPECT_FALSE(inst->Fail(3).ok());  // already dead
    inst->RunUntil(3.0);
    ASSERT_TRUE(inst->Rejoin(3).ok());
    EXPECT_EQ(inst->plan().active.size(), 8u);
    inst->RunToCompletion(1e6);
    int64_t out = 0;
    for (const auto& r : inst->results()) {
      EXPECT_GT(r.finish, 0);
      EXPECT_GE(r.first_token, r.arrival);
      out += r.tokens;
    }
    EXPECT_EQ(inst->results().size(), 60u);
    EXPECT_EQ(out, inst->tokens_out());
    const SimRecovery& rec = inst->recoveries().front();
    if (mode == RecoveryMode::kRecompute) {
      EXPECT_GT(rec.tokens_recomputed, 0);
      EXPECT_EQ(rec.kv_bytes, 0);
    } else {
      EXPECT_EQ(rec.tokens_recomputed, 0);
      EXPECT_GT(rec.kv_bytes, 0);
      EXPECT_GT(rec.weight_pcie_bytes, 0);
    }
  }
}

// Ten conversations of four turns, `gap` seconds apart, on failsafe-TP8,
// device 3 failing between turns 1 and 2 (at 1.8 gaps): turn k repeats the k
// blocks of 512 tokens turn k - 1 had, then has one of its own. Half a second
// apart, turn 1 still runs when the device fails (its blocks are referenced
// and move with the plan); two seconds apart, turn 1 has finished and the
// plan change drops its unreferenced blocks from the devices.
struct ConversationRun {
  int64_t prompt = 0;    // prompt tokens submitted
  int64_t computed = 0;  // prompt tokens computed
  double ttft_sum = 0;
  PrefixCacheStats stats;
};
ConversationRun RunConversations(const SystemSpec& spec, double gap = 0.5) {
  auto m = *GetModelProfile("llama-3.1-70b");
  auto hw = *GetHardwareProfile("h100-sxm-80gb");
  ConversationRun out;
  auto made = MakeInstance(m, hw, spec, RecoveryMode::kFull);
  EXPECT_TRUE(made.ok()) << made.status().ToString();
  if (!made.ok()) return out;
  auto inst = std::move(*made);
  for (int turn = 0; turn < 4; ++turn) {
    for (int c = 0; c < 10; ++c) {
      SimRequest r{gap * turn + 0.01 * c, 512 * (1 + turn) + 100, 50, false};
      for (int b = 0; b <= turn; ++b) r.hash_ids.push_back(c * 10 + b);
      r.hash_ids.push_back(1000 + c * 10 + turn);
      out.prompt += r.input;
      inst->RunUntil(r.arrival);
      EXPECT_TRUE(inst->Submit(r).ok());
    }
    if (turn == 1) {
      inst->RunUntil(1.8 * gap);
      EXPECT_TRUE(inst->Fail(3).ok());
    }
  }
  inst->RunToCompletion(1e6);
  for (const auto& r : inst->results()) {
    EXPECT_GT(r.finish, 0);
    out.ttft_sum += r.first_token - r.arrival;
  }
  out.stats = inst->scheduler().prefix_cache_stats();
  out.computed = inst->tokens_in();
  return out;
}

// The simulator's scheduler caches prefixes like the engine's: requests that
// share the trace's block ids compute fewer prompt tokens, finish sooner, and
// get through a failure all the same.
TEST(SimInstance, PrefixCacheSavesSharedPromptsThroughAFailure) {
  SystemSpec spec = FailsafeTp(8);
  const ConversationRun off = RunConversations(spec);
  EXPECT_EQ(off.stats.lookup_blocks, 0);
  EXPECT_GE(off.computed, off.prompt);
  spec.prefix_cache = true;
  const ConversationRun on = RunConversations(spec);
  EXPECT_GT(on.stats.hit_rate(), 0.3);
  EXPECT_EQ(on.stats.host_hit_blocks, 0);
  EXPECT_GE(on.computed, on.prompt - on.stats.hit_tokens);
  EXPECT_LT(on.computed, off.computed * 3 / 4);
  EXPECT_LT(on.ttft_sum, off.ttft_sum);
}

// A plan change keeps the cached blocks running requests share: their pages
// move with the plan, no sharer is preempted, and the next turn hits them as
// it would without the failure.
TEST(SimInstance, PlanChangeKeepsTheBlocksRunningRequestsShare) {
  SystemSpec spec = FailsafeTp(8);
  spec.prefix_cache = true;
  const ConversationRun run = RunConversations(spec);
  EXPECT_EQ(run.stats.readmitted_hit_tokens, 0);
  // Every block a turn repeats is a hit, the failure notwithstanding.
  EXPECT_EQ(run.stats.hit_tokens, 10 * (1 + 2 + 3) * 512);
}

// With the host tier, what the plan change dropped from the devices comes
// back from the host backup: turn 2 copies the blocks of finished turn 1
// instead of computing them.
TEST(SimInstance, HostTierServesWhatAPlanChangeDropped) {
  SystemSpec spec = FailsafeTp(8);
  spec.prefix_cache = true;
  const ConversationRun device = RunConversations(spec, 2.0);
  spec.prefix_cache_host = true;
  const ConversationRun host = RunConversations(spec, 2.0);
  EXPECT_EQ(device.stats.host_hit_blocks, 0);
  EXPECT_GT(host.stats.host_hit_blocks, 0);
  EXPECT_GE(host.stats.hit_blocks + host.stats.host_hit_blocks, device.stats.hit_blocks);
  EXPECT_LT(host.computed, device.computed * 4 / 5);
  EXPECT_LT(host.ttft_sum, device.ttft_sum);
}

TEST(Fit, RecoversAKnownProfile) {
  // Steps timed by a known profile; fitting from the default start must
  // predict them again.
  auto m = *GetModelProfile("tiny-llama");
  HardwareProfile truth = *GetHardwareProfile("cpu");
  truth.gemm_efficiency = 0.55;
  truth.attention_efficiency = 0.2;
  truth.bandwidth_efficiency = 0.6;
  truth.gemm_half_rows = 24;
  truth.segment_overhead_s = 40e-6;
  truth.gemv_efficiency = 0.15;
  std::vector<Plan> plans = {*MakePlan(m, Policy::kStandard, 8, Range(2)),
                             *MakePlan(m, Policy::kHybrid, 8, Range(7))};
  std::vector<StepSample> samples;
  Rng rng(3);
  for (int i = 0; i < 80; ++i) {
    StepSample s;
    s.plan = i % 2;
    s.step = i % 3 == 0 ? Prefill(plans[s.plan], 16 + static_cast<int>(rng.Below(400)))
                        : Decodes(plans[s.plan], 1 + static_cast<int>(rng.Below(32)),
                                  16 + static_cast<int>(rng.Below(600)));
    s.seconds = ClusterCostModel(plans[s.plan], m, truth).StepSeconds(s.step);
    samples.push_back(s);
  }
  auto fit = FitProfile(m, *GetHardwareProfile("cpu"), plans, samples);
  ASSERT_TRUE(fit.ok()) << fit.status().ToString();
  EXPECT_EQ(fit->samples, 80);
  EXPECT_LT(fit->mean_abs_error, 0.03);
  for (double r : PredictionRatios(m, fit->profile, plans, samples)) {
    EXPECT_NEAR(r, 1.0, 0.1);
  }
  // Too few samples to fit are refused.
  samples.resize(2);
  EXPECT_FALSE(FitProfile(m, *GetHardwareProfile("cpu"), plans, samples).ok());
}

TEST(Experiments, AblationOrdersTheSystems) {
  auto j = RunExperiment("ablation", Quick(TempDir()));
  ASSERT_TRUE(j.ok()) << j.status().ToString();
  const auto& dec = (*j)["decode_vs_tp4"];
  EXPECT_GT(dec["nonuniform"].get<double>(), 1.1);
  EXPECT_GT(dec["cyclic"].get<double>(), dec["nonuniform"].get<double>());
  EXPECT_GT(dec["failsafe"].get<double>(), dec["cyclic"].get<double>());
  EXPECT_GT(dec["tp8"].get<double>(), dec["failsafe"].get<double>());
  EXPECT_GT((*j)["compute_balancing_prefill_gain"].get<double>(), 1.05);
}

TEST(Experiments, RecoveryModesRankAsDesigned) {
  const std::string dir = TempDir();
  auto j = RunExperiment("recovery", Quick(dir));
  ASSERT_TRUE(j.ok()) << j.status().ToString();
  const double rc = (*j)["recompute"]["latency_ms"], host = (*j)["host"]["latency_ms"],
               full = (*j)["full"]["latency_ms"], oracle = (*j)["oracle"]["latency_ms"];
  EXPECT_GT(rc, host);
  EXPECT_GT(host, full);
  EXPECT_GT(full, oracle);
  EXPECT_GT((*j)["recompute"]["tokens_recomputed"].get<int64_t>(), 0);
  EXPECT_EQ((*j)["full"]["tokens_recomputed"].get<int64_t>(), 0);
  EXPECT_TRUE(std::filesystem::exists(dir + "/recovery.csv"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/recovery_tbt_cdf_full.csv"));
}

TEST(Experiments, OfflineGcpReportsItsHeadlines) {
  const std::string dir = TempDir();
  auto j = RunExperiment("offline-gcp", Quick(dir));
  ASSERT_TRUE(j.ok()) << j.status().ToString();
  const double over_base = (*j)["failsafe_over_baseline"];
  const double over_scaled = (*j)["failsafe_over_fault_scaled"];
  EXPECT_GT(over_base, 1.0);
  // Fault-scaled is linear in the GPUs; the quick run's short windows leave
  // a few per cent of noise around it.
  EXPECT_GT(over_scaled, 0.8);
  EXPECT_LE(over_scaled, 1.05);
  EXPECT_NEAR((*j)["trace_hours"].get<double>(), 27.0, 0.5);
  EXPECT_EQ((*j)["min_gpus"].get<int>(), 3);  // 70B in bf16 on 80 GB devices
  std::ifstream csv(dir + "/offline_gcp.csv");
  std::string header;
  std::getline(csv, header);
  EXPECT_NE(header.find("failsafe_tokens_per_s"), std::string::npos);
}

TEST(Experiments, MixtralOnFourDevicesCannotServe) {
  ExperimentOptions o = Quick(TempDir());
  o.model = "mixtral-8x22b";
  auto j = RunExperiment("ablation", o);
  ASSERT_TRUE(j.ok()) << j.status().ToString();
  EXPECT_TRUE((*j)["decode_vs_tp4"]["failsafe"].is_null());
  EXPECT_GT((*j)["memory_balancing_decode_gain"].get<double>(), 1.0);
}

// The design figures for 70B on 7 GPUs: nonuniform TP puts two head groups
// on one device (twice the KV every token costs it and twice the attention),
// so the node holds about as much KV as that device; cyclic placement evens
// KV out over the layers (not attention within a layer); hybrid attention
// evens both at the price of replicated DP head weights.
TEST(Experiments, DesignFiguresFromThePlans) {
  const std::string out = TempDir("design");
  auto j = RunExperiment("design", Quick(out));
  ASSERT_TRUE(j.ok()) << j.status().ToString();
  const auto& tp7 = (*j)["TP7"];
  EXPECT_DOUBLE_EQ(tp7["nonuniform"]["kv_per_token_max_over_min"].get<double>(), 2.0);
  EXPECT_DOUBLE_EQ(tp7["nonuniform"]["layer_attention_max_over_mean"].get<double>(), 1.75);
  EXPECT_LT(tp7["cyclic"]["kv_per_token_max_over_min"].get<double>(), 1.05);
  EXPECT_DOUBLE_EQ(tp7["cyclic"]["layer_attention_max_over_mean"].get<double>(), 1.75);
  EXPECT_DOUBLE_EQ(tp7["hybrid"]["layer_attention_max_over_mean"].get<double>(), 1.0);
  EXPECT_GT(tp7["cyclic_kv_tokens_over_nonuniform"].get<double>(), 1.5);
  EXPECT_GT(tp7["hybrid"]["weights_gb_max"].get<double>(),
            tp7["cyclic"]["weights_gb_max"].get<double>());
  // At TP5 the three DP head groups' weights leave hybrid less KV than cyclic.
  EXPECT_LT((*j)["TP5"]["hybrid"]["node_kv_tokens"].get<double>(),
            (*j)["TP5"]["cyclic"]["node_kv_tokens"].get<double>());
  EXPECT_TRUE(std::filesystem::exists(out + "/design.csv"));
  EXPECT_TRUE(std::filesystem::exists(out + "/design_tp7.csv"));
}

TEST(Experiments, BadInputGetsAClearError) {
  EXPECT_FALSE(RunExperiment("no-such-experiment", Quick(TempDir("a"))).ok());
  ExperimentOptions o = Quick(TempDir("b"));
  o.model = "gpt-5";
  EXPECT_FALSE(RunExperiment("ablation", o).ok());
  // A malformed availability trace names its line.
  const std::string data = TempDir("data");
  std::filesystem::create_directories(data + "/availability/bamboo/gcloud");
  std::ofstream(data + "/availability/bamboo/gcloud/a100x1-east1b.txt")
      << "2023-01-01, 00:00:00, 64\nnot a line\n";
  o = Quick(TempDir("c"));
  o.data_dir = data;
  auto r = RunExperiment("offline-gcp", o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(":2:"), std::string::npos) << r.status().message();
  // A missing Mooncake trace is reported, not a crash.
  r = RunExperiment("recovery", o);
  ASSERT_FALSE(r.ok());
}

// --requests FILE: any Mooncake-format JSONL, with fields the simulator does
// not use, timestamps out of order and fewer requests than an experiment's
// window; --out creates missing directories.
TEST(Experiments, RequestTraceFromAFileIntoNewDirectories) {
  const std::string dir = TempDir();
  const std::string trace = dir + "/requests.jsonl";
  {
    std::ofstream f(trace);
    Rng rng(7);
    for (int i = 0; i < 60; ++i) {
      const int ts = (i * 997) % 60 * 500;  // a permutation of 0..29.5 s
      f << "{\"timestamp\": " << ts << ", \"input_length\": " << 200 + rng.Below(4000)
        << ", \"output_length\": " << 20 + rng.Below(300) << ", \"hash_ids\": [1, 2]}\n";
    }
  }
  ExperimentOptions o = Quick(dir + "/new/nested/out");
  o.requests_file = trace;
  auto j = RunExperiment("recovery", o);
  ASSERT_TRUE(j.ok()) << j.status().ToString();
  EXPECT_GT((*j)["recompute"]["latency_ms"].get<double>(),
            (*j)["full"]["latency_ms"].get<double>());
  EXPECT_TRUE(std::filesystem::exists(o.out_dir + "/recovery.csv"));
  // A malformed request trace names its line.
  std::ofstream(trace, std::ios::app) << "{\"input_length\": 5}\n";
  o.requests_file = trace;
  auto bad = RunExperiment("ablation", o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find(":61:"), std::string::npos) << bad.status().message();
}

// --availability FILE in the event format, scaled to the cluster.
TEST(Experiments, OfflineReadsEventTracesScaledToTheCluster) {
  ExperimentOptions o = Quick(TempDir());
  o.availability_file = FindDataDir("") + "/availability/bamboo/g4dn-trace.csv";
  o.nodes = 4;
  auto j = RunExperiment("offline-gcp", o);
  ASSERT_TRUE(j.ok()) << j.status().ToString();
  const auto& a = (*j)["availability"];
  EXPECT_EQ(a["format"], "events");
  EXPECT_EQ(a["peak"].get<int>(), 24);
  EXPECT_EQ(a["cluster_gpus"].get<int>(), 32);
  EXPECT_DOUBLE_EQ(a["gpus_per_unit"].get<double>(), 32.0 / 24);
  EXPECT_NEAR((*j)["trace_hours"].get<double>(), 10.63, 0.01);  // from the first event
  EXPECT_GT((*j)["failsafe_over_baseline"].get<double>(), 1.0);
  EXPECT_TRUE(std::filesystem::exists(o.out_dir + "/offline_gcp_availability.csv"));
  // Unscaled counts above the cluster are an error, not clamped.
  o.availability_scale = "none";
  o.nodes = 2;
  auto over = RunExperiment("offline-gcp", o);
  ASSERT_FALSE(over.ok());
  EXPECT_NE(over.status().message().find("exceed the cluster's 16"), std::string::npos)
      << over.status().message();
  o.availability_scale = "clamp";
  EXPECT_FALSE(RunExperiment("offline-gcp", o).ok());
}

// The online sweep raises the rate until P90 TTFT crosses its SLO, and says
// so; the default decode target (25 ms) binds, while decode instances
// saturate below the paper's 40 ms and say that instead.
TEST(Experiments, OnlineSearchesTheRateUntilTheSlo) {
  ExperimentOptions o = Quick(TempDir());
  auto j = RunExperiment("online", o);
  ASSERT_TRUE(j.ok()) << j.status().ToString();
  EXPECT_DOUBLE_EQ((*j)["tbt_slo_ms"].get<double>(), 25.0);
  for (const char* name : {"failsafe-TP7", "nonuniform-TP7", "nonuniform-TP7+adaptive", "TP8"}) {
    const auto& s = (*j)["at_slo"][name];
    EXPECT_TRUE(s["ttft_slo_crossed"].get<bool>()) << name;
    EXPECT_TRUE(s["tbt_slo_crossed"].get<bool>()) << name;
    EXPECT_FALSE(s["tbt_40ms_crossed"].get<bool>()) << name;
    // A binding target: below the saturated capacity.
    EXPECT_LT(s["decode_tokens_per_s_at_tbt_slo"].get<double>(),
              s["decode_tokens_per_s_max"].get<double>())
        << name;
    EXPECT_DOUBLE_EQ(s["decode_tokens_per_s_at_40ms"].get<double>(),
                     s["decode_tokens_per_s_max"].get<double>())
        << name;
    EXPECT_GT(s["prefill_tokens_per_s_at_ttft_slo"].get<double>(), 0) << name;
    // Past the SLO the search goes on to the capacity.
    EXPECT_GT(s["prefill_tokens_per_s_max"].get<double>(),
              s["prefill_tokens_per_s_at_ttft_slo"].get<double>())
        << name;
  }
  EXPECT_GT((*j)["prefill_failsafe_over_nonuniform"].get<double>(), 1.0);
  EXPECT_TRUE(std::filesystem::exists(o.out_dir + "/online_prefill_TP8+adaptive.csv"));
}

}  // namespace failsafe
