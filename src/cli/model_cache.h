// Locating models: a directory given by the user, or the default synthetic
// model, created on first use in the cache directory.
#pragma once

#include <string>

#include "common/status.h"

namespace failsafe {

// The cache directory: --cache-dir if given, else $XDG_CACHE_HOME/failsafe,
// else $HOME/.cache/failsafe.
std::string DefaultCacheDir(const std::string& flag_value);

// Returns `model_dir` if non-empty; otherwise the path of the synthetic model
// `preset` (seed 0) in the cache, creating it if missing. Safe to call from
// several processes at once.
Result<std::string> ResolveModel(const std::string& model_dir, const std::string& cache_dir,
                                 const std::string& preset);

// Removes what a process killed while it created a model left in the cache
// (a "<model>.tmp.<pid>" directory whose process is gone); a live process's
// directory is left alone. Returns how many were removed.
int RemoveStaleModelTemps(const std::string& cache_dir);

// Creates a synthetic model at `dir` atomically (build in a temporary
// directory, then rename), unless it already exists.
Status EnsureSyntheticModel(const std::string& dir, const std::string& preset, uint64_t seed);

}  // namespace failsafe
