// The coordinator's engine loop: scheduler -> step plan -> executor ->
// sampling -> scheduler, one step at a time; and recovery when devices fail
// or come back.
//
// When a step fails because devices died, the engine recovers in place: it
// replans for the survivors, moves weights and restores the lost KV from the
// host backup (per the recovery mode), rolls each sequence back to what could
// be restored, and carries on. The failed step is simply scheduled again: no
// request is lost, and sampling is keyed by position, so outputs are the same.
//
// Thread-safety: one thread drives an Engine (the server funnels requests to
// it through its own queue).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "core/scheduler.h"
#include "engine/executor.h"

namespace failsafe {

struct RequestSpec {
  std::vector<int32_t> prompt;
  int max_new_tokens = 16;
  SamplingParams sampling;
  std::vector<int32_t> stop_token_ids;
  double arrival = 0;  // seconds on the caller's clock
};

struct TokenEvent {
  int64_t id = 0;
  int32_t token = -1;  // -1: no token (finished without one, e.g. aborted)
  bool finished = false;
  FinishReason reason = FinishReason::kNone;
};

// One recovery (or rejoin), phase by phase. Device-side phases are the
// slowest device's CPU time (the devices work in parallel); coordinator-side
// phases are wall time.
struct RecoveryReport {
  RecoveryMode mode = RecoveryMode::kFull;
  std::vector<int> failed_devices;
  std::vector<int> joined_devices;
  int attempts = 1;      // > 1: devices failed during the recovery
  double detect_ms = 0;  // kill -> the coordinator knows (injected failures)
  double abort_ms = 0;   // -> every survivor left the failed step
  double replan_ms = 0;  // new plan, scheduler reconfigured, backup drained
  double group_ms = 0;   // new collective group
  double weights_ms = 0;
  int64_t weight_host_bytes = 0;  // host -> devices
  int64_t weight_peer_bytes = 0;  // device -> device
  double kv_ms = 0;
  int64_t kv_restored_bytes = 0;
  int64_t tokens_recomputed = 0;
  double recompute_ms = 0;  // emulated time of steps spent recomputing lost KV
  bool finished = false;    // recompute fully paid back
  double total_ms() const {
    return detect_ms + abort_ms + replan_ms + group_ms + weights_ms + kv_ms + recompute_ms;
  }
};

struct StepOutcome {
  bool ran = false;  // false: nothing to do, or the step failed and was recovered
  std::vector<TokenEvent> events;
  StepTiming timing;
  StepPlan plan;
  bool recovered = false;  // a recovery happened in this call
};

struct EngineOptions {
  RecoveryMode recovery = RecoveryMode::kFull;
  DeviceSpeed speed;  // for the scheduler's cost estimates
  // Fault injection: called before each attempt to apply a new plan (tests
  // use it to kill a device in the middle of a recovery).
  std::function<void(int attempt)> before_apply;
};

class Engine {
 public:
  // `executor` must outlive the engine.
  Engine(Executor* executor, const SchedulerConfig& config, const EngineOptions& options = {});

  // Queues a request; ids are assigned in submission order from 1.
  Result<int64_t> Submit(RequestSpec spec);
  // Finishes a request early and frees its KV.
  void Abort(int64_t id);
  // Runs one step if there is work; recovers if devices died. Fails with
  // kUnavailable while too few devices remain to hold the model.
  Result<StepOutcome> Step();
  // Takes a restored device back (a new worker process).
  Status Rejoin(int device);
  // Heartbeat while idle: finds dead or hung devices and recovers.
  Status CheckHealth(int64_t timeout_ms);
  // Requests that cannot be served (too few devices and no rejoin coming):
  // finishes every queued and running request with kError.
  void FailAll(const std::string& why);

  bool idle() const { return scheduler_->idle(); }
  bool degraded() const { return degraded_; }
  const std::string& degraded_reason() const { return degraded_reason_; }
  const std::vector<RecoveryReport>& recoveries() const { return recoveries_; }
  Scheduler& scheduler() { return *scheduler_; }
  Executor& executor() { return *executor_; }
  const ModelConfig& config() const { return executor_->config(); }

 private:
  Status FreeSeqs(std::vector<int64_t> ids);
  void CollectFinished(std::vector<TokenEvent>* events, bool only_abnormal);
  // Moves to a plan for the alive devices; `failed`/`joined` describe why.
  Status Recover(const std::vector<int>& failed, const std::vector<int>& joined,
                 int64_t step_failed_ns);
  void ChargeRecompute(const StepPlan& plan, const StepTiming& timing);

  Executor* const executor_;
  const EngineOptions options_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<Backend> sampler_;
  std::unordered_map<int64_t, SamplingParams> sampling_;
  std::vector<int64_t> to_free_;
  int64_t next_id_ = 1;
  bool degraded_ = false;
  std::string degraded_reason_;
  std::vector<RecoveryReport> recoveries_;
  // Lost KV being recomputed: sequence -> tokens it had before the failure.
  std::unordered_map<int64_t, int> recompute_target_;
};

}  // namespace failsafe
