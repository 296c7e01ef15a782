// The paper's experiments on the simulator. Each writes CSV files (and PNG
// plots through gnuplot when it is installed) into `out_dir` and returns its
// headline figures as JSON.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "common/status.h"
#include "sim/instance.h"

namespace failsafe {

struct ExperimentOptions {
  std::string model = "llama-3.1-70b";
  std::string hardware = "h100-sxm-80gb";
  std::string out_dir = "sim-out";
  std::string data_dir;  // traces
  // A Mooncake-format JSONL request trace (ReadJsonlWorkload); empty: the
  // Mooncake conversation trace in data_dir. Offline experiments take its
  // lengths only.
  std::string requests_file;
  // offline-gcp: an availability trace (sim/availability.h); empty: the GCP
  // A100 trace in data_dir. Its counts are scaled to nodes x gpus_per_node.
  std::string availability_file;
  std::string availability_scale = "peak";
  int nodes = 8;
  int gpus_per_node = 8;
  // offline-gcp: "steady" (compose each node's steady throughput over the
  // trace) or "step" (also run the whole trace through the simulated
  // engines, sim/offline_gcp.h); both modes are reported by "step".
  std::string offline_mode = "steady";
  // offline-gcp: a fixed stall added to every reconfiguration of every
  // system (the paper's switching delay is 10 s).
  double switch_delay_s = 0;
  // online: the P90 targets. The decode target binds below the step time of
  // a saturated instance (about 30 ms for 70B and Mixtral on H100s, bounded
  // by streaming a device's memory); the paper's 40 ms is reported beside it.
  double ttft_slo_s = 10;
  double tbt_slo_s = 0.025;
  // offline-gcp step: skip time once an instance has measured a pass
  // through the workload; skipped stretches are whole periods of
  // step_period_s (virtual seconds).
  bool skip_steady = true;
  double step_period_s = 300;
  // offline-gcp and slow-device: the warm-up and the window of each steady
  // rate (virtual seconds; < 0: 900 and 600, or 120 and 60 when quick).
  double steady_warmup_s = -1, steady_window_s = -1;
  // slow-device: the slow device's speed relative to its peers, (0, 1].
  double slow_speed = 0.5;
  uint64_t seed = 1;
  bool quick = false;  // fewer requests / rates (tests)
};

Result<nlohmann::json> RunExperiment(const std::string& name, const ExperimentOptions& options);

// Building blocks, exposed for tests.
struct SystemSpec {
  std::string name;
  int devices;
  Policy policy;
  RouterPolicy router;
  PrefillPolicy prefill;
  int node_alive = 0;  // devices alive on its 8-device node; 0: `devices`
  bool prefix_cache = false;
  bool prefix_cache_host = false;       // with prefix_cache: the host KV backup as a second tier
  int64_t prefix_affinity_tokens = -1;  // -1: SchedulerConfig's default
  int64_t backup_bytes = 0;             // host memory for the KV backup; 0: room for all the KV
  // FailSafe's choice of placement for the phase it serves: hybrid attention,
  // or cyclic placement alone where the cost model says replicating the DP
  // head groups' weights costs more than their balance gains (`policy` is
  // then only the default; ChoosePlacement decides).
  bool choose_placement = false;
};
// Which work a saturated instance does.
enum class Phase {
  kPrefill,  // prompts only: input tokens/s
  kDecode,   // prompts' KV arrives computed: output tokens/s
  kMixed,    // whole requests: output tokens/s
};
// Steady-state throughput (tokens/s) of an instance given every request at
// once: measured over `window_s` after a warm-up of a quarter of it. With
// `inflight_tokens`, also the KV tokens held by running sequences at the end.
Result<double> SaturatedThroughput(const ModelConfig& model, const HardwareProfile& hw,
                                   const SystemSpec& system, Phase phase,
                                   const std::vector<SimRequest>& requests, double window_s,
                                   int64_t* inflight_tokens = nullptr);

// The placement a `choose_placement` system serves `phase` with: hybrid
// attention or cyclic placement alone, whichever has the higher saturated
// throughput on `requests` (SaturatedThroughput over `window_s`), ties to
// hybrid. The system returned has its policy fixed; with `hybrid` and
// `cyclic`, both throughputs (0 where one cannot serve).
Result<SystemSpec> ChoosePlacement(const ModelConfig& model, const HardwareProfile& hw,
                                   const SystemSpec& system, Phase phase,
                                   const std::vector<SimRequest>& requests, double window_s,
                                   double* hybrid = nullptr, double* cyclic = nullptr);

}  // namespace failsafe
