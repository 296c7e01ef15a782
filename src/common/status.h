// Status and Result<T>: errors as values.
//
// Anything that can fail at run time (bad input, a dead peer, no free blocks)
// returns a Status or a Result<T>. Assertions (FS_CHECK) guard invariants only.
#pragma once

#include <fmt/format.h>

#include <cassert>
#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace failsafe {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,    // bad input from a user or a file
  kNotFound,           // a file, tensor or key is missing
  kOutOfRange,         // a value beyond a limit (context length, device id)
  kResourceExhausted,  // no free KV pages, queue full, budget exceeded
  kUnavailable,        // a peer died or too few devices remain
  kAborted,            // an operation was cancelled (collective abort)
  kDeadlineExceeded,   // a timeout expired
  kFailedPrecondition,
  kInternal,  // a bug or an OS error
};

const char* StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  std::string ToString() const;

  // Returns a copy whose message is "prefix: message".
  Status WithContext(const std::string& prefix) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

template <typename... Args>
Status InvalidArgument(fmt::format_string<Args...> f, Args&&... args) {
  return Status(StatusCode::kInvalidArgument, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
Status NotFound(fmt::format_string<Args...> f, Args&&... args) {
  return Status(StatusCode::kNotFound, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
Status OutOfRange(fmt::format_string<Args...> f, Args&&... args) {
  return Status(StatusCode::kOutOfRange, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
Status ResourceExhausted(fmt::format_string<Args...> f, Args&&... args) {
  return Status(StatusCode::kResourceExhausted, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
Status Unavailable(fmt::format_string<Args...> f, Args&&... args) {
  return Status(StatusCode::kUnavailable, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
Status Aborted(fmt::format_string<Args...> f, Args&&... args) {
  return Status(StatusCode::kAborted, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
Status DeadlineExceeded(fmt::format_string<Args...> f, Args&&... args) {
  return Status(StatusCode::kDeadlineExceeded, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
Status FailedPrecondition(fmt::format_string<Args...> f, Args&&... args) {
  return Status(StatusCode::kFailedPrecondition, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
Status Internal(fmt::format_string<Args...> f, Args&&... args) {
  return Status(StatusCode::kInternal, fmt::format(f, std::forward<Args>(args)...));
}

// Result<T> holds either a value or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}        // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {  // NOLINT
    assert(!std::get<Status>(v_).ok() && "Result built from an OK status");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace failsafe

#define FS_CONCAT_INNER(a, b) a##b
#define FS_CONCAT(a, b) FS_CONCAT_INNER(a, b)

// Returns the status from the enclosing function if it is not OK.
#define FS_RETURN_IF_ERROR(expr)             \
  do {                                       \
    ::failsafe::Status fs_status_ = (expr);  \
    if (!fs_status_.ok()) return fs_status_; \
  } while (0)

// FS_ASSIGN_OR_RETURN(auto x, Compute()): assigns the value or returns the error.
#define FS_ASSIGN_OR_RETURN(lhs, expr) \
  FS_ASSIGN_OR_RETURN_IMPL(FS_CONCAT(fs_result_, __LINE__), lhs, expr)
#define FS_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.ok()) return tmp.status();            \
  lhs = std::move(tmp).value()
