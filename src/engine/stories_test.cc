// A real trained model end to end: Karpathy's stories260K (converted into
// data/models/stories260K), greedy from BOS, must write the sample published
// with it word for word — on one device, on several worker processes under
// every placement, and when a device is killed in the middle of the story.
#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>

#include "engine/engine.h"
#include "engine/local_executor.h"
#include "engine/test_support.h"
#include "engine/worker_group.h"
#include "model/tokenizer.h"

namespace failsafe {
namespace {

const std::string kModel = std::string(FAILSAFE_DATA_DIR) + "/models/stories260K";
// From the model's release (see data/PROVENANCE.md): 61 tokens.
const std::string kPublished =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. "
    "One day, she saw a big, red ball. She wanted to play with it, but it was too high.";
const int kTokens = 61;

const Tokenizer& Tok() {
  static const std::unique_ptr<Tokenizer> t = [] {
    auto r = Tokenizer::LoadDir(kModel);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return std::move(r).value();
  }();
  return *t;
}

// Greedy generation from BOS through the engine; `on_token(n)` runs after
// the n-th generated token.
std::string Story(Executor* exec, const std::function<void(int)>& on_token = {}) {
  SchedulerConfig sc;
  sc.max_model_len = 512;
  Engine engine(exec, sc);
  RequestSpec spec;
  spec.prompt = {Tok().bos_id()};
  spec.max_new_tokens = kTokens;
  spec.stop_token_ids.assign(Tok().stop_token_ids().begin(), Tok().stop_token_ids().end());
  auto id = engine.Submit(spec);
  EXPECT_TRUE(id.ok());
  std::vector<int> out;
  bool done = false;
  while (!done) {
    auto step = engine.Step();
    if (!step.ok()) {
      ADD_FAILURE() << step.status().ToString();
      return "";
    }
    for (const TokenEvent& e : step->events) {
      if (e.token >= 0) {
        out.push_back(e.token);
        if (on_token) on_token(static_cast<int>(out.size()));
      }
      done = done || e.finished;
    }
  }
  return Tok().Decode(out, /*skip_special=*/true);
}

std::unique_ptr<WorkerGroup> Group(int devices, Policy policy) {
  WorkerGroupOptions o;
  o.model_dir = kModel;
  o.worker_binary = TestBinary();
  o.num_devices = devices;
  o.policy = policy;
  o.backup_bytes = 16 << 20;
  o.max_step_tokens = 64;
  o.max_logits_rows = 8;
  o.max_seqs = 8;
  o.log_level = "warn";
  auto g = WorkerGroup::Start(o);
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  return g.ok() ? std::move(g).value() : nullptr;
}

TEST(Stories260K, OneDeviceWritesThePublishedSample) {
  auto exec = LocalExecutor::Create(kModel, LocalExecutorOptions{});
  ASSERT_TRUE(exec.ok()) << exec.status().ToString();
  EXPECT_EQ(Story(exec->get()), kPublished);
}

class StoriesPlacement : public ::testing::TestWithParam<std::tuple<int, Policy>> {};

TEST_P(StoriesPlacement, DevicesWriteThePublishedSample) {
  auto [devices, policy] = GetParam();
  auto g = Group(devices, policy);
  ASSERT_TRUE(g);
  EXPECT_EQ(Story(g.get()), kPublished);
}

INSTANTIATE_TEST_SUITE_P(EveryPlacement, StoriesPlacement,
                         ::testing::Combine(::testing::Values(2, 3, 4, 8),
                                            ::testing::Values(Policy::kStandard,
                                                              Policy::kNonUniform, Policy::kCyclic,
                                                              Policy::kHybrid)),
                         [](const auto& info) {
                           return std::to_string(std::get<0>(info.param)) + "dev_" +
                                  PolicyName(std::get<1>(info.param));
                         });

// SIGKILL one worker process after 20 tokens; the engine recovers on the
// survivors and the story goes on unchanged: on 4 devices (one per KV head
// group) and on 8, the default, where head groups are replicated (or all
// heads DP) and the survivors are 7.
class StoriesKill : public ::testing::TestWithParam<std::tuple<int, Policy>> {};

TEST_P(StoriesKill, SurvivesADeviceKilledMidStory) {
  auto [devices, policy] = GetParam();
  auto g = Group(devices, policy);
  ASSERT_TRUE(g);
  bool killed = false;
  const std::string story = Story(g.get(), [&](int n) {
    if (n == 20) killed = g->KillDevice(2).ok();
  });
  EXPECT_TRUE(killed);
  EXPECT_EQ(story, kPublished);
  EXPECT_EQ(g->alive_devices().size(), static_cast<size_t>(devices - 1));
}

INSTANTIATE_TEST_SUITE_P(
    EveryPlacement, StoriesKill,
    ::testing::Values(std::make_tuple(4, Policy::kHybrid), std::make_tuple(4, Policy::kCyclic),
                      std::make_tuple(8, Policy::kStandard),
                      std::make_tuple(8, Policy::kNonUniform), std::make_tuple(8, Policy::kCyclic),
                      std::make_tuple(8, Policy::kHybrid)),
    [](const auto& info) {
      return std::to_string(std::get<0>(info.param)) + "dev_" + PolicyName(std::get<1>(info.param));
    });

}  // namespace
}  // namespace failsafe
