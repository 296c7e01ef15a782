// One simulated serving instance: the engine itself (engine/engine.h) over a
// simulated executor (sim/sim_executor.h) on a virtual clock. Steps take the
// cost model's time; failures and rejoins run the engine's own recovery
// (replanning, KV restored from the host backup or recomputed, retries), its
// plan changes priced by the executor.
//
// Thread-safety: none.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "common/clock.h"
#include "core/scheduler.h"
#include "engine/engine.h"
#include "placement/replan.h"
#include "sim/cost_model.h"
#include "sim/sim_executor.h"
#include "trace/workload.h"

namespace failsafe {

struct SimRequest {
  double arrival = 0;
  int input = 0;
  int output = 0;
  bool migrated = false;  // decode instance: the prompt's KV arrives computed, first token sampled
  // The trace's block ids of the prompt (trace/workload.h): with a prefix
  // cache, equal ids give equal tokens, so the scheduler's cache sees the
  // trace's sharing. Empty: a prompt of its own.
  std::vector<int64_t> hash_ids = {};
  int block_tokens = kTraceHashBlock;
};

struct InstanceConfig {
  ModelConfig model;
  HardwareProfile hw;
  Policy policy = Policy::kHybrid;
  int num_devices = 8;
  std::vector<int> alive;  // empty: all
  SchedulerConfig sched;
  int block_size = 16;
  RecoveryMode recovery = RecoveryMode::kFull;
  bool record_gaps = false;  // keep every gap between consecutive tokens
  // Overrides, to mirror a real engine exactly: its KV pool per device and
  // the speeds its scheduler assumes (default: from the cost model).
  std::vector<int64_t> kv_pages;
  std::optional<DeviceSpeed> scheduler_speed;
  // Host memory for the KV backup (SimExecutorOptions::backup_bytes); 0: room
  // for all the KV, < 0: none.
  int64_t backup_bytes = 0;
  uint64_t prompt_seed = 0;  // prompt tokens, when sched.prefix_cache
  // The engine gives a device that stays slow a smaller share of the work
  // (EngineOptions::rebalance_slow).
  bool rebalance_slow = false;
  // The policy of each plan a recovery makes, by devices alive
  // (EngineOptions::policy_for); empty: `policy` throughout.
  std::function<Policy(int alive_devices)> policy_for;
};

// One of the engine's recovery reports (engine/recovery_report.h), in
// virtual seconds.
struct SimRecovery {
  RecoveryMode mode = RecoveryMode::kFull;
  double at = 0;  // virtual time of the failure
  double detect_s = 0;
  double replan_s = 0;  // replanning, aborting the failed step
  // The plan change on the devices: a new collective group, then weights and
  // KV (each phase's slowest device; a full recovery moves them at once).
  double apply_s = 0;
  double weights_s = 0, kv_s = 0;
  int64_t weight_pcie_bytes = 0, weight_nvlink_bytes = 0, kv_bytes = 0;
  int64_t tokens_recomputed = 0;
  double recompute_s = 0;  // step time spent recomputing lost KV (filled as it happens)
  double stall_s() const { return detect_s + replan_s + apply_s; }
  double total_s() const { return stall_s() + recompute_s; }
};

struct SimRequestResult {
  double arrival = 0;
  double first_token = -1;  // time of its first sampled token here
  double finish = -1;
  double max_tbt = 0;  // longest gap between consecutive tokens
  double last_token = -1;
  int tokens = 0;
  int input = 0;
  int output = 0;  // tokens asked for (with a migrated request's first one)
};

class SimInstance {
 public:
  static Result<std::unique_ptr<SimInstance>> Create(const InstanceConfig& config);

  // Queues a request (its arrival is the current clock or later).
  Status Submit(const SimRequest& r);
  // Runs steps until the clock reaches `t` (idle time jumps to `t`).
  void RunUntil(double t);
  // Runs until every submitted request finished or the clock reaches `limit`.
  void RunToCompletion(double limit);
  // Kills a device now; the engine finds it at once (a heartbeat) and
  // recovers. Fails if the device is not alive, or if too few devices remain
  // (the engine is then degraded until a device rejoins).
  Result<SimRecovery> Fail(int device);
  // Kills the devices at once: one recovery.
  Result<SimRecovery> Fail(const std::vector<int>& devices);
  Result<SimRecovery> Rejoin(int device);
  // The clock jumps to `t` (when later) and nothing runs in between: a pause
  // (a switching delay), or time skipped over (its work credited elsewhere).
  void AdvanceTo(double t);
  // Requests submitted and not finished.
  int64_t pending() const { return static_cast<int64_t>(index_.size()); }
  // The unfinished requests, in submission order, as they would restart on
  // an instance without their KV: the tokens generated so far join the
  // prompt and only the rest are asked for (a migrated request's first
  // token among them).
  std::vector<SimRequest> Unfinished() const;

  double clock() const { return clock_->NowSeconds(); }
  const Plan& plan() const { return executor_->plan(); }
  Scheduler& scheduler() { return engine_->scheduler(); }
  Engine& engine() { return *engine_; }
  SimExecutor& executor() { return *executor_; }
  const std::vector<SimRequestResult>& results() const { return results_; }
  int64_t tokens_in() const { return tokens_in_; }    // prompt tokens computed
  int64_t tokens_out() const { return tokens_out_; }  // tokens sampled
  int64_t steps() const { return steps_; }
  int64_t preemptions() const { return preemptions_; }
  double busy_s() const { return busy_s_; }
  double last_step_end() const { return last_step_end_; }
  // The engine's recovery reports so far (the last one's recompute grows as
  // its lost KV is recomputed).
  const std::vector<SimRecovery>& recoveries() const;
  const std::vector<float>& gaps() const { return gaps_; }
  // The KV capacity in tokens of the most constrained device (TP slots only).
  int64_t KvTokenCapacity() const;

 private:
  SimInstance() = default;
  // One engine step; false if nothing could run (idle, waiting for memory,
  // or degraded).
  bool StepOnce();
  // Sequences the recovery since `running` (the running ones before it) sent
  // back to wait.
  void CountPreempted(const std::vector<int64_t>& running);
  std::vector<int64_t> RunningIds() const;

  InstanceConfig config_;
  std::unique_ptr<FakeClock> clock_;  // outlives the executor and the engine
  std::unique_ptr<SimExecutor> executor_;
  std::unique_ptr<Engine> engine_;
  std::unordered_map<int64_t, int> index_;  // sequence id -> results_ index
  std::vector<SimRequestResult> results_;
  int64_t tokens_in_ = 0, tokens_out_ = 0, steps_ = 0, preemptions_ = 0;
  double busy_s_ = 0;
  double last_step_end_ = 0;
  mutable std::vector<SimRecovery> recoveries_;
  std::vector<float> gaps_;
};

}  // namespace failsafe
