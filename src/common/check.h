// FS_CHECK guards invariants (never user input): on failure it prints the
// condition and location and aborts the process.
#pragma once

#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>

#define FS_CHECK(cond)                                                                    \
  do {                                                                                    \
    if (!(cond)) [[unlikely]] {                                                           \
      std::fprintf(stderr, "%s:%d: invariant violated: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                       \
    }                                                                                     \
  } while (0)

#define FS_CHECK_MSG(cond, ...)                                                              \
  do {                                                                                       \
    if (!(cond)) [[unlikely]] {                                                              \
      std::fprintf(stderr, "%s:%d: invariant violated: %s: %s\n", __FILE__, __LINE__, #cond, \
                   fmt::format(__VA_ARGS__).c_str());                                        \
      std::abort();                                                                          \
    }                                                                                        \
  } while (0)
