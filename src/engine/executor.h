// Executors run forward steps on the devices of a plan. The in-process
// executor runs one device in the calling process; the worker-group executor
// (worker_group.h) runs one process per device.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "common/status.h"
#include "model/config.h"
#include "model/weights.h"
#include "placement/plan.h"
#include "placement/replan.h"
#include "worker/step.h"

namespace failsafe {

// What one step cost, per device and in total.
struct StepTiming {
  int64_t wall_ns = 0;
  // Emulated time: sum over sync segments of the slowest device's compute
  // time in that segment (wall time with one core per device).
  int64_t emulated_ns = 0;
  std::vector<int> devices;                // device ids, parallel to the vectors below
  std::vector<int64_t> device_compute_ns;  // compute (CPU) time per device (sum of its segments)
  // Wall time per device outside collectives: what a slow device (throttled,
  // or sharing its cores) stretches.
  std::vector<int64_t> device_compute_wall_ns;
  std::vector<double> device_attention_flops;
  std::vector<double> device_ffn_flops;
  std::vector<int64_t> device_kv_bytes;  // KV in use after the step
  // Per sync segment: the slowest device's compute time.
  std::vector<int64_t> segment_max_ns;
};

class HostKvBackup;

// Why and when a device was lost.
struct DeviceLoss {
  int64_t failed_ns = 0;    // the failure: the kill (injected), the last progress (hang), else 0
  int64_t detected_ns = 0;  // the executor knew; 0: the device is not lost
  std::string reason;       // "its process exited", "no progress for 812 ms", ...
};

// What applying a plan cost, per device and for the coordinator.
struct ApplyReport {
  std::vector<int> devices;
  std::vector<ApplyStats> stats;  // per device, parallel to `devices`
  int64_t group_ns = 0;           // forming the new collective group
  int64_t wall_ns = 0;
};

// What a step produced, valid until the next step: the logits
// [num_logits_rows, vocab] of devices that compute them; or, from devices
// that are modelled rather than run (the simulator's, sim/sim_executor.h),
// one sampled token per logits row.
struct StepOutput {
  const float* logits = nullptr;
  const int32_t* tokens = nullptr;
};

// A new virtual method here must be forwarded by ExecutorWrapper below and
// called in fault_injection_test.cc's WrappersForwardEveryMethod.
class Executor {
 public:
  virtual ~Executor() = default;
  virtual const ModelConfig& config() const = 0;
  virtual const Plan& plan() const = 0;
  // Runs one step on every active device; what it produced is valid until
  // the next step.
  virtual Result<StepOutput> Step(const StepBatch& batch, StepTiming* timing) = 0;
  // Releases sequences' KV on every device.
  virtual Status FreeSeqs(const std::vector<int64_t>& seq_ids) = 0;
  Status FreeSeq(int64_t seq_id) { return FreeSeqs({seq_id}); }
  // KV pool per device id, in pages of block_size tokens of one (layer, head).
  virtual std::vector<int64_t> kv_capacity_pages() const = 0;
  virtual int block_size() const = 0;
  // What the KV pages hold (f32 or bf16), and the bytes of one page.
  virtual DType kv_dtype() const { return DType::kF32; }
  int64_t kv_page_bytes() const { return KvPageBytes(config(), block_size(), kv_dtype()); }
  static int64_t KvPageBytes(const ModelConfig& config, int block_size, DType kv_dtype) {
    return 2LL * block_size * config.head_dim * static_cast<int64_t>(DTypeSize(kv_dtype));
  }

