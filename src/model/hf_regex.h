// A compiled regular expression of a tokenizer.json (PCRE2 with UTF and
// Unicode properties, close to the Oniguruma syntax Hugging Face files use).
//
// Thread-safety: immutable after Compile; Find may run on any thread (match
// data is per call).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace failsafe {

class HfRegex {
 public:
  ~HfRegex();
  // `field` names the JSON field in error messages.
  static Result<std::unique_ptr<HfRegex>> Compile(const std::string& pattern,
                                                  const std::string& field);
  // A literal string pattern.
  static Result<std::unique_ptr<HfRegex>> Literal(const std::string& text,
                                                  const std::string& field);

  // Non-overlapping matches [begin, end) from left to right, as JavaScript's
  // matchAll with the g and u flags (an empty match steps one code point).
  std::vector<std::pair<size_t, size_t>> FindAll(std::string_view text) const;
  // The same matches one by one, until fn(begin, end) returns false.
  void ForEach(std::string_view text, const std::function<bool(size_t, size_t)>& fn) const;

  // Every match replaced with `with` (taken literally).
  std::string ReplaceAll(std::string_view text, std::string_view with) const;

 private:
  HfRegex() = default;
  struct Code;
  std::unique_ptr<Code> code_;
  std::string literal_;  // non-empty: a plain substring search
};

// A "pattern" field: {"String": literal} or {"Regex": pattern}.
Result<std::unique_ptr<HfRegex>> ParseHfPattern(const nlohmann::json& j, const std::string& field);

}  // namespace failsafe
