// Edits of a streamed chunk's JSON text ("data: {...}" of an SSE event from a
// FailSafe node) without parsing it: the router touches every chunk of every
// stream it proxies, so the common edits are scans of the text. Keys are
// matched only outside strings (a quote inside a JSON string is escaped, so
// `"token_ids":[` cannot occur inside one).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace failsafe {

// Appends the ids of every "token_ids" list of the chunk to `out`; returns how
// many were appended (0 when the chunk carries none). nullopt: a list that is
// not a list of integers.
std::optional<int> AppendChunkTokenIds(std::string_view chunk, std::vector<int32_t>* out);

// Removes every "token_ids" member that is a flat list of integers (key,
// list and one separating comma); any other stays as it is.
void StripTokenIds(std::string* chunk);

// The value of a string member of the top-level object, or nullopt.
std::optional<std::string> TopLevelString(std::string_view chunk, std::string_view key);

// Replaces the value of the top-level string member `key` with the JSON string
// literal `literal` (quotes included); false when there is no such member.
bool ReplaceTopLevelString(std::string* chunk, std::string_view key, std::string_view literal);

}  // namespace failsafe
