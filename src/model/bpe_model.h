// The BPE model of a tokenizer.json: a vocabulary, ranked merges, and what
// happens to characters outside the vocabulary (byte_fallback to <0xXX>
// tokens, else the unk token, consecutive unks fused if fuse_unk).
//
// A word is a sequence of code points; merges apply lowest rank first, leftmost
// on ties (the Hugging Face order), in O(n log n) for a word of n symbols.
//
// Thread-safety: immutable after Parse.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/status.h"

namespace failsafe {

class BpeModel {
 public:
  // `j` is the "model" object; `source` names the file in errors.
  static Result<std::unique_ptr<BpeModel>> Parse(const nlohmann::json& j,
                                                 const std::string& source);

  // Appends the ids of each word, fusing runs of unk ids from index
  // fuse_from of *out on if fuse_unk (default: from the first id appended);
  // stops after a word once *out holds more than max_tokens ids.
  void Encode(const std::vector<std::string>& words, std::vector<int>* out,
              size_t max_tokens = SIZE_MAX, size_t fuse_from = SIZE_MAX) const;

  // The vocabulary: token string -> id (ids may leave gaps).
  const std::unordered_map<std::string, int>& vocab() const { return vocab_; }
  int max_id() const { return max_id_; }
  int unk_id() const { return unk_id_; }

 private:
  struct Merge {
    int rank;
    int merged;
  };
  void EncodeWord(std::string_view word, std::vector<int>* out) const;
  void AppendUnknown(std::string_view piece, std::vector<int>* out) const;

  std::unordered_map<std::string, int> vocab_;
  std::unordered_map<int, int> char_ids_;       // code point -> id of its one-character token
  std::unordered_map<uint64_t, Merge> merges_;  // (left id << 32 | right id) -> merge
  int byte_ids_[256];                           // <0xXX> tokens, -1 if missing
  bool byte_fallback_ = false;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;
  int unk_id_ = -1;
  int max_id_ = -1;
};

}  // namespace failsafe
