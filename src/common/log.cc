#include "common/log.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>

namespace failsafe {
namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::kWarn)};
std::mutex g_tag_mu;
std::string g_tag;  // guarded by g_tag_mu
}  // namespace

void SetLogLevel(LogLevel level) { g_level.store(static_cast<int>(level)); }
LogLevel GetLogLevel() { return static_cast<LogLevel>(g_level.load(std::memory_order_relaxed)); }

bool ParseLogLevel(std::string_view text, LogLevel* level) {
  if (text == "debug")
    *level = LogLevel::kDebug;
  else if (text == "info")
    *level = LogLevel::kInfo;
  else if (text == "warn")
    *level = LogLevel::kWarn;
  else if (text == "error")
    *level = LogLevel::kError;
  else if (text == "off")
    *level = LogLevel::kOff;
  else
    return false;
  return true;
}

void SetLogTag(std::string tag) {
  std::lock_guard<std::mutex> lock(g_tag_mu);
  g_tag = std::move(tag);
}

void LogLine(LogLevel level, std::string_view message) {
  static const char* kNames[] = {"D", "I", "W", "E", "-"};
  auto now = std::chrono::system_clock::now().time_since_epoch();
  double secs = std::chrono::duration<double>(now).count();
  std::string tag;
  {
    std::lock_guard<std::mutex> lock(g_tag_mu);
    tag = g_tag.empty() ? "failsafe" : g_tag;
  }
  std::string line =
      fmt::format("[{} {:.3f} {}] {}\n", kNames[static_cast<int>(level)], secs, tag, message);
  // One write(2) per line keeps lines from different processes whole.
  ssize_t unused = ::write(STDERR_FILENO, line.data(), line.size());
  (void)unused;
}

}  // namespace failsafe
