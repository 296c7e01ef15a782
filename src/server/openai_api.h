// The OpenAI-compatible request and response formats: parsing and validation
// of /v1/completions and /v1/chat/completions bodies, the chat template,
// incremental detokenization with stop strings.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "common/status.h"
#include "model/tokenizer.h"
#include "server/api_error.h"

namespace failsafe {

struct CompletionRequest {
  bool chat = false;
  std::string model;
  std::vector<int32_t> prompt;
  int max_tokens = 16;
  SamplingParams sampling;
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;
  bool ignore_eos = false;
};

struct CompletionLimits {
  int max_model_len = 0;     // tokens: prompt + max_tokens
  std::string served_model;  // a request naming another model gets 404 model_not_found
};

// Parses and validates a request body; returns the error to answer with, if
// any. Unknown parameters and out-of-range values are 400, an unknown model is
// 404, a prompt longer than the context is 400 context_length_exceeded, found
// without tokenizing a huge prompt whole.
std::optional<ApiError> ParseCompletionRequest(const std::string& body, bool chat,
                                               const Tokenizer& tokenizer,
                                               const CompletionLimits& limits,
                                               CompletionRequest* out);

// Llama-3 style chat template when the tokenizer has its special tokens;
// otherwise "role: content" lines.
std::vector<int32_t> ApplyChatTemplate(const nlohmann::json& messages, const Tokenizer& tokenizer);

// Turns generated tokens into text as it becomes final: only whole UTF-8
// characters, and nothing that might be the start of a stop string.
class TextStream {
 public:
  TextStream(const Tokenizer* tokenizer, std::vector<std::string> stop)
      : tokenizer_(tokenizer), stop_(std::move(stop)) {}
  // Adds a token; returns the text that is now final. Sets stopped() when a
  // stop string appears (the text stops before it).
  std::string Add(int32_t token);
  // The rest, at the end of generation.
  std::string Finish();
  bool stopped() const { return stopped_; }

 private:
  const Tokenizer* tokenizer_;
  std::vector<std::string> stop_;
  std::string pending_;  // decoded bytes not yet emitted
  bool stopped_ = false;
};

}  // namespace failsafe
