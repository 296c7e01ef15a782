// Fuzzes tokenizer.json parsing; an accepted tokenizer must encode any text
// into ids of its vocabulary and decode them into valid UTF-8.
#include <cstddef>
#include <cstdint>
#include <string>

#include "model/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto t = failsafe::Tokenizer::Parse(text, "fuzz.json");
  if (t.ok()) {
    for (std::string_view probe : {"hello, world 123", " \xE6\x97\xA5 <s> \xFF  x"}) {
      const std::vector<int> ids = (*t)->Encode(probe, /*add_special=*/true);
      for (int id : ids) {
        if (id < 0 || id >= (*t)->vocab_size()) __builtin_trap();
      }
      if (!failsafe::IsValidUtf8((*t)->Decode(ids))) __builtin_trap();
    }
  }
  return 0;
}
