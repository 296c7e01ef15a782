#include "cli/offline_bench.h"

#include "cli/model_cache.h"

namespace failsafe {

Result<OfflineBenchInput> LoadOfflineBenchInput(const std::string& model,
                                                const std::string& cache_dir, int requests,
                                                double length_scale) {
  OfflineBenchInput in;
  FS_ASSIGN_OR_RETURN(in.model_dir, ResolveModel(model, cache_dir, "small-llama"));
  FS_ASSIGN_OR_RETURN(in.config, ModelConfig::Load(in.model_dir));
  WorkloadOptions wo;
  wo.length_scale = length_scale;
  wo.max_context = in.config.max_position_embeddings;
  in.workload = OpenThoughtsWorkload(requests, wo);
  for (auto& r : in.workload.requests) r.arrival_s = 0;
  return in;
}

}  // namespace failsafe
