// The coordinator's engine loop: scheduler -> step plan -> executor ->
// sampling -> scheduler, one step at a time; and recovery when devices fail
// or come back.
//
// When a step fails because devices died, the engine recovers in place: it
// replans for the survivors, moves weights and restores the lost KV from the
// host backup (per the recovery mode), rolls each sequence back to what could
// be restored, and carries on. The failed step is simply scheduled again: no
// request is lost, and sampling is keyed by position, so outputs are the same.
// Any other step error is retried on a fresh collective group and, if it
// persists, ends the requests of that step with the error: every request
// always gets an outcome.
//
// Thread-safety: one thread drives an Engine (the server funnels requests to
// it through its own queue).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "common/clock.h"
#include "core/scheduler.h"
#include "engine/executor.h"
#include "engine/recovery_report.h"
#include "engine/request_sampler.h"
#include "engine/slow_devices.h"

namespace failsafe {

struct RequestSpec {
  std::vector<int32_t> prompt;
  int max_new_tokens = 16;
  SamplingParams sampling;
  LogitControls controls;  // penalties, biases, min_tokens
  // Constrained decoding (null: none); shared by nobody else.
  std::shared_ptr<TokenConstraint> constraint;
  // Log-probabilities with each generated token: the token's and this many
  // alternatives' (0-20; -1: none).
  int logprobs = -1;
  // Log-probabilities of the prompt's tokens (after the first), with this
  // many alternatives each (0-20; -1: none): on the first token's event.
  // Such a request computes its whole prompt (no cached prefix).
  int prompt_logprobs = -1;
  std::vector<int32_t> stop_token_ids;
  double arrival = 0;  // seconds on the caller's clock
  // Disaggregated serving: a decode instance takes over a request that
  // another instance prefilled. These output tokens follow the prompt (they
  // count towards max_new_tokens), and the KV of every position but the last
  // arrives with the request. Only an engine over modelled devices
  // (EngineOptions::accept_prefilled) accepts them.
  std::vector<int32_t> prefilled_output;
  // Resuming a request another node began (and lost): the output tokens it
  // already generated. They follow the prompt and count towards
  // max_new_tokens; their KV is computed again here. Sampling is keyed by
  // position and the logits are the same on every placement, so the
  // request goes on with exactly the tokens the first node would have drawn.
  std::vector<int32_t> resumed_output;
};

struct TokenEvent {
  int64_t id = 0;
  int32_t token = -1;  // -1: no token (finished without one, e.g. aborted)
  bool finished = false;
  FinishReason reason = FinishReason::kNone;
  // reason kError: why. kUnavailable: the engine cannot serve (too few
  // devices); kInvalidArgument: the request itself; others: an engine fault.
  Status error;
  // With RequestSpec::logprobs: the token's log-probabilities.
  std::optional<PositionLogprobs> logprobs = std::nullopt;
  // With RequestSpec::prompt_logprobs, on the first token's event: those of
  // prompt tokens 1, 2, ... (the first has none).
  std::vector<PositionLogprobs> prompt_logprobs = {};
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
  // Every time the engine reads (recovery reports, device speeds, step
  // timing) comes from this clock; it must outlive the engine and read the
  // same time base as the executor's DeviceLoss instants. Null: the real
  // monotonic clock. The simulator passes its virtual clock.
  const Clock* clock = nullptr;
  DeviceSpeed speed;  // for the scheduler's cost estimates
  // Fault injection: called before each attempt to apply a new plan (tests
  // use it to kill a device in the middle of a recovery).
  std::function<void(int attempt)> before_apply;
  // Slow devices are always measured (slow_devices.h); with rebalance_slow a
  // device that stays slow gets a smaller share of heads and FFN shards (and
  // its share back once it runs at normal speed again).
  bool rebalance_slow = false;
  SlowDeviceOptions slow;
  // A recovery computed its next plan, to which `sequences` live sequences
  // move. On a real clock that time passes by itself; a simulator advances
  // its modelled clock by what the work costs (SimExecutor::Configure), so
  // the replanning time the engine measures on its clock is the modelled one.
  std::function<void(const Plan& next, int64_t sequences)> on_planned;
  // Requests may arrive with their prompt's KV already computed
  // (RequestSpec::prefilled_output): only devices that are modelled rather
  // than run hold such KV (the simulator's disaggregated serving).
  bool accept_prefilled = false;
  // The placement policy of each plan a recovery makes, by the number of
  // devices alive (hybrid attention where its balance pays for the DP head
  // groups' replicated weights, cyclic placement where it does not: the
  // simulator chooses by its cost model). Empty: the first plan's policy
  // throughout.
  std::function<Policy(int alive_devices)> policy_for;
};

// What the engine holds now, for status pages and gauges: read through
// Engine::Snapshot, so that a front end needs nothing of the scheduler.
struct EngineSnapshot {
  int running = 0;  // requests being computed
  int waiting = 0;  // requests queued
  // Per device id: KV pages requests hold (cached blocks nobody uses count
  // as free: they are evicted for room), pages it has under the current plan
  // (0 if inactive), and tokens of the requests on its DP rank.
  std::vector<int64_t> kv_used_pages, kv_capacity_pages, dp_load_tokens;
  bool prefix_cache = false;
  PrefixCacheStats prefix;  // totals since start
};

class Engine {
 public:
  // `executor` must outlive the engine.
  Engine(Executor* executor, const SchedulerConfig& config, const EngineOptions& options = {});

