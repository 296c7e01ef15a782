// Runs a workload to completion on an engine and summarises it.
//
// Time: requests arrive on an emulated clock that advances by each step's
// emulated time (what the step would take with one core per device); when
// the engine is idle the clock jumps to the next arrival. Wall time is
// reported beside it. With OfflineRunOptions::wall_clock the clock is the
// wall clock instead (an idle engine waits for the next arrival).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/percentiles.h"
#include "engine/engine.h"
#include "engine/faults.h"
#include "engine/kv_backup.h"
#include "trace/workload.h"

namespace failsafe {

struct OfflineRunOptions {
  uint64_t seed = 0;  // prompt token ids, sampling seeds and fault timing jitter
  // Requests that sample (temperature, top-p, each with its own seed) rather
  // than decode greedily: every n-th request, 0 for none.
  int sample_every = 0;
  float temperature = 0.8f;
  float top_p = 0.95f;
  bool progress = false;  // a progress bar on stderr
  // The run's clock: false, emulated (each step the slowest device's compute,
  // as if every device had a processor of its own; recoveries charged their
  // detection and outage); true, the wall clock (devices that really run in
  // parallel, such as GPUs: what clients would see, host work included).
  bool wall_clock = false;
  std::vector<FaultEvent> faults;
  // Called after every step that ran (the scheduler's plan and its timing).
  std::function<void(const StepOutcome&)> on_step;
};

struct DeviceSummary {
  int device = -1;
  int64_t peak_kv_bytes = 0;
  int64_t kv_capacity_bytes = 0;
  double compute_s = 0;      // time outside collectives
  double compute_share = 0;  // of all devices' compute
  double attention_flops = 0;
  double ffn_flops = 0;
};

struct RunSummary {
  int requests_completed = 0;
  int requests_failed = 0;
  int64_t input_tokens = 0;
  int64_t output_tokens = 0;
  double wall_s = 0;
  double emulated_s = 0;  // on the run's clock (the wall's with wall_clock)
  int steps = 0;
  int preemptions = 0;
  int peak_concurrent_seqs = 0;
  int64_t peak_kv_tokens = 0;  // tokens held in KV by running sequences, at the peak
  std::vector<DeviceSummary> devices;
  Percentiles ttft_ms;     // emulated
  Percentiles max_tbt_ms;  // per request: its longest gap between tokens, emulated
  std::string output_digest;
  std::string config;  // what ran (policy, router, prefill, devices, workload)
  std::vector<RecoveryReport> recoveries;
  std::string failure;  // why requests failed, if they did
  bool prefix_cache = false;
  bool prefix_cache_host = false;  // with the host tier (the KV backup)
  PrefixCacheStats prefix;         // hits and savings when prefix_cache
  // The host KV backup (capacity 0: none).
  int64_t backup_capacity_blocks = 0;
  BackupStats backup;

  double tokens_per_s() const { return (input_tokens + output_tokens) / wall_s; }
  double emulated_tokens_per_s() const { return (input_tokens + output_tokens) / emulated_s; }
  std::string ToText() const;
  std::string ToJson() const;
};

Result<RunSummary> RunOffline(Engine& engine, const Workload& workload,
                              const OfflineRunOptions& options);

}  // namespace failsafe
