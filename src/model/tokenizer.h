// Hugging Face tokenizer.json: byte-level BPE (GPT-2 and Llama-3 style).
//
// Supported: model.type "BPE" with byte-level symbols (merges as "a b" strings
// or [a, b] pairs, ignore_merges), pre_tokenizer ByteLevel (GPT-2 regex) or
// Sequence[Split(regex), ByteLevel], added and special tokens, a
// TemplateProcessing post-processor that adds BOS, decoder ByteLevel.
// Anything else is rejected with an error naming the field.
//
// Encode then Decode returns the input bytes exactly, for any input.
// Thread-safety: immutable after Load; Encode/Decode may run on any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/status.h"

namespace failsafe {

class Tokenizer {
 public:
  ~Tokenizer();
  static Result<std::unique_ptr<Tokenizer>> Load(const std::string& path);
  // `source` names the file in error messages.
  static Result<std::unique_ptr<Tokenizer>> Parse(std::string_view json_text,
                                                  const std::string& source);

  // add_special: apply the post-processor's template (e.g. a leading BOS).
  // Stops early once more than `max_tokens` ids are out: the result then has
  // more than max_tokens ids but is not the whole encoding (a context-length
  // check that does not tokenize a huge text whole).
  std::vector<int> Encode(std::string_view text, bool add_special = false,
                          size_t max_tokens = SIZE_MAX) const;
  // Bytes for the ids; special tokens are dropped when skip_special is set.
  // Ids outside the vocabulary decode to nothing.
  std::string Decode(const std::vector<int>& ids, bool skip_special = false) const;
  std::string DecodeOne(int id, bool skip_special = false) const;

  int vocab_size() const { return static_cast<int>(id_to_token_.size()); }
  // Id of a token or added token by its exact string, or -1.
  int TokenId(std::string_view token) const;
  bool IsSpecial(int id) const;
  int bos_id() const { return bos_id_; }

 private:
  struct AddedToken {
    int id;
    std::string content;
    bool special;
  };
  struct MergeInfo {
    int rank;
    int merged;
  };
  class Regex;

  Tokenizer();
  void EncodeChunk(std::string_view text, std::vector<int>* out, size_t max_tokens) const;
  void EncodeWord(std::string_view word, std::vector<int>* out) const;

  std::unordered_map<std::string, int> vocab_;      // byte-level token string -> id
  std::vector<std::string> id_to_token_;            // id -> byte-level string ("" if unused)
  std::unordered_map<uint64_t, MergeInfo> merges_;  // (left id << 32 | right id) -> merge
  std::vector<AddedToken> added_;                   // longest content first
  std::vector<int> added_by_id_;                    // id -> index in added_, or -1
  bool added_first_byte_[256] = {};                 // a byte that starts an added token
  std::unique_ptr<Regex> split_;                    // pre-tokenizer regex
  bool add_prefix_space_ = false;
  bool ignore_merges_ = false;
  int bos_id_ = -1;
  std::vector<int> prefix_ids_, suffix_ids_;  // from the post-processor template
  int byte_ids_[256];                         // byte -> id of its single-char token
};

// Byte-level BPE's reversible byte <-> printable code point map (GPT-2).
int ByteToCodePoint(unsigned char b);
// Inverse; -1 if the code point is not one of the 256 images.
int CodePointToByte(int cp);
// Appends the UTF-8 encoding of a code point.
void AppendUtf8(int cp, std::string* out);

}  // namespace failsafe
