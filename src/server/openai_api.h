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
#include "engine/request_sampler.h"
#include "model/chat_template.h"
#include "model/tokenizer.h"
#include "server/api_error.h"

namespace failsafe {

struct CompletionRequest {
  bool chat = false;
  std::string model;
  // One prompt per choice group: chat has one; completions one per entry of
  // a list of prompts.
  std::vector<std::vector<int32_t>> prompts;
  // The prompts as the client wrote them (echo), or empty: decode them.
  std::vector<std::string> prompt_texts;
  int max_tokens = 16;  // 0 only with echo: the prompt alone comes back
  SamplingParams sampling;
  LogitControls controls;
  // Log-probabilities of each output token with this many alternatives
  // (completions `logprobs`, chat `top_logprobs`); -1: none.
  int logprobs = -1;
  bool echo = false;  // completions: the prompt precedes the output (and its logprobs)
  int n = 1;          // choices per prompt
  int best_of = 1;    // completions: drawn per prompt; the n likeliest are returned
  std::vector<std::string> stop;
  // response_format: a JSON object (json_object) or a JSON text of a schema
  // (json_schema: the schema, dumped); empty: free text.
  bool json_object = false;
  std::string json_schema;
  // Chat tools (null: none) and tool_choice: none, auto, required or named
  // (tool_name). A forced call sets json_schema: the function's parameters
  // (named) or {"name", "arguments"} objects (required; a list of them with
  // parallel_tool_calls).
  nlohmann::ordered_json tools;
  std::string tool_choice = "none";
  std::string tool_name;
  bool parallel_tool_calls = true;
  // FailSafe's extensions for a router that resumes requests: the output
  // tokens a failed node already sent (the answer goes on after them,
  // counted as the original request), and token ids in every choice and
  // chunk.
  std::vector<int32_t> resume_token_ids;
  bool return_token_ids = false;
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
  // Stop strings count only once `min_tokens` tokens are out.
  TextStream(const Tokenizer* tokenizer, std::vector<std::string> stop, bool skip_special = true,
             const std::vector<int32_t>& prompt = {}, int min_tokens = 0)
      : decoder_(tokenizer, skip_special, prompt),
        stop_(std::move(stop)),
        min_tokens_(min_tokens) {}
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
  int min_tokens_ = 0;
  int added_ = 0;
};

struct ToolCall {
  std::string name;
  std::string arguments;  // JSON text
};

// The tool calls in a model's answer, in the formats of the families' chat
// templates: Hermes / Qwen's <tool_call>{...}</tool_call> blocks, Llama 3's
// {"name", "parameters"} (after <|python_tag|> or not), Mistral's
// [TOOL_CALLS] [{"name", "arguments"}], or a bare {"name", "arguments"} object
// or list of them. Null when the text is not a call (plain content);
// `content` gets the text before the calls.
std::optional<std::vector<ToolCall>> ParseToolCalls(const std::string& text, std::string* content);
// Whether text generated so far may still turn out to be a tool call (a
// stream holds it back until it knows).
bool MayBeToolCall(std::string_view text);

}  // namespace failsafe
