// A Hugging Face tokenizer.json with a BPE model, encoding as the
// `tokenizers` libraries do (checked against @huggingface/transformers):
//
//  1. Added tokens whose `normalized` is false are cut out of the raw text,
//     leftmost-longest; lstrip/rstrip eat the whitespace beside them.
//  2. Each remaining section is normalized (hf_normalizer.h); added tokens
//     with `normalized` true are then cut out of the normalized text (their
//     content normalized the same way). A section that is exactly an added
//     token's content (raw or normalized) is that token.
//  3. Pre-tokenizers split the rest into words (hf_pre_tokenizer.h), which
//     the model encodes (bpe_model.h).
//  4. With add_special, the TemplateProcessing post-processor's special
//     tokens go around the ids.
// Decoding maps ids to token strings, drops special tokens if asked, and runs
// the decoder chain (hf_decoder.h); clean_up_tokenization_spaces applies if
// tokenizer_config.json sets it.
//
// Unsupported: WordPiece and Unigram models, single_word added tokens, and
// post-processors other than TemplateProcessing/ByteLevel; each is refused
// with an error naming the field.
//
// Thread-safety: immutable after Parse.
#pragma once

#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "model/bpe_model.h"
#include "model/hf_decoder.h"
#include "model/hf_normalizer.h"
#include "model/hf_pre_tokenizer.h"
#include "model/token_matcher.h"
#include "model/tokenizer.h"

namespace failsafe {

class HfTokenizer : public Tokenizer {
 public:
  static Result<std::unique_ptr<HfTokenizer>> Parse(std::string_view json_text,
                                                    const std::string& source);

  std::string Decode(const std::vector<int>& ids, bool skip_special = false) const override;
  int vocab_size() const override { return static_cast<int>(id_to_token_.size()); }
  int TokenId(std::string_view token) const override;
  bool IsSpecial(int id) const override;

 protected:
  Status Configure(const TokenizerConfig& config) override;
  std::vector<int> DoEncode(std::string_view text, bool add_special,
                            size_t max_tokens) const override;

 private:
  struct AddedToken {
    int id = -1;
    std::string content;  // as matched: normalized when `normalized`
    bool lstrip = false, rstrip = false, normalized = false, special = false;
  };
  HfTokenizer() = default;
  // Cuts added tokens out of `text` with `matcher`, applying lstrip/rstrip;
  // returns the pieces as (text, added token index or -1).
  std::vector<std::pair<std::string, int>> SplitAdded(std::string_view text,
                                                      const TokenMatcher& matcher) const;
  void EncodeSection(const std::string& text, int section_index, std::vector<int>* out,
                     size_t max_tokens) const;

  std::unique_ptr<BpeModel> model_;
  std::unique_ptr<HfNormalizer> normalizer_;       // may be null
  std::unique_ptr<HfPreTokenizer> pre_tokenizer_;  // may be null: one word per section
  std::unique_ptr<HfDecoder> decoder_;             // null: tokens joined by spaces
  std::vector<AddedToken> added_;
  TokenMatcher raw_matcher_, normalized_matcher_;     // -> index in added_
  std::unordered_map<std::string, int> token_to_id_;  // vocabulary and added tokens
  std::vector<std::string> id_to_token_;              // "" for unused ids
  std::vector<int> added_by_id_;                      // id -> index in added_, or -1
  std::vector<bool> special_by_id_;                   // skipped by skip_special
  std::set<std::string, std::less<>> added_contents_;
  // Added-token contents (raw and normalized) -> id: a whole section equal to
  // one is that token, as in the reference implementation.
  std::unordered_map<std::string, int> added_lookup_;
  std::vector<int> prefix_ids_, suffix_ids_;  // post-processor template around the text
  bool clean_up_spaces_ = false;
};

}  // namespace failsafe
