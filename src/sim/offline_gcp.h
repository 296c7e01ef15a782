// offline-gcp's parts shared by its two modes: the steady-state composition
// (sim/offline_gcp.cc) and the step-by-step run of the whole trace through
// the simulated engines (sim/offline_gcp_step.cc).
//
// The failure model, the same in both modes: the cluster is `nodes` nodes of
// `gpus_per_node` GPUs and starts whole. At each point of the availability
// trace GPUs are lost (or regained) one at a time until the cluster has the
// trace's count: each on a node drawn at random (seeded) among the nodes that
// have one to lose (a free slot), and on that node the device drawn at random
// among its alive (dead) devices.
//
// Each node runs one instance of each system on its alive devices:
//   - FailSafe on all of them, recovering in place (its own replanning);
//   - the baseline with standard TP on the lowest `tp` alive devices (its
//     group), `tp` the largest power of two <= the alive count that serves
//     the model; it restarts when its degree changes or a device of its
//     group is lost (a spare lost, or a device gained without a new degree,
//     changes nothing).
//
// Thread-safety: plain functions and values.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "sim/availability.h"
#include "sim/experiments.h"

namespace failsafe {

// [point][node] -> the node's alive devices after the trace's point (bit d:
// device d); gpus_per_node <= 64.
std::vector<std::vector<uint64_t>> NodeAliveMasks(const std::vector<AvailabilityPoint>& trace,
                                                  int nodes, int gpus_per_node, uint64_t seed);

// The baseline's TP degree on n GPUs: the largest power of two <= n that
// serves the model (tp_thr[tp] > 0), or 0.
int BaselineTp(int n, const std::map<int, double>& tp_thr);

// The baseline's group on one node.
struct BaselineGroup {
  uint64_t devices = 0;
  int tp = 0;
  // The node's devices are now `alive`, the baseline's degree `new_tp`:
  // true when the instance restarts, which then takes the lowest `new_tp`
  // alive devices.
  bool Update(uint64_t alive, int new_tp);
};

// What the steady-state composition measured, for the step-by-step run.
struct OfflineTables {
  ModelConfig model;
  HardwareProfile hw;
  std::vector<AvailabilityPoint> trace;      // in GPUs, times from 0
  std::vector<std::vector<uint64_t>> masks;  // NodeAliveMasks
  std::vector<SimRequest> requests;          // the offline workload, every arrival 0
  int nodes = 0, gpus_per_node = 0;
  std::map<int, double> tp_thr;                // baseline: TP degree -> output tokens/s
  std::vector<double> hybrid_thr, cyclic_thr;  // FailSafe: [alive GPUs] -> output tokens/s
};

struct OfflineStepOptions {
  double switch_delay_s = 0;  // every reconfiguration of every system stalls this long more
  bool skip = true;           // skip stretches once an instance's rate is measured
  // Skipped stretches are whole periods of this (virtual seconds).
  double period_s = 300;
  // Passes count from `settle_s` after the instance's last change (a batch
  // that starts at once runs faster, then slower, than the mix it settles
  // into). A pass is the span in which the instance serves as many output
  // tokens as the workload holds: its rate swings with the workload's order
  // (by a tenth, over tens of minutes) and the swing repeats every pass, so
  // a pass's mean rate is free of it. After each pass at most `skip_passes`
  // passes' length is skipped; every skipped stretch is credited with the
  // mean rate of every pass measured until the instance's next change.
  double settle_s = 600;
  double skip_passes = 4;
};

// Runs the whole trace through the simulated engines of every node, both
// systems; writes offline_gcp_step.csv (a row per 600 s) into `out_dir`.
Result<nlohmann::json> OfflineGcpStep(const OfflineTables& tables, const OfflineStepOptions& o,
                                      const std::string& out_dir);

}  // namespace failsafe
