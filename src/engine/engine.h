// The coordinator's engine loop: scheduler -> step plan -> executor ->
// sampling -> scheduler, one step at a time.
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

struct StepOutcome {
  bool ran = false;  // false: nothing to do
  std::vector<TokenEvent> events;
  StepTiming timing;
  StepPlan plan;
};

class Engine {
 public:
  // `executor` must outlive the engine.
  Engine(Executor* executor, const SchedulerConfig& config, const DeviceSpeed& speed = {});

  // Queues a request; ids are assigned in submission order from 1.
  Result<int64_t> Submit(RequestSpec spec);
  // Finishes a request early and frees its KV.
  void Abort(int64_t id);
  // Runs one step if there is work.
  Result<StepOutcome> Step();
  bool idle() const { return scheduler_->idle(); }

  Scheduler& scheduler() { return *scheduler_; }
  Executor& executor() { return *executor_; }
  const ModelConfig& config() const { return executor_->config(); }

 private:
  Status FreeFinished(std::vector<TokenEvent>* events);

  Executor* const executor_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<Backend> sampler_;
  std::unordered_map<int64_t, SamplingParams> sampling_;
  std::vector<int64_t> to_free_;
  int64_t next_id_ = 1;
};

}  // namespace failsafe
