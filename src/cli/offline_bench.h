// What the offline benchmarks (recovery-bench, slow-bench) run on: a model
// (a directory, or the synthetic small-llama created in the cache), its
// config, and decode-heavy requests with OpenThoughts-like lengths that all
// arrive at once.
#pragma once

#include <string>

#include "common/status.h"
#include "model/config.h"
#include "trace/workload.h"

namespace failsafe {

struct OfflineBenchInput {
  std::string model_dir;
  ModelConfig config;
  Workload workload;  // every arrival at 0
};

Result<OfflineBenchInput> LoadOfflineBenchInput(const std::string& model,
                                                const std::string& cache_dir, int requests,
                                                double length_scale);

}  // namespace failsafe
