// The open-file limit (RLIMIT_NOFILE): every connection of a server or a load
// client is a file descriptor, and the usual soft limit (1024) is far below
// what a thousand streams need.
#pragma once

#include <cstdint>

namespace failsafe {

struct FileLimit {
  int64_t soft = 0;  // in force now
  int64_t hard = 0;  // the most an unprivileged process may raise it to
};

// Raises the soft limit to `wanted` descriptors, or as far as the hard limit
// allows; never lowers it. Returns the limits in force afterwards.
FileLimit RaiseOpenFileLimit(int64_t wanted);

}  // namespace failsafe
