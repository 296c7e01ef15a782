#include "common/units.h"

#include <cctype>
#include <cmath>
#include <cstdlib>

namespace failsafe {
namespace {

// Splits "1.5GiB" into 1.5 and "GiB". Returns false if no number leads.
bool SplitNumber(std::string_view text, double* value, std::string* unit) {
  std::string s(text);
  char* end = nullptr;
  *value = std::strtod(s.c_str(), &end);
  if (end == s.c_str() || !std::isfinite(*value)) return false;
  *unit = std::string(end);
  while (!unit->empty() && std::isspace(static_cast<unsigned char>(unit->front())))
    unit->erase(0, 1);
  return true;
}

}  // namespace

Result<int64_t> ParseBytes(std::string_view text) {
  double v = 0;
  std::string unit;
  if (!SplitNumber(text, &v, &unit) || v < 0) {
    return InvalidArgument("'{}' is not a size (examples: 4096, 512MiB, 2GiB)", text);
  }
  double mult = 0;
  if (unit.empty() || unit == "B")
    mult = 1;
  else if (unit == "KiB" || unit == "K")
    mult = 1024.0;
  else if (unit == "MiB" || unit == "M")
    mult = 1024.0 * 1024;
  else if (unit == "GiB" || unit == "G")
    mult = 1024.0 * 1024 * 1024;
  else if (unit == "TiB" || unit == "T")
    mult = 1024.0 * 1024 * 1024 * 1024;
  else if (unit == "KB")
    mult = 1e3;
  else if (unit == "MB")
    mult = 1e6;
  else if (unit == "GB")
    mult = 1e9;
  else if (unit == "TB")
    mult = 1e12;
  else
    return InvalidArgument("'{}': unknown size unit '{}'", text, unit);
  double bytes = v * mult;
  if (bytes > 9.0e18) return InvalidArgument("'{}' is too large", text);
  return static_cast<int64_t>(std::llround(bytes));
}

Result<double> ParseDuration(std::string_view text) {
  double v = 0;
  std::string unit;
  if (!SplitNumber(text, &v, &unit) || v < 0) {
    return InvalidArgument("'{}' is not a duration (examples: 250ms, 2.5s)", text);
  }
  if (unit == "s" || unit.empty()) return v;
  if (unit == "ms") return v * 1e-3;
  if (unit == "us") return v * 1e-6;
  if (unit == "ns") return v * 1e-9;
  if (unit == "min") return v * 60;
  return InvalidArgument("'{}': unknown duration unit '{}'", text, unit);
}

std::string FormatBytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int i = 0;
  while (std::fabs(bytes) >= 1024.0 && i < 4) {
    bytes /= 1024.0;
    ++i;
  }
  if (i == 0) return fmt::format("{:.0f} B", bytes);
  return fmt::format("{:.2f} {}", bytes, units[i]);
}

}  // namespace failsafe
