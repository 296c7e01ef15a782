// tokenizer.json pre-tokenizers: ByteLevel, Split (every behaviour, inverted or not),
// Metaspace, Digits and Sequence. They cut normalized text into the words the
// model encodes one by one. Any other type or behaviour is an error naming its
// field.
//
// Thread-safety: immutable after Parse.
#pragma once

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/status.h"

namespace failsafe {

class HfPreTokenizer {
 public:
  virtual ~HfPreTokenizer() = default;
  // Replaces every piece by its sub-pieces. `section_index` is the position
  // of the text between added tokens that the pieces come from (Metaspace's
  // prepend_scheme "first" prepends only in section 0).
  virtual void Split(std::vector<std::string>* pieces, int section_index) const = 0;
  // The words of one piece, handed to `emit` in order as they are found,
  // until emit returns false (then returns false): the same words as Split,
  // without cutting a long text whole first.
  virtual bool SplitEach(std::string piece, int section_index,
                         const std::function<bool(std::string&&)>& emit) const;

  static Result<std::unique_ptr<HfPreTokenizer>> Parse(const nlohmann::json& j,
                                                       const std::string& field);
};

// The settings a Metaspace pre-tokenizer and decoder share: the replacement
// for spaces, and where it is prepended (prepend_scheme, or the older
// add_prefix_space).
struct MetaspaceSettings {
  std::string replacement = "\u2581";
  enum class Scheme { kAlways, kFirst, kNever } scheme = Scheme::kAlways;
};
Result<MetaspaceSettings> ParseMetaspace(const nlohmann::json& j, const std::string& field);

// Byte-level BPE's reversible byte <-> printable code point map (GPT-2).
int ByteToCodePoint(unsigned char b);
// Inverse; -1 if the code point is not one of the 256 images.
int CodePointToByte(int cp);

}  // namespace failsafe
