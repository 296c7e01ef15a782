// Minimal leveled logging to stderr. Thread-safe (one write per line).
#pragma once

#include <fmt/format.h>

#include <string_view>

namespace failsafe {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3, kOff = 4 };

// Set once at start-up (from a command-line flag); read by every thread.
void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();
// Parses "debug", "info", "warn", "error", "off".
bool ParseLogLevel(std::string_view text, LogLevel* level);
// A tag printed before every line of this process (e.g. "worker 3").
void SetLogTag(std::string tag);

void LogLine(LogLevel level, std::string_view message);

template <typename... Args>
void Log(LogLevel level, fmt::format_string<Args...> f, Args&&... args) {
  if (level < GetLogLevel()) return;
  LogLine(level, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace failsafe

#define FS_LOG_DEBUG(...) ::failsafe::Log(::failsafe::LogLevel::kDebug, __VA_ARGS__)
#define FS_LOG_INFO(...) ::failsafe::Log(::failsafe::LogLevel::kInfo, __VA_ARGS__)
#define FS_LOG_WARN(...) ::failsafe::Log(::failsafe::LogLevel::kWarn, __VA_ARGS__)
#define FS_LOG_ERROR(...) ::failsafe::Log(::failsafe::LogLevel::kError, __VA_ARGS__)
