#include "engine/request_sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace failsafe {

void ComputeLogprobs(const float* logits, int vocab, int32_t token, int top,
                     PositionLogprobs* out) {
  float mx = -std::numeric_limits<float>::infinity();
  for (int i = 0; i < vocab; ++i) mx = std::max(mx, logits[i]);
  double sum = 0;
  for (int i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(logits[i]) - mx);
  const double lse = mx + std::log(sum);
  auto lp = [&](int i) { return static_cast<float>(logits[i] - lse); };
  out->token = token;
  out->logprob = token >= 0 && token < vocab ? lp(token) : 0.0f;
  out->top.clear();
  top = std::min(top, vocab);
  if (top <= 0) return;
  thread_local std::vector<int> idx;
  idx.resize(vocab);
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + top, idx.end(), [&](int a, int b) {
    return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
  });
  out->top.reserve(top);
  for (int k = 0; k < top; ++k) out->top.push_back({idx[k], lp(idx[k])});
}

void RequestSampler::Apply(int vocab, std::span<const int32_t> tokens, int prompt_len,
                           std::span<const int32_t> stop_ids) {
  const LogitControls& c = controls_;
  const bool repetition = c.repetition_penalty != 1.0f;
  if (repetition && !prompt_seen_) {
    seen_.insert(tokens.begin(), tokens.begin() + std::min<size_t>(prompt_len, tokens.size()));
    prompt_seen_ = true;
  }
  const int out_len = static_cast<int>(tokens.size()) - prompt_len;
  // Tokens are only ever appended to a request: count the new ones.
  for (; counted_ < out_len; ++counted_) {
    const int32_t t = tokens[prompt_len + counted_];
    ++counts_[t];
    if (repetition) seen_.insert(t);
  }
  float* l = scratch_.data();
  auto valid = [&](int32_t t) { return t >= 0 && t < vocab; };
  // Each token's logit changes on its own: the order of the sets does not
  // matter.
  if (repetition) {
    const float r = c.repetition_penalty;
    for (int32_t t : seen_) {
      if (valid(t)) l[t] = l[t] > 0 ? l[t] / r : l[t] * r;
    }
  }
  if (c.frequency_penalty != 0.0f || c.presence_penalty != 0.0f) {
    for (const auto& [t, n] : counts_) {
      if (valid(t)) l[t] -= c.frequency_penalty * static_cast<float>(n) + c.presence_penalty;
    }
  }
  for (const auto& [t, bias] : c.logit_bias) {
    if (valid(t)) l[t] += bias;
  }
  if (out_len < c.min_tokens) {
    for (int32_t t : stop_ids) {
      if (valid(t)) l[t] = -std::numeric_limits<float>::infinity();
    }
  }
}

int32_t RequestSampler::Draw(const float* logits, int vocab, std::span<const int32_t> tokens,
                             int prompt_len, std::span<const int32_t> stop_ids, Backend* sampler,
                             PositionLogprobs* lp) {
  const uint64_t counter = tokens.size();
  int32_t token;
  if (controls_.active() || constraint_) {
    scratch_.assign(logits, logits + vocab);
    Apply(vocab, tokens, prompt_len, stop_ids);
    if (constraint_)
      constraint_->Mask(tokens.subspan(std::min<size_t>(prompt_len, tokens.size())), scratch_);
    token = sampler->Sample(scratch_.data(), vocab, params_, counter);
  } else {
    token = sampler->Sample(logits, vocab, params_, counter);
  }
  if (logprobs_ >= 0 && lp) ComputeLogprobs(logits, vocab, token, logprobs_, lp);
  return token;
}

}  // namespace failsafe
