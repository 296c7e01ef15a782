// Fuzzes the safetensors header parser with whole files.
#include <cstddef>
#include <cstdint>

#include "model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto r = failsafe::ParseSafetensorsHeader(data, size, "fuzz.safetensors");
  if (r.ok()) {
    for (auto& t : *r) {
      // Every accepted tensor lies inside the data section.
      if (t.end < t.begin) __builtin_trap();
    }
  }
  return 0;
}