  // Fault tolerance; executors of one device support none of it.
  virtual bool supports_recovery() const { return false; }
  virtual HostKvBackup* backup() { return nullptr; }
  virtual std::vector<int> alive_devices() const { return plan().alive; }
  // Looks for dead or hung devices (heartbeat with a deadline).
  virtual Status CheckHealth(int64_t timeout_ms) { return Status::Ok(); }
  // Waits until every device's KV backup holds every finished step.
  virtual Status DrainBackup() { return Status::Ok(); }
  // KV capacity per device under a plan (the devices' memory minus weights).
  virtual Result<std::vector<int64_t>> KvCapacityFor(const Plan& plan) const {
    return kv_capacity_pages();
  }
  // Moves every device to `next`; `seqs` lists, per device, every live
  // sequence with its block table there.
  virtual Result<ApplyReport> ApplyPlan(const Plan& next, RecoveryMode mode,
                                        const DeviceRestores& seqs) {
    return FailedPrecondition("this executor cannot change its plan");
  }
  // A new device in the place of a dead one (the engine's Rejoin). `wait`:
  // a device on another host is taken once its link is measured fit; with
  // false the call does not wait for that (NotFound until it is).
  virtual Status SpawnDevice(int device, bool wait) {
    return FailedPrecondition("this executor has no device processes");
  }
  // The device's latest loss (detected_ns 0 while it is alive).
  virtual DeviceLoss device_loss(int device) const { return {}; }
  // The device's worker process, or -1 (none, or not a separate process).
  virtual int device_pid(int device) const { return -1; }
};

// Faults injected into an executor's devices by an operator or a test (the
// server's /admin/fail, `run --fail`, the benchmarks), not by the engine: an
// executor whose devices can die or slow down implements this beside
// Executor, and the engine never sees it.
class DeviceFaults {
 public:
  virtual ~DeviceFaults() = default;
  // The device dies now (for a worker process: SIGKILL).
  virtual Status KillDevice(int device) = 0;
  // Slows a device to `speed` (0, 1] of its compute speed until it is
  // replaced (a throttled accelerator).
  virtual Status SetDeviceSpeed(int device, double speed) = 0;
};

// An executor over another that forwards every call to it (LevelDB's
// EnvWrapper): a wrapper overrides only the calls it changes and cannot drop
// the others. `inner` must outlive the wrapper.
class ExecutorWrapper : public Executor {
 public:
  explicit ExecutorWrapper(Executor* inner) : inner_(inner) {}
  Executor* inner() const { return inner_; }

  const ModelConfig& config() const override { return inner_->config(); }
  const Plan& plan() const override { return inner_->plan(); }
  Result<StepOutput> Step(const StepBatch& batch, StepTiming* timing) override {
    return inner_->Step(batch, timing);
  }
  Status FreeSeqs(const std::vector<int64_t>& seq_ids) override {
    return inner_->FreeSeqs(seq_ids);
  }
  std::vector<int64_t> kv_capacity_pages() const override { return inner_->kv_capacity_pages(); }
  int block_size() const override { return inner_->block_size(); }
  DType kv_dtype() const override { return inner_->kv_dtype(); }
  bool supports_recovery() const override { return inner_->supports_recovery(); }
  HostKvBackup* backup() override { return inner_->backup(); }
  std::vector<int> alive_devices() const override { return inner_->alive_devices(); }
  Status CheckHealth(int64_t timeout_ms) override { return inner_->CheckHealth(timeout_ms); }
  Status DrainBackup() override { return inner_->DrainBackup(); }
  Result<std::vector<int64_t>> KvCapacityFor(const Plan& plan) const override {
    return inner_->KvCapacityFor(plan);
  }
  Result<ApplyReport> ApplyPlan(const Plan& next, RecoveryMode mode,
                                const DeviceRestores& seqs) override {
    return inner_->ApplyPlan(next, mode, seqs);
  }
  Status SpawnDevice(int device, bool wait) override { return inner_->SpawnDevice(device, wait); }
  DeviceLoss device_loss(int device) const override { return inner_->device_loss(device); }
  int device_pid(int device) const override { return inner_->device_pid(device); }

 private:
  Executor* const inner_;
};

// The executor's fault interface, or null if its devices cannot be killed:
// its own, or that of the executor under any stack of wrappers.
inline DeviceFaults* FaultsOf(Executor* e) {
  while (e) {
    if (auto* f = dynamic_cast<DeviceFaults*>(e)) return f;
    auto* w = dynamic_cast<ExecutorWrapper*>(e);
    e = w ? w->inner() : nullptr;
  }
  return nullptr;
}

// Single-sequence generation over an executor: prefill in chunks of at most
// `prefill_chunk` tokens, then decode. Used by `failsafe generate` with one
// sequence and by the numerical tests.
struct GenerateOptions {
  int max_tokens = 16;
  int prefill_chunk = 512;
  SamplingParams sampling;
  std::vector<int> stop_token_ids;  // generation ends after any of these
  bool record_logits = false;       // keep the logits of every sampled position
  int64_t seq_id = 1;
};
struct GenerateResult {
  std::vector<int> output_ids;
  std::vector<std::vector<float>> logits;  // per sampled position, if recorded
  std::vector<int> logits_positions;       // position whose next token the logits predict
};
Result<GenerateResult> GenerateOne(Executor& exec, Backend& sampler, const std::vector<int>& prompt,
                                   const GenerateOptions& options);

}  // namespace failsafe
