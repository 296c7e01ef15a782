// The OpenAI-compatible request and response formats: parsing and validation
// of /v1/completions and /v1/chat/completions bodies (chat prompts through the
// model's chat template), incremental detokenization with stop strings.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "common/status.h"
#include "model/chat_template.h"
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
  bool skip_special_tokens = true;  // drop special tokens from the output text
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

// Turns generated tokens into text as it becomes final: only whole UTF-8
// characters, and nothing that might be the start of a stop string. `prompt`
// gives the text before the output (a first token's leading space decodes
// as it does after it).
class TextStream {
 public:
  TextStream(const Tokenizer* tokenizer, std::vector<std::string> stop, bool skip_special = true,
             const std::vector<int32_t>& prompt = {})
      : decoder_(tokenizer, skip_special, prompt), stop_(std::move(stop)) {}
  // Adds a token; returns the text that is now final. Sets stopped() when a
  // stop string appears (the text stops before it).
  std::string Add(int32_t token);
  // The rest, at the end of generation.
  std::string Finish();
  bool stopped() const { return stopped_; }

 private:
  // Text after the stop string check; holds back a possible stop-string prefix.
  std::string Release();

  StreamDecoder decoder_;
  std::vector<std::string> stop_;
  std::string pending_;  // decoded bytes not yet emitted
  bool stopped_ = false;
};

}  // namespace failsafe
