// tokenizer_config.json: the special tokens, BOS/EOS policy and chat template
// a Hugging Face model directory declares beside its tokenizer file; and the
// stop tokens of generation_config.json and config.json.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace failsafe {

struct AddedTokenSpec {
  int id = -1;
  std::string content;
  bool lstrip = false, rstrip = false, normalized = false, special = true;
};

// Validated once at load; fields that are absent stay empty.
struct TokenizerConfig {
  std::optional<std::string> bos_token, eos_token, unk_token, pad_token;
  std::vector<std::string> additional_special_tokens;
  std::optional<bool> add_bos_token, add_eos_token;
  std::optional<bool> clean_up_tokenization_spaces;
  std::string chat_template;  // "" if none (a named list picks "default")
  std::vector<AddedTokenSpec> added_tokens_decoder;

  // `source` names the file in error messages.
  static Result<TokenizerConfig> Parse(const std::string& json_text, const std::string& source);
};

// Token ids of an "eos_token_id" field: absent or null -> {}, an id or a list
// of ids. `field` names file and field in errors.
Result<std::vector<int>> ParseTokenIdList(const std::string& json_text, const char* key,
                                          const std::string& source);

}  // namespace failsafe
