// Slow devices on the simulator: a device's speed stretches its part of
// every step, the engine's slow-device monitor measures it from the
// executor's per-device timings and rebalances, and a device merely slower
// than its peers is not a hang (one that stops for longer than the step's
// deadline is).
#include <gtest/gtest.h>

#include "sim/instance.h"
#include "sim/profiles.h"

namespace failsafe {
namespace {

InstanceConfig Config(bool rebalance) {
  InstanceConfig ic;
  ic.model = *GetModelProfile("llama-3.1-70b");
  ic.hw = *GetHardwareProfile("h100-sxm-80gb");
  ic.sched.max_num_seqs = 128;
  ic.sched.max_batch_tokens = 2048;
  ic.sched.max_model_len = 8192;
  ic.rebalance_slow = rebalance;
  return ic;
}

// An offline batch: `n` requests of 1500 prompt and 400 output tokens.
void SubmitBatch(SimInstance* inst, int n) {
  for (int i = 0; i < n; ++i) ASSERT_TRUE(inst->Submit({inst->clock(), 1500, 400, false}).ok());
}

int64_t Rebalances(SimInstance& inst) {
  int64_t n = 0;
  for (const RecoveryReport& r : inst.engine().recoveries()) n += r.rebalance;
  return n;
}

// Tokens served in `seconds` of virtual time with device 3 at `speed`.
struct Served {
  int64_t tokens = 0;
  int64_t rebalances = 0;
  std::vector<MeasuredSpeed> speeds;
  Plan plan;
  int alive = 0;
};

Served Serve(double speed, bool rebalance, double seconds) {
  Served s;
  auto inst = SimInstance::Create(Config(rebalance));
  EXPECT_TRUE(inst.ok()) << inst.status().ToString();
  if (!inst.ok()) return s;
  if (speed < 1) {
    EXPECT_TRUE((*inst)->executor().SetDeviceSpeed(3, speed).ok());
  }
  SubmitBatch(inst->get(), 400);
  (*inst)->RunUntil(seconds);
  s.tokens = (*inst)->tokens_out();
  s.rebalances = Rebalances(**inst);
  s.speeds = (*inst)->engine().device_speeds();
  s.plan = (*inst)->plan();
  s.alive = static_cast<int>((*inst)->executor().alive_devices().size());
  return s;
}

int Shards(const Plan& plan, int device) {
  int n = 0;
  for (const auto& layer : plan.layers) n += static_cast<int>(layer.ffn_shards[device].size());
  return n;
}

// Each step reports what every device did, as the workers do: a device at
// half speed takes twice its peers' compute time for the same work, and the
// step lasts as long as it does.
TEST(SimSlowDevice, StepTimingsArePerDeviceAndTheSlowestSetsTheStep) {
  FakeClock clock;
  SimExecutorOptions o;
  o.model = *GetModelProfile("llama-3.1-70b");
  o.hw = *GetHardwareProfile("h100-sxm-80gb");
  auto made = SimExecutor::Create(o, &clock);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  SimExecutor& e = **made;
  StepBatch b;
  StepSeq st;
  st.seq_id = 1;
  st.num_tokens = 512;
  st.dp_rank = 0;
  st.logits_row = b.num_logits_rows++;
  b.seqs.push_back(st);
  b.tokens.assign(512, 1);
  StepTiming even, slow;
  ASSERT_TRUE(e.Step(b, &even).ok());
  ASSERT_EQ(even.devices.size(), 8u);
  ASSERT_EQ(even.device_compute_wall_ns.size(), 8u);
  for (size_t i = 0; i < 8; ++i) {
    EXPECT_GT(even.device_compute_ns[i], 0);
    EXPECT_GT(even.device_attention_flops[i] + even.device_ffn_flops[i], 0);
    EXPECT_GT(even.device_kv_bytes[i], 0) << "512 positions cached";
  }
  ASSERT_TRUE(e.SetDeviceSpeed(3, 0.5).ok());
  EXPECT_FALSE(e.SetDeviceSpeed(3, 0).ok());
  EXPECT_FALSE(e.SetDeviceSpeed(3, 1.5).ok());
  b.seqs[0].seq_id = 2;
  ASSERT_TRUE(e.Step(b, &slow).ok());
  EXPECT_NEAR(static_cast<double>(slow.device_compute_ns[3]) / even.device_compute_ns[3], 2.0,
              1e-6);
  EXPECT_EQ(slow.device_compute_ns[2], even.device_compute_ns[2]);
  EXPECT_EQ(slow.device_attention_flops[3], even.device_attention_flops[3]) << "the same work";
  EXPECT_GT(slow.wall_ns, 1.5 * even.wall_ns);
  EXPECT_GE(slow.wall_ns, slow.device_compute_ns[3]);
  EXPECT_EQ(slow.device_kv_bytes[0], 2 * even.device_kv_bytes[0]) << "two sequences of 512";
  ASSERT_TRUE(e.FreeSeqs({1, 2}).ok());
  StepTiming after;
  b.seqs[0].seq_id = 3;
  ASSERT_TRUE(e.Step(b, &after).ok());
  EXPECT_EQ(after.device_kv_bytes[0], even.device_kv_bytes[0]);
}

// A device at half speed: the engine's monitor finds it from the simulated
// timings and, with rebalancing, gives it half a share (fewer FFN shards);
// that buys back most of the throughput the slow device cost. Healthy
// devices are never rebalanced, and the slow one is never taken for hung.
TEST(SimSlowDevice, TheEngineRebalancesASlowDeviceAndItPays) {
  const double span = 60;
  const Served healthy = Serve(1.0, true, span);
  const Served slow = Serve(0.5, false, span);
  const Served rebalanced = Serve(0.5, true, span);
  EXPECT_EQ(healthy.rebalances, 0);
  EXPECT_EQ(slow.rebalances, 0);
  EXPECT_GE(rebalanced.rebalances, 1);
  ASSERT_EQ(slow.speeds.size(), 8u);
  EXPECT_TRUE(slow.speeds[3].measured);
  EXPECT_TRUE(slow.speeds[3].slow);
  EXPECT_NEAR(slow.speeds[3].relative_speed, 0.5, 0.05);
  for (int d : {0, 1, 2, 4, 5, 6, 7}) EXPECT_FALSE(healthy.speeds[d].slow) << d;
  EXPECT_NEAR(rebalanced.speeds[3].share, 0.5, 1e-9);
  EXPECT_LT(Shards(rebalanced.plan, 3), Shards(rebalanced.plan, 2));
  EXPECT_EQ(Shards(healthy.plan, 3), Shards(healthy.plan, 2));
  for (const Served* s : {&healthy, &slow, &rebalanced}) EXPECT_EQ(s->alive, 8) << "no hang";
  EXPECT_LT(slow.tokens, 0.75 * healthy.tokens);
  EXPECT_GT(rebalanced.tokens, 1.2 * slow.tokens);
  EXPECT_LE(rebalanced.tokens, healthy.tokens);
}

// A device that nearly stops goes longer than the step's deadline without
// reaching a collective: it is declared lost as the hang watch would, and
// the engine recovers without it.
TEST(SimSlowDevice, ADeviceSlowerThanTheDeadlineIsAHang) {
  auto inst = SimInstance::Create(Config(false));
  ASSERT_TRUE(inst.ok()) << inst.status().ToString();
  SubmitBatch(inst->get(), 64);
  (*inst)->RunUntil(5);  // the deadline has its measured steps
  ASSERT_TRUE((*inst)->executor().SetDeviceSpeed(3, 1e-5).ok());
  (*inst)->RunUntil(20);
  const auto alive = (*inst)->executor().alive_devices();
  EXPECT_EQ(std::count(alive.begin(), alive.end(), 3), 0);
  ASSERT_FALSE((*inst)->engine().recoveries().empty());
  const RecoveryReport& r = (*inst)->engine().recoveries().front();
  ASSERT_EQ(r.failed_devices, std::vector<int>{3});
  EXPECT_NE(r.causes[0].find("no progress"), std::string::npos) << r.causes[0];
  EXPECT_GE(r.detect_ms, 500) << "the deadline's floor";
  EXPECT_GT((*inst)->tokens_out(), 64 * 10);
}

}  // namespace
}  // namespace failsafe
