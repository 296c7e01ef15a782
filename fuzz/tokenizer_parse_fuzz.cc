// Fuzzes tokenizer.json parsing; an accepted tokenizer must round-trip text.
#include <cstddef>
#include <cstdint>
#include <string>

#include "model/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto t = failsafe::Tokenizer::Parse(text, "fuzz.json");
  if (t.ok()) {
    const std::string probe = "hello, world 123";
    if ((*t)->Decode((*t)->Encode(probe)) != probe) __builtin_trap();
  }
  return 0;
}
