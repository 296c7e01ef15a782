// tokenizer.json decoders: ByteLevel, Replace, ByteFallback, Fuse, Strip,
// Metaspace and Sequence. They turn token strings back into text. Any other
// type is an error naming its field.
//
// Thread-safety: immutable after Parse.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "common/status.h"

namespace failsafe {

class HfDecoder {
 public:
  virtual ~HfDecoder() = default;
  // Rewrites the token strings in place (the decode chain); the text is
  // their concatenation. `added` holds the contents of added tokens, which the
  // ByteLevel decoder passes through unchanged.
  virtual void Decode(std::vector<std::string>* tokens,
                      const std::set<std::string, std::less<>>& added) const = 0;

  static Result<std::unique_ptr<HfDecoder>> Parse(const nlohmann::json& j,
                                                  const std::string& field);
};

}  // namespace failsafe
