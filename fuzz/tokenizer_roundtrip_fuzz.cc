// Fuzzes encoding: any byte string must decode back to itself read as
// Unicode (invalid UTF-8 as U+FFFD).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "model/synthetic.h"
#include "model/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static std::unique_ptr<failsafe::Tokenizer> tok = [] {
    return std::move(
               failsafe::Tokenizer::Parse(failsafe::BuildSyntheticTokenizer(4096, 1).json, "t"))
        .value();
  }();
  std::string s(reinterpret_cast<const char*>(data), size);
  auto ids = tok->Encode(s);
  for (int id : ids) {
    if (id < 0 || id >= tok->vocab_size()) __builtin_trap();
  }
  if (tok->Decode(ids) != failsafe::ToValidUtf8(s)) __builtin_trap();
  return 0;
}
