// A model's chat template: the Jinja template of tokenizer_config.json (or
// chat_template.jinja) rendered as Hugging Face's apply_chat_template does —
// with `messages`, `add_generation_prompt`, `tools` (the request's tools as
// given, or None) and `documents` (None),
// the special tokens (bos_token, eos_token, unk_token, pad_token,
// additional_special_tokens), and the globals raise_exception and
// strftime_now — then tokenized with special tokens parsed from the text and
// none added.
//
// Thread-safety: immutable after Parse; Render may run on any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/status.h"

namespace failsafe {

namespace jinja {
class Template;
}
class Tokenizer;
struct SpecialTokenStrings;

class ChatTemplate {
 public:
  ~ChatTemplate();
  // A construct the engine does not support is an error naming it.
  static Result<std::unique_ptr<ChatTemplate>> Parse(const std::string& source,
                                                     const std::string& origin);

  // The prompt text. A raise_exception call or a template error (a message
  // the template cannot handle) is InvalidArgument with the template's words.
  Result<std::string> Render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                             const SpecialTokenStrings& special,
                             const nlohmann::ordered_json& tools = nullptr) const;

 private:
  ChatTemplate() = default;
  std::unique_ptr<jinja::Template> template_;
};

// The prompt ids of a chat: the tokenizer's chat template if it has one,
// else the built-in format (Llama-3 headers when the vocabulary has them,
// otherwise "role: content" lines ending in "assistant: ", encoded as a
// completion prompt is, with the tokenizer's BOS). Encoding stops once more
// than `max_tokens` ids are out, as Tokenizer::Encode does: the result is then
// a prefix of the whole prompt longer than max_tokens (a context-length check
// that need not tokenize a huge chat whole). `tools` (a list of OpenAI tool
// definitions, or null) go to the template; the built-in format lists them
// in a first line.
Result<std::vector<int>> ApplyChatTemplate(const Tokenizer& tokenizer,
                                           const nlohmann::ordered_json& messages,
                                           bool add_generation_prompt = true,
                                           size_t max_tokens = SIZE_MAX,
                                           const nlohmann::ordered_json& tools = nullptr);

}  // namespace failsafe
