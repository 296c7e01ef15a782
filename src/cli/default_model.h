// The default model of serve, generate and run: the real stories260K model
// (data/models/stories260K), embedded in the program and written to the
// cache directory on first use, so the program needs no source tree.
#pragma once

#include <string>

#include "common/status.h"

namespace failsafe {

// The name the API serves it under.
inline constexpr char kDefaultModelName[] = "stories260K";

// The directory of the default model in `cache_dir`, written there (atomically,
// safe from several processes at once) if missing.
Result<std::string> EnsureDefaultModel(const std::string& cache_dir);

}  // namespace failsafe
