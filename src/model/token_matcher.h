// Cuts known token strings (added or special tokens) out of text,
// leftmost-longest, as the tokenizer libraries do before anything else.
//
// Thread-safety: Add during construction only; Split is const.
#pragma once

#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace failsafe {

class TokenMatcher {
 public:
  // `value` is returned for matches of `text` (non-empty).
  void Add(const std::string& text, int value);
  bool empty() const { return by_first_byte_.empty(); }

  struct Piece {
    size_t begin, end;
    int value;  // -1 for text between matches
  };
  // The text as matches and the stretches between them, in order.
  std::vector<Piece> Split(std::string_view text) const;

 private:
  // first byte -> (text, value), longest text first
  std::unordered_map<unsigned char, std::vector<std::pair<std::string, int>>> by_first_byte_;
};

}  // namespace failsafe
