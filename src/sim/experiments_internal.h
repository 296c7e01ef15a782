// Internals shared by the experiment files.
#pragma once

#include <memory>
#include <vector>

#include "sim/experiments.h"

namespace failsafe {

// Requests [first, first + count) of the request trace (--requests, default
// the Mooncake conversation trace) in arrival order; the last `count` when
// the trace is shorter.
Result<std::vector<SimRequest>> MooncakeRequests(const ExperimentOptions& o, int first, int count);
// An offline workload, every request at time 0: `count` OpenThoughts-like
// requests, or the first `count` of --requests FILE (its lengths only).
Result<std::vector<SimRequest>> OfflineRequests(const ExperimentOptions& o, int count);
std::vector<SimRequest> OpenThoughtsRequests(int count, uint64_t seed);
// Truncates prompts that do not fit the model's context with their output
// (Mooncake has prompts past Mixtral's 64k); returns how many were cut.
int FitToContext(const ModelConfig& model, std::vector<SimRequest>* requests);
SystemSpec Tp4();
SystemSpec NonuniformTp(int n);
SystemSpec CyclicTp(int n);
// FailSafe on n devices: load-aware routing, adaptive prefill, and the
// placement chosen per phase (SystemSpec::choose_placement).
SystemSpec FailsafeTp(int n);
// FailSafe's scheduler with hybrid attention whatever it costs.
SystemSpec HybridTp(int n);
SystemSpec Tp8();
SchedulerConfig GpuSchedulerConfig(const ModelConfig& m, const SystemSpec& s);
// SaturatedThroughput, or 0 when the system cannot serve the workload at all
// (the model, or one of its requests, does not fit its devices' memory).
Result<double> ThroughputOrZero(const ModelConfig& model, const HardwareProfile& hw,
                                const SystemSpec& system, Phase phase,
                                const std::vector<SimRequest>& requests, double window_s,
                                int64_t* inflight_tokens = nullptr);
// Submits `requests` in turn (from *next, cycling) until `inst` holds as
// many unfinished requests as there are in `requests`: an offline queue that
// never empties.
Status KeepQueueFull(SimInstance* inst, const std::vector<SimRequest>& requests, size_t* next);
// How often (virtual seconds) an offline queue is refilled: far fewer
// requests finish in that time than the queue holds.
constexpr double kQueueRefillS = 5;
// Runs `inst` until `until` (virtual seconds) with its queue kept full
// (KeepQueueFull), refilled every kQueueRefillS.
Status RunQueueFull(SimInstance* inst, const std::vector<SimRequest>& requests, size_t* next,
                    double until);
// Sustained output tokens/s of an instance whose offline queue never
// empties (KeepQueueFull): measured after `warmup_s` over at least
// `window_s` and on until the instance has served a whole pass through the
// workload's output tokens (up to 24 windows), long enough for requests to
// finish and new ones to take their place (the first batches all start at
// once and run at short contexts, faster than the mix that follows) and for
// the swing of the rate over each pass to average out. 0 when the system
// cannot serve the workload (as ThroughputOrZero); with `inflight_tokens`,
// the KV tokens held by running sequences at the end.
Result<double> SustainedThroughput(const ModelConfig& model, const HardwareProfile& hw,
                                   const SystemSpec& system,
                                   const std::vector<SimRequest>& requests, double warmup_s,
                                   double window_s, int64_t* inflight_tokens = nullptr);
// a / b, or null when b is 0 (a system that cannot serve).
nlohmann::json RatioOrNull(double a, double b);
Result<nlohmann::json> OfflineGcp(const ExperimentOptions& o);
Result<nlohmann::json> Online(const ExperimentOptions& o);
Result<nlohmann::json> PrefixCache(const ExperimentOptions& o);
Result<nlohmann::json> SlowDevice(const ExperimentOptions& o);
// Submits `requests` to `inst` at their arrival times (all at the instance's
// start when `offline`), failing `device` once, at `fail_at`, before the
// first request that arrives later (none when `fail_at` < 0); then runs until
// every request finished.
Status ReplayRequests(SimInstance* inst, const std::vector<SimRequest>& requests, bool offline,
                      double fail_at, int device);
Result<std::unique_ptr<SimInstance>> MakeInstance(const ModelConfig& model,
                                                  const HardwareProfile& hw, const SystemSpec& s,
                                                  RecoveryMode mode);

}  // namespace failsafe
