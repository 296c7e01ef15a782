// A request's sampling on the coordinator: penalties, logit biases and
// min_tokens applied to its row of logits, the seeded draw, and the
// log-probabilities it asked for. Each is a function of the row and of the
// request's own tokens only, and the logits are batch-invariant, so a
// request draws the same tokens and reports the same log-probabilities
// however it is batched, placed, preempted or recovered.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "backend/backend.h"

namespace failsafe {

// Alternatives a request may ask for at each position (OpenAI's limit).
constexpr int kMaxLogprobs = 20;

struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0;
};

// The log-probability of the token at one position, and the `top` most
// likely tokens there (by logit, descending; equal logits by ascending id).
struct PositionLogprobs {
  int32_t token = -1;
  float logprob = 0;
  std::vector<TokenLogprob> top;
};

// What a request changes in its logits before the draw, in this order (as
// vLLM and Hugging Face apply them): the repetition penalty, then the
// frequency and presence penalties, then the biases, then min_tokens.
struct LogitControls {
  // Every token of the prompt or the output so far: a positive logit is
  // divided by it, a negative one multiplied (1: off).
  float repetition_penalty = 1.0f;
  // Subtracted from a token's logit per time it was generated.
  float frequency_penalty = 0.0f;
  // Subtracted once from the logit of every token generated so far.
  float presence_penalty = 0.0f;
  // Added to the logits of these tokens (unique ids).
  std::vector<std::pair<int32_t, float>> logit_bias;
  // Until this many tokens are out, the request's stop tokens cannot be drawn.
  int min_tokens = 0;

  bool active() const {
    return repetition_penalty != 1.0f || frequency_penalty != 0.0f || presence_penalty != 0.0f ||
           !logit_bias.empty() || min_tokens > 0;
  }
};

// Which tokens a request may draw next (constrained decoding: a grammar
// its output must follow). Called on the engine thread only, with the
// request's output so far, which only ever grows.
class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // Sets logits[t] to -infinity for every token t that may not follow
  // `output`; at least one token keeps its logit.
  virtual void Mask(std::span<const int32_t> output, std::span<float> logits) = 0;
};

// The log-softmax of `logits` [vocab] at `token`, and its `top` best tokens,
// into `out`. Sums run in id order in double: the same row gives the same
// figures on every machine.
void ComputeLogprobs(const float* logits, int vocab, int32_t token, int top, PositionLogprobs* out);

class RequestSampler {
 public:
  // `logprobs`: alternatives to report with each drawn token (-1: no
  // log-probabilities at all).
  // `constraint` (may be null): tokens it does not allow are never drawn.
  RequestSampler(const SamplingParams& params, LogitControls controls, int logprobs,
                 std::shared_ptr<TokenConstraint> constraint = nullptr)
      : params_(params),
        controls_(std::move(controls)),
        logprobs_(logprobs),
        constraint_(std::move(constraint)) {}

  // The token after `tokens` (the first `prompt_len` the prompt) from its
  // logits [vocab]; with logprobs() >= 0 fills `lp` from the model's own
  // distribution (before penalties, biases, the constraint and temperature,
  // as vLLM reports them by default). `sampler` draws; `stop_ids` are masked by min_tokens.
  int32_t Draw(const float* logits, int vocab, std::span<const int32_t> tokens, int prompt_len,
               std::span<const int32_t> stop_ids, Backend* sampler, PositionLogprobs* lp);

  int logprobs() const { return logprobs_; }

 private:
  // Applies the controls to scratch_ (a copy of the row).
  void Apply(int vocab, std::span<const int32_t> tokens, int prompt_len,
             std::span<const int32_t> stop_ids);

  SamplingParams params_;
  LogitControls controls_;
  int logprobs_;
  std::shared_ptr<TokenConstraint> constraint_;
  // Output tokens counted so far, and how often each came (penalties);
  // with a repetition penalty, every token of the prompt or the output.
  int counted_ = 0;
  std::unordered_map<int32_t, int> counts_;
  std::unordered_set<int32_t> seen_;
  bool prompt_seen_ = false;
  std::vector<float> scratch_;
};

}  // namespace failsafe
