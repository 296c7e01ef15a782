// Server metrics in Prometheus text format.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "core/scheduler.h"
#include "engine/recovery_report.h"

namespace failsafe {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds)
      : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}
  void Observe(double v);
  // Appends the Prometheus lines for `name` (with _bucket, _sum, _count).
  void Render(const std::string& name, const std::string& help, std::string* out) const;

 private:
  mutable std::mutex mu_;
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // guarded by mu_; last: +Inf
  double sum_ = 0;                // guarded by mu_
  uint64_t count_ = 0;            // guarded by mu_
};

struct DeviceGauge {
  int device = 0;
  bool alive = false;
  double kv_usage = 0;  // fraction of its KV pages in use
  // Slow devices (engine/slow_devices.h): speed on its work relative to its
  // peers', whether that makes it slow, its share of work (Replan's weight)
  // and its part of the work done, over the last measured window.
  bool speed_measured = false;
  double relative_speed = 1;
  bool slow = false;
  double share = 1;
  double work_fraction = 0;
  int respawns = 0;  // started again after a death (server/respawn.h)
  bool crash_looping = false;
};

// Latest values of the engine's gauges, set by the engine thread.
struct EngineGauges {
  int running = 0;
  int waiting = 0;
  int devices_alive = 0;
  int devices_total = 0;
  int min_devices = 1;  // fewer alive: /health answers 503
  double kv_usage = 0;  // KV pages in use over all active devices' pages
  // The current plan's throughput as a fraction of the fault-free plan's, by
  // the scheduler's cost model on a reference step (core/step_cost.h).
  double capacity = 1;
  std::vector<DeviceGauge> devices;
  // Prefix caching (core/scheduler.h PrefixCacheStats): totals since start.
  bool prefix_cache = false;
  PrefixCacheStats prefix;
};

class Metrics {
 public:
  Metrics();
  Histogram ttft_s, itl_s, e2e_s, recovery_stall_s;
  void AddTokens(int64_t prompt, int64_t generated);
  void AddRequest(const std::string& finish_reason);
  // A recovery whose first step has run (a rebalance for slow devices only
  // counts as one).
  void AddRecovery(const RecoveryReport& r);
  void SetGauges(EngineGauges g);
  // Prometheus text. Gauges a fleet router scrapes from vLLM are given under
  // vLLM's names too, labelled with `model_name`.
  std::string Render(const std::string& model_name) const;

 private:
  mutable std::mutex mu_;
  int64_t prompt_tokens_ = 0, generation_tokens_ = 0;  // guarded by mu_
  std::map<std::string, int64_t> requests_;            // by finish reason, guarded by mu_
  std::map<std::string, int64_t> recoveries_;          // by mode, guarded by mu_
  std::map<std::string, double> last_recovery_s_;      // stall, by mode, guarded by mu_
  RecoveryReport last_recovery_;                       // guarded by mu_
  bool any_recovery_ = false;                          // guarded by mu_
  int64_t rebalances_ = 0;                             // guarded by mu_
  EngineGauges gauges_;                                // guarded by mu_
};

}  // namespace failsafe
