#include "engine/request_sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace failsafe {
namespace {

TEST(RequestSampler, LogprobsAreTheLogSoftmaxOfTheRawRow) {
  const std::vector<float> logits = {1.0f, 3.0f, -2.0f, 3.0f, 0.5f};
  PositionLogprobs lp;
  ComputeLogprobs(logits.data(), 5, 4, 3, &lp);
  double sum = 0;
  for (float l : logits) sum += std::exp(static_cast<double>(l) - 3.0);
  const double lse = 3.0 + std::log(sum);
  EXPECT_EQ(lp.token, 4);
  EXPECT_FLOAT_EQ(lp.logprob, static_cast<float>(0.5 - lse));
  ASSERT_EQ(lp.top.size(), 3u);
  // Equal logits by ascending id.
  EXPECT_EQ(lp.top[0].token, 1);
  EXPECT_EQ(lp.top[1].token, 3);
  EXPECT_EQ(lp.top[2].token, 0);
  EXPECT_FLOAT_EQ(lp.top[2].logprob, static_cast<float>(1.0 - lse));
}

TEST(RequestSampler, PenaltiesBiasesAndMinTokensInVllmsOrder) {
  auto cpu = MakeCpuBackend(1);
  // Prompt {0, 1}, output so far {2, 2, 3}.
  const std::vector<int32_t> tokens = {0, 1, 2, 2, 3};
  const std::vector<float> logits = {2.0f, -1.0f, 4.0f, 3.9f, 1.0f, 3.95f};
  const std::vector<int32_t> stop = {5};
  // Repetition 2 on every prompt and output token, frequency 0.5 per
  // output occurrence, presence 0.1 once, a bias on token 4, and token 5
  // (a stop token) masked below 4 output tokens.
  LogitControls c;
  c.repetition_penalty = 2.0f;
  c.frequency_penalty = 0.5f;
  c.presence_penalty = 0.1f;
  c.logit_bias = {{4, 0.25f}};
  c.min_tokens = 4;
  // Expected row: 0: 2/2 = 1; 1: -1*2 = -2; 2: 4/2 - 0.5*2 - 0.1 = 0.9;
  // 3: 3.9/2 - 0.5 - 0.1 = 1.35; 4: 1 + 0.25 = 1.25; 5: -inf.
  SamplingParams greedy;
  RequestSampler s(greedy, c, 5);
  PositionLogprobs lp;
  EXPECT_EQ(s.Draw(logits.data(), 6, tokens, 2, stop, cpu.get(), &lp), 3);
  // Log-probabilities are the raw row's.
  PositionLogprobs raw;
  ComputeLogprobs(logits.data(), 6, 3, 5, &raw);
  EXPECT_EQ(lp.logprob, raw.logprob);
  EXPECT_EQ(lp.top[0].token, 2);
  // With one more output token min_tokens is met: the stop token, the best
  // raw logit left unpenalised, is drawn.
  const std::vector<int32_t> more = {0, 1, 2, 2, 3, 1};
  EXPECT_EQ(s.Draw(logits.data(), 6, more, 2, stop, cpu.get(), &lp), 5);
  // Without controls the raw argmax.
  RequestSampler plain(greedy, {}, -1);
  EXPECT_EQ(plain.Draw(logits.data(), 6, tokens, 2, stop, cpu.get(), nullptr), 2);
}

TEST(RequestSampler, MinPKeepsOnlyTokensNearTheBest) {
  auto cpu = MakeCpuBackend(1);
  // Token 0 is e^4 more likely than the rest: min_p 0.05 leaves it alone.
  std::vector<float> logits = {4.0f, 0.0f, 0.0f, 0.0f};
  SamplingParams p;
  p.temperature = 1.0f;
  p.min_p = 0.05f;
  for (uint64_t seed = 0; seed < 200; ++seed) {
    p.seed = seed;
    EXPECT_EQ(cpu->Sample(logits.data(), 4, p, 7), 0);
  }
  // Without it the others come up.
  p.min_p = 0.0f;
  int others = 0;
  for (uint64_t seed = 0; seed < 200; ++seed) {
    p.seed = seed;
    others += cpu->Sample(logits.data(), 4, p, 7) != 0;
  }
  EXPECT_GT(others, 0);
}

}  // namespace
}  // namespace failsafe
