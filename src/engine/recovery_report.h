// What one recovery (or rejoin) cost, as a client sees it: wall-clock instants
// from the failure to the first step after the recovery, and the phases in
// between, all in wall time.
//
//   failed ── detect ──▶ detected ── abort ──▶ (survivors out of the step)
//     ── replan ── group ── weights ── KV ──▶ recovered ── first step ──▶ resumed
//
// `failed_ns` is the kill for injected failures, the last sign of progress of
// a hung device, and the detection itself otherwise. A failure during the
// recovery (a cascade) extends the same report: its devices join
// `failed_devices` and the phases add up until a step finally runs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "placement/replan.h"

namespace failsafe {

struct RecoveryReport {
  RecoveryMode mode = RecoveryMode::kFull;
  std::vector<int> failed_devices;  // every device lost, in the order found
  std::vector<int> joined_devices;
  std::vector<std::string> causes;  // per failed device: why it was declared dead
  // A plan change for slow devices (no device lost): `causes` says which and
  // how slow, `shares` the weights the plan was made with ([device]).
  bool rebalance = false;
  std::vector<double> shares;
  int attempts = 0;  // > 1: devices failed (or a plan change failed) meanwhile

  // Wall-clock instants (MonotonicNanos); 0: not (yet) known.
  int64_t failed_ns = 0;     // the earliest failure (or the rejoin request)
  int64_t detected_ns = 0;   // the engine knew
  int64_t recovered_ns = 0;  // the new plan was in place on every device
  int64_t resumed_ns = 0;    // the first step after the recovery finished

  // Phases, wall milliseconds.
  double detect_ms = 0;      // failed -> detected
  double abort_ms = 0;       // detected -> every survivor out of the failed step
  double replan_ms = 0;      // new plan, scheduler reconfigured, backup drained
  double group_ms = 0;       // new collective group
  double weights_ms = 0;     // weights moved (the slowest device)
  double kv_ms = 0;          // KV restored from the backup (the slowest device)
  double apply_ms = 0;       // the whole plan change on the devices (group, weights, KV)
  double first_step_ms = 0;  // the first step after the recovery
  double recompute_ms = 0;   // share of the steps after it spent recomputing lost KV

  int64_t weight_host_bytes = 0;  // host -> devices
  int64_t weight_peer_bytes = 0;  // device -> device
  int64_t kv_restored_bytes = 0;
  int64_t tokens_recomputed = 0;
  bool finished = false;  // every lost token recomputed

  bool resumed() const { return resumed_ns > 0; }
  // Detection to the first step after the recovery (0 until it ran).
  double total_ms() const;
  // The failure itself to the first step after the recovery: the longest a
  // request waited for its next token because of it (0 until it ran).
  double stall_ms() const;
  // Detection to the new plan being in place: no step could run meanwhile.
  double outage_ms() const;

  // One line per report, and a JSON object with every field.
  std::string ToText() const;
  std::string ToJson() const;
};

}  // namespace failsafe