  // Queues a request; ids are assigned in submission order from 1. Fails
  // (kInvalidArgument, kOutOfRange) for a request that can never run.
  Result<int64_t> Submit(RequestSpec spec);
  // Finishes a request early, for `why` (a client gone: kAborted; a stop
  // string matched: kStop), and frees its KV. Unknown ids are ignored.
  void Abort(int64_t id, FinishReason why = FinishReason::kAborted);
  EngineSnapshot Snapshot() const;
  // Runs one step if there is work; recovers if devices died.
  //
  // No request is ever left without an outcome: a step that fails for another
  // reason (a collective that timed out, a device that answered with an
  // error) is retried on a fresh collective group, and if it keeps failing,
  // each request of that step finishes with kError and the error. The only
  // error returned is kUnavailable while the engine cannot serve (too few
  // devices, or a recovery that failed); requests then wait (see FailAll).
  Result<StepOutcome> Step();
  // Takes a restored device back (a new worker process). Without `wait`, a
  // device on another host whose joined worker's link is still measured is
  // not waited for: NotFound, call again later.
  Status Rejoin(int device, bool wait = true);
  // Heartbeat while idle (timeout 0: the executor's own): finds dead or hung
  // devices and recovers; while the engine cannot serve, tries again.
  Status CheckHealth(int64_t timeout_ms = 0);
  // Finishes every queued and running request with kError and `why`; returns
  // their events.
  std::vector<TokenEvent> FailAll(const Status& why);

  // No request queued, running, or finished and not yet reported.
  bool idle() const { return scheduler_->idle() && !scheduler_->has_finished(); }
  // The engine cannot serve (too few devices, or its last recovery failed).
  bool degraded() const { return degraded_; }
  const std::string& degraded_reason() const { return degraded_reason_; }
  // Every recovery so far; the last one may still wait for its first step.
  const std::vector<RecoveryReport>& recoveries() const { return recoveries_; }
  // Measured speed and share of work per device id.
  std::vector<MeasuredSpeed> device_speeds() const { return slow_.speeds(); }
  Scheduler& scheduler() { return *scheduler_; }
  Executor& executor() { return *executor_; }
  const ModelConfig& config() const { return executor_->config(); }
  const Clock& clock() const { return *clock_; }

