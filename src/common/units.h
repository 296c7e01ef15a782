// Parsing and printing of sizes and durations given on the command line.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace failsafe {

// "123", "64KiB", "2GiB", "1.5GB", "512MiB" -> bytes.
Result<int64_t> ParseBytes(std::string_view text);
// "250ms", "2.5s", "10us" -> seconds.
Result<double> ParseDuration(std::string_view text);
// 1536 -> "1.5 KiB".
std::string FormatBytes(double bytes);

}  // namespace failsafe
