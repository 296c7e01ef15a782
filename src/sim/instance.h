// One simulated serving instance: a group of devices running the engine's own
// planner and scheduler, with step durations from the cost model and a virtual
// clock. Failures and rejoins replan with the same code as the engine and
// stall the instance for the recovery's modelled cost.
//
// Thread-safety: none.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "core/scheduler.h"
#include "placement/replan.h"
#include "sim/cost_model.h"
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
  uint64_t prompt_seed = 0;  // prompt tokens, when sched.prefix_cache
};

struct SimRecovery {
  RecoveryMode mode = RecoveryMode::kFull;
  double at = 0;  // virtual time of the failure
  double detect_s = 0, replan_s = 0, weights_s = 0, kv_s = 0;
  int64_t weight_pcie_bytes = 0, weight_nvlink_bytes = 0, kv_bytes = 0;
  int64_t tokens_recomputed = 0;
  double recompute_s = 0;  // step time spent recomputing lost KV (filled as it happens)
  double stall_s() const { return detect_s + replan_s + weights_s + kv_s; }
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
  // Kills a device now: the step in flight is lost, the instance stalls for
  // the recovery. Fails if too few devices would remain.
  Result<SimRecovery> Fail(int device);
  Result<SimRecovery> Rejoin(int device);

  double clock() const { return clock_; }
  const Plan& plan() const { return plan_; }
  Scheduler& scheduler() { return *scheduler_; }
  const std::vector<SimRequestResult>& results() const { return results_; }
  int64_t tokens_in() const { return tokens_in_; }    // prompt tokens computed
  int64_t tokens_out() const { return tokens_out_; }  // tokens sampled
  int64_t steps() const { return steps_; }
  int64_t preemptions() const { return preemptions_; }
  double busy_s() const { return busy_s_; }
  double last_step_end() const { return last_step_end_; }
  const std::vector<SimRecovery>& recoveries() const { return recoveries_; }
  const std::vector<float>& gaps() const { return gaps_; }
  // The KV capacity in tokens of the most constrained device (TP slots only).
  int64_t KvTokenCapacity() const;

 private:
  SimInstance() = default;
  void StepOnce();
  Result<SimRecovery> ChangePlan(const std::vector<int>& alive, bool failure);

  InstanceConfig config_;
  Plan plan_;
  std::unique_ptr<ClusterCostModel> cost_;
  std::unique_ptr<Scheduler> scheduler_;
  double clock_ = 0;
  double step_end_ = 0;                     // end of the step in flight
  std::unordered_map<int64_t, int> index_;  // sequence id -> results_ index
  std::vector<SimRequestResult> results_;
  int64_t next_id_ = 1;
  int64_t tokens_in_ = 0, tokens_out_ = 0, steps_ = 0, preemptions_ = 0;
  double busy_s_ = 0;
  double last_step_end_ = 0;
  std::vector<SimRecovery> recoveries_;
  std::vector<float> gaps_;
  std::unordered_map<int64_t, int> recompute_target_;  // sequence -> tokens it had before a failure
};

}  // namespace failsafe