 private:
  Status FreeSeqs(std::vector<int64_t> ids);
  // The devices' batch for a scheduled step: its sequences, tokens, KV
  // tables and backup copies (`shared_backup`: the host backup is the prefix
  // cache's host tier too).
  StepBatch BuildBatch(const StepPlan& plan, bool shared_backup);
  // The token each sampling sequence of the step draws from `logits` (or
  // the executor's own tokens where it gives no logits); -1 for the others.
  // With prompt logprobs, those of the step's prompt rows are kept for the
  // request's first token; `lps` gets each drawn token's.
  std::vector<int32_t> Sample(const StepPlan& plan, const StepBatch& batch, const StepOutput& out,
                              std::vector<std::optional<PositionLogprobs>>* lps);
  // Prompt logprobs from a chunk's rows before its last (`rows` at `logits`).
  void TakePromptLogprobs(const Sequence* s, const ScheduledSeq& ss, const float* logits, int rows);
  void CollectFinished(std::vector<TokenEvent>* events, bool only_abnormal);
  // Finishes requests with kError and `why` (they are reported by the next
  // CollectFinished).
  void Fail(const std::vector<int64_t>& ids, const Status& why);
  // A step (or a free) failed with `error`; `ids` are the requests of the
  // step. Recovers or resynchronises the devices, and fails the requests
  // once the same work has failed too often.
  Status HandleStepError(const Status& error, const std::vector<int64_t>& ids, int64_t failed_ns);
  // Moves to a plan for the alive devices (`joined` rejoined).
  // `step_failed_ns`: when the failed step (if any) returned.
  Status Recover(const std::vector<int>& joined, int64_t step_failed_ns);
  // One attempt loop of Recover, filling `r`; its phases below.
  Status RecoverOnce(RecoveryReport* r);
  void NoteLosses(RecoveryReport* r);
  Result<std::vector<int64_t>> CapacityFor(const Plan& next);
  std::unordered_map<int64_t, int> RestorableTokens(const Plan& next, const std::vector<int>& alive,
                                                    bool conservative) const;
  DeviceRestores RestoreTables(const Plan& next, const std::unordered_map<int64_t, int>& restore_of,
                               const Scheduler::KeptSharing& kept, bool conservative,
                               std::vector<SeqRestore>* seqs) const;
  void NoteApply(RecoveryReport* r, const ApplyReport& applied);
  void Settle(RecoveryReport* r, const Plan& next, const std::vector<SeqRestore>& seqs);
  // The report a new recovery extends: the last one if no step ran since.
  RecoveryReport* OpenReport(int64_t now_ns);
  void AfterStep(const StepPlan& plan, int64_t started_ns);
  // After a step: measure device speeds; with rebalance_slow, re-plan with
  // new shares when the measurements call for it.
  void WatchSpeeds(const StepTiming& timing);
  // The plan for the alive devices, with the shares in force.
  Result<Plan> NextPlan(const Plan& prev, const std::vector<int>& alive) const;
  void SetDegraded(const std::string& why);

  // Milliseconds on the engine's clock since `t0_ns`.
  double MsSince(int64_t t0_ns) const { return (clock_->NowNanos() - t0_ns) * 1e-6; }

  Executor* const executor_;
  const EngineOptions options_;
  const Clock* const clock_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<Backend> sampler_;
  std::unordered_map<int64_t, RequestSampler> samplers_;
  struct PromptLogprobs {
    int top = 0;
    std::vector<PositionLogprobs> positions;  // computed, not yet reported
  };
  std::unordered_map<int64_t, PromptLogprobs> prompt_logprobs_;
  std::unordered_map<int64_t, Status> errors_;  // requests failed by the engine
  std::vector<int64_t> to_free_;
  int64_t next_id_ = 1;
  bool degraded_ = false;
  bool recovery_failed_ = false;     // degraded because a plan change failed: try again
  std::vector<int> degraded_alive_;  // degraded for lack of devices, with these alive
  std::string degraded_reason_;
  int step_failures_ = 0;  // consecutive failed steps without a device loss
  std::vector<RecoveryReport> recoveries_;
  bool report_open_ = false;  // recoveries_.back() waits for its first step
  // Lost KV being recomputed: sequence -> tokens it had before the failure.
  std::unordered_map<int64_t, int> recompute_target_;
  // While a plan change is unfinished: the plan and DP ranks that the
  // backup's progress and the devices' KV refer to (those of the last plan
  // change that completed). A failed attempt may have moved some devices, or
  // all of them with the reply lost, and rerouted sequences; what can be
  // restored is still measured against this state. Sequences preempted by
  // any attempt lose their backup once a plan change completes.
  struct Settled {
    Plan plan;
    std::unordered_map<int64_t, int> ranks;
    std::vector<int64_t> preempted;
  };
  std::optional<Settled> settled_;
  SlowDeviceMonitor slow_;
};

}  // namespace failsafe
