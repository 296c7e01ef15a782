// tokenizer.json normalizers: Sequence, Prepend, Replace (string or regex),
// NFC, NFD, NFKC, NFKD and Strip. They run on text between added tokens,
// before pre-tokenization. Any other type is an error naming its field.
//
// Thread-safety: immutable after Parse.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "common/status.h"

namespace failsafe {

class HfNormalizer {
 public:
  virtual ~HfNormalizer() = default;
  // Valid UTF-8 in, valid UTF-8 out.
  virtual std::string Normalize(std::string text) const = 0;

  // `field` is the JSON path for error messages (e.g. "normalizer").
  static Result<std::unique_ptr<HfNormalizer>> Parse(const nlohmann::json& j,
                                                     const std::string& field);
};

// JavaScript's String.prototype.trim() whitespace (what tokenizers strip
// around added tokens with lstrip/rstrip and in the Strip normalizer).
bool IsTrimmableSpace(int cp);
std::string_view TrimStart(std::string_view s);
std::string_view TrimEnd(std::string_view s);

}  // namespace failsafe
