// Server-sent events as the OpenAI streaming API sends them ("data: X" lines,
// an event per blank line): what every client of the server reads.
#pragma once

#include <string>
#include <vector>

namespace failsafe {

// Splits complete SSE events off the front of `buffer` (each "data: X" up to
// a blank line) and returns their data payloads; what is left is an event
// still arriving. Lines other than data lines (comments, "event:") are
// dropped.
std::vector<std::string> TakeSseData(std::string* buffer);

}  // namespace failsafe
