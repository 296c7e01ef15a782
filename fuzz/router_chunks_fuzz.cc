// Fuzzes what the fleet router reads from nodes without parsing it: a stream
// cut into SSE events in pieces of the sizes the input gives, and the scans
// and edits of each event. On an event that is a JSON object, the edits must
// leave a JSON object: without "token_ids" lists of integers after
// StripTokenIds, and with the new top-level id after ReplaceTopLevelString.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/sse.h"
#include "router/chunk_edit.h"

using namespace failsafe;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const char* p = reinterpret_cast<const char*>(data);
  std::string buffer;
  size_t pos = 0;
  while (pos < size) {
    const size_t piece = static_cast<uint8_t>(p[pos++]) + 1;
    const size_t n = std::min(piece, size - pos);
    buffer.append(p + pos, n);
    pos += n;
    for (std::string& event : TakeSseData(&buffer)) {
      std::vector<int32_t> ids;
      const auto count = AppendChunkTokenIds(event, &ids);
      if (count && static_cast<size_t>(*count) != ids.size()) __builtin_trap();
      const nlohmann::json before = nlohmann::json::parse(event, nullptr, false);
      const bool object = before.is_object();
      std::string stripped = event;
      StripTokenIds(&stripped);
      if (object && !nlohmann::json::parse(stripped, nullptr, false).is_object()) __builtin_trap();
      std::string renamed = event;
      const bool had_id = TopLevelString(event, "id").has_value();
      if (ReplaceTopLevelString(&renamed, "id", "\"cmpl-x\"") != had_id) __builtin_trap();
      if (object && had_id) {
        const nlohmann::json after = nlohmann::json::parse(renamed, nullptr, false);
        if (!after.is_object() || after.value("id", "") != "cmpl-x") __builtin_trap();
      }
    }
    if (buffer.size() > size + 1) __builtin_trap();
  }
  return 0;
}
