// The engine end to end: a workload through the scheduler on worker
// processes completes every request, and the outputs match the single-device
// engine token for token.
#include "engine/engine.h"
#include "common/scratch_dir.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <map>

#include "engine/local_executor.h"
#include "engine/offline_run.h"
#include "engine/test_support.h"
#include "engine/worker_group.h"
#include "model/synthetic.h"

namespace failsafe {
namespace {

std::string Dir() { return TestModelDir("tiny-mixtral", 11); }

Workload SmallWorkload() {
  Workload w;
  for (int i = 0; i < 24; ++i)
    w.requests.push_back({0.001 * i, 5 + (i * 37) % 150, 3 + (i * 11) % 20});
  return w;
}

// Five worker processes under `policy` with little KV memory (300 pages):
// sequences are preempted and cached blocks evicted.
Result<std::unique_ptr<WorkerGroup>> TightGroup(Policy policy) {
  WorkerGroupOptions o;
  o.model_dir = Dir();
  o.worker_binary = TestBinary();
  o.num_devices = 5;
  o.policy = policy;
  o.max_logits_rows = 64;
  o.kv_pages = 300;
  return WorkerGroup::Start(o);
}

// The workload on one in-process device: the reference outputs.
Result<RunSummary> OneDevice(const Workload& w, const SchedulerConfig& sc) {
  FS_ASSIGN_OR_RETURN(auto local, LocalExecutor::Create(Dir(), {}));
  Engine e(local.get(), sc);
  return RunOffline(e, w, {});
}

TEST(Engine, WorkloadOnDevicesMatchesOneDevice) {
  SchedulerConfig sc;
  sc.max_batch_tokens = 96;
  sc.max_model_len = 1024;
  auto want = OneDevice(SmallWorkload(), sc);
  ASSERT_TRUE(want.ok()) << want.status().ToString();
  EXPECT_EQ(want->requests_completed, 24);

  for (Policy p : {Policy::kHybrid, Policy::kNonUniform}) {
    for (PrefillPolicy pp : {PrefillPolicy::kAdaptive, PrefillPolicy::kFifo}) {
      auto group = TightGroup(p);
      ASSERT_TRUE(group.ok()) << group.status().ToString();
      sc.prefill = pp;
      Engine e(group->get(), sc);
      auto got = RunOffline(e, SmallWorkload(), {});
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      EXPECT_EQ(got->requests_completed, 24);
      EXPECT_GT(got->preemptions, 0);
      EXPECT_EQ(got->output_tokens, want->output_tokens);
      EXPECT_EQ(got->output_digest, want->output_digest)
          << PolicyName(p) << " " << PrefillPolicyName(pp);
    }
  }
}

// Prefix caching changes no output: prompts sharing prefixes give the same
// tokens with the cache on as with it off, on one device and on five under
// every placement, with memory tight enough that cached blocks are evicted
// and sequences preempted.
TEST(Engine, PrefixCacheChangesNoOutputUnderEveryPlacement) {
  const Workload w = SharedPrefixWorkload(24, 5);
  SchedulerConfig sc;
  sc.max_batch_tokens = 96;
  sc.max_model_len = 1024;
  auto want = OneDevice(w, sc);
  ASSERT_TRUE(want.ok()) << want.status().ToString();
  EXPECT_EQ(want->requests_completed, 24);
  EXPECT_EQ(want->prefix.lookup_blocks, 0);  // off: nothing looked up

  sc.prefix_cache = true;
  {
    auto got = OneDevice(w, sc);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_GT(got->prefix.hit_blocks, 0);
    EXPECT_LT(got->input_tokens - got->prefix.hit_tokens, want->input_tokens);
    EXPECT_EQ(got->output_digest, want->output_digest) << "one device";
  }
  for (Policy p : {Policy::kStandard, Policy::kNonUniform, Policy::kCyclic, Policy::kHybrid}) {
    auto group = TightGroup(p);
    ASSERT_TRUE(group.ok()) << group.status().ToString();
    Engine e(group->get(), sc);
    auto got = RunOffline(e, w, {});
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(got->requests_completed, 24) << PolicyName(p);
    EXPECT_GT(got->prefix.hit_blocks, 0) << PolicyName(p);
    EXPECT_EQ(got->output_digest, want->output_digest) << PolicyName(p);
  }
}

// A request with a seed samples the same tokens whatever it is batched with
// and wherever it runs: alone on one device, or among others on five devices
// (hybrid placement, load-aware DP ranks, chunked prefill, preemptions).
TEST(Engine, SeededSamplingIsTheSameWhateverTheBatch) {
  std::vector<RequestSpec> reqs;
  for (int i = 0; i < 10; ++i) {
    RequestSpec r;
    for (int k = 0; k < 7 + 13 * i; ++k) r.prompt.push_back((31 * i + 7 * k) % 500);
    r.max_new_tokens = 12 + i;
    r.sampling.temperature = 0.8f;
    r.sampling.top_p = 0.95f;
    r.sampling.seed = 1000 + i;
    reqs.push_back(r);
  }
  auto drain = [](Engine& e, std::map<int64_t, std::vector<int32_t>>* out) {
    for (int s = 0; s < 10000 && !e.idle(); ++s) {
      auto r = e.Step();
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      for (const TokenEvent& ev : r->events) {
        if (ev.token >= 0) (*out)[ev.id].push_back(ev.token);
      }
    }
  };
  SchedulerConfig sc;
  sc.max_batch_tokens = 48;
  sc.max_model_len = 1024;
  // Alone, one at a time, on one device.
  auto local = LocalExecutor::Create(Dir(), {});
  ASSERT_TRUE(local.ok());
  Engine alone(local->get(), sc);
  std::map<int64_t, std::vector<int32_t>> want;
  for (const RequestSpec& r : reqs) {
    ASSERT_TRUE(alone.Submit(r).ok());
    drain(alone, &want);
  }
  // All at once on five devices with little memory.
  auto group = TightGroup(Policy::kHybrid);
  ASSERT_TRUE(group.ok()) << group.status().ToString();
  Engine together(group->get(), sc);
  for (const RequestSpec& r : reqs) ASSERT_TRUE(together.Submit(r).ok());
  std::map<int64_t, std::vector<int32_t>> got;
  drain(together, &got);
  EXPECT_EQ(got, want);
  // Sampling did not degenerate to greedy: some token differs from the argmax run.
  std::map<int64_t, std::vector<int32_t>> greedy;
  Engine g(local->get(), sc);
  for (RequestSpec r : reqs) {
    r.sampling = SamplingParams();
    ASSERT_TRUE(g.Submit(r).ok());
  }
  drain(g, &greedy);
  EXPECT_NE(greedy, want);
}

}  // namespace
}  // namespace failsafe
