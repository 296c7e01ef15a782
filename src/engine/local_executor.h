// One device in this process (LocalExecutor): the executor of `generate`,
// the numerical tests and the benchmarks; it holds the device's model
// itself, so it lives apart from the Executor interface.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "engine/executor.h"
#include "model/weights.h"
#include "worker/device_model.h"

namespace failsafe {

struct LocalExecutorOptions {
  int threads = 1;
  int block_size = 16;
  int64_t kv_pages = 0;  // 0: enough for 64K tokens, or what device_memory_bytes leaves
  // Memory of the device (weights + KV + activations of max_step_tokens), as
  // WorkerGroupOptions::device_memory_bytes; 0: no limit.
  int64_t device_memory_bytes = 0;
  int max_step_tokens = 2048;
  // Of the KV pages (KvCache); unset: the model's (DefaultKvDtype).
  std::optional<DType> kv_dtype = DType::kF32;
  // The CPU kernels' instruction-set level; unset: the best the CPU has.
  std::optional<CpuIsa> isa;
  std::optional<bool> dpbf16;  // CpuBackendOptions::dpbf16
  int gpu = -1;                // >= 0: the CUDA backend on this GPU
  GpuGemm gpu_gemm = GpuGemm::kLt;
  bool gpu_graphs = false;                            // CudaBackendOptions::graphs
  bool gpu_dependent_launch = false;                  // CudaBackendOptions::dependent_launch
  GpuAttention gpu_attention = GpuAttention::kCores;  // CudaBackendOptions::attention
  bool peer_collectives = false;  // DeviceOptions::peer_collectives (alone: nothing to do)
  // Benchmarks: wraps the backend (e.g. to time its calls); unset: none.
  std::function<std::unique_ptr<Backend>(std::unique_ptr<Backend>)> wrap_backend;
};

// One device, in this process.
class LocalExecutor final : public Executor {
 public:
  static Result<std::unique_ptr<LocalExecutor>> Create(const std::string& model_dir,
                                                       const LocalExecutorOptions& options);
  const ModelConfig& config() const override { return config_; }
  const Plan& plan() const override { return device_->plan(); }
  Result<StepOutput> Step(const StepBatch& batch, StepTiming* timing) override;
  Status FreeSeqs(const std::vector<int64_t>& seq_ids) override;
  std::vector<int64_t> kv_capacity_pages() const override { return {device_->kv().max_pages()}; }
  int block_size() const override { return device_->kv().block_size(); }
  DType kv_dtype() const override { return device_->kv().kv_dtype(); }

 private:
  LocalExecutor() = default;
  std::vector<float> logits_;
  ModelConfig config_;
  std::unique_ptr<WeightStore> host_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<DeviceModel> device_;
};

}  // namespace failsafe
