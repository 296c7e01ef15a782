// Replanning after devices fail or rejoin, moving as little as possible.
//
// Survivors keep every head group, FFN shard and vocabulary chunk they hold,
// up to the new plan's per-device counts; only the items of departed devices
// (and the excess of devices above their new count) move, each to a device
// below its count. With the hybrid policy, head groups that must become DP
// heads are chosen among those already DP, then those orphaned by a failure;
// DP heads that must become TP heads go to devices that need heads. With more
// devices than head groups (replicas), survivors stay with the group they
// compute part of; a device changes group only when a group is left without
// any device, and then only one that its own group can spare.
#pragma once

#include <optional>
#include <vector>

#include "common/status.h"
#include "model/config.h"
#include "placement/plan.h"

namespace failsafe {

// `weights` (optional, [device]): the share of work each alive device should
// get, relative to the others (1: an ordinary device; 0.5: half as much, for
// one that runs at half speed). Counts of head groups, FFN shards and
// vocabulary chunks are apportioned in proportion (largest remainder), and
// still with minimal movement. With replicated head groups (more devices
// than groups) the query heads of a group are split among its holders by
// weight; which devices hold which group does not change for weights. Without
// weights every device gets an equal share (up to one item).
//
// `policy` (optional): the new plan's policy where it differs from the
// previous plan's (an engine choosing hybrid attention or cyclic placement by
// device count). Leaving hybrid, the DP head groups become TP heads of the
// devices short of heads; entering it, the heads that must become DP heads
// are orphans first, then devices' excess heads.
Result<Plan> Replan(const Plan& previous, const ModelConfig& config, const std::vector<int>& alive,
                    const std::vector<double>* weights = nullptr,
                    std::optional<Policy> policy = std::nullopt);

// How the engine recovers from a failure (or takes a device back):
//   recompute: fresh contiguous plan; every device reloads all its weights;
//              all in-flight KV is recomputed.
//   host:      fresh plan; weights reloaded; KV restored from the host backup.
//   full:      minimal-movement replan; only missing weights are loaded (each
//              new DP head in distinct pieces, exchanged device to device);
//              only the lost KV is restored from the backup.
//   oracle:    (simulator only) metadata changes, no data moves.
enum class RecoveryMode { kRecompute, kHost, kFull, kOracle };
const char* RecoveryModeName(RecoveryMode m);
Result<RecoveryMode> ParseRecoveryMode(const std::string& name);

// What changes between two plans, per device.
struct PlanDiff {
  struct Item {
    int layer;  // -1 for vocabulary chunks
    int index;  // head group, FFN shard or vocabulary chunk
  };
  // Per device id: items it must gain. tp_heads are the head groups whose K/V
  // it computes (whole or replicated), tp_queries the query heads of them.
  std::vector<std::vector<Item>> gained_tp_heads, gained_tp_queries, gained_dp_heads, gained_shards,
      gained_chunks;
  // Per device id: items it drops.
  std::vector<std::vector<Item>> dropped_tp_heads, dropped_tp_queries, dropped_dp_heads,
      dropped_shards, dropped_chunks;
  // Items (TP query heads, FFN shards, vocabulary chunks) that moved from one
  // surviving device to another.
  int moved_between_survivors = 0;
};

PlanDiff DiffPlans(const Plan& from, const Plan& to);

}  // namespace failsafe
