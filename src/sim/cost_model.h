// The simulator's cost model: how long one step takes on a group of devices.
//
// Per layer and device, the attention segment (q/k/v/o GEMMs for the device's
// TP heads over every token (of a replicated head group: its k/v and its part
// of the query heads), for its DP head groups over the tokens of the
// sequences it owns, and attention over their context) and the FFN
// segment (its shards; MoE: of each expert, on that expert's expected
// tokens) each take a roofline time: max(FLOPs / (peak x efficiency), bytes /
// (bandwidth x efficiency)). Every segment ends in an all-reduce of the
// layer's activations (ring over NVLink, plus a latency), so each segment
// lasts as long as its slowest device. A step is the sum over segments, plus
// the LM head and a per-step overhead. A device may run slower than the
// profile (a throttled accelerator): its segments take 1/speed as long, and
// the step waits for it at every all-reduce.
#pragma once

#include <cstdint>
#include <vector>

#include "core/scheduler.h"
#include "placement/plan.h"
#include "sim/profiles.h"

namespace failsafe {

// The coordinator's time to compute a plan change to a plan of `shape` with
// `sequences` running (HardwareProfile::replan_per_item_s and
// replan_per_seq_slot_s).
double ReplanSeconds(const HardwareProfile& hw, const PlanShape& shape, int64_t sequences);

// One step, per device (what a device measures of its own work).
struct ClusterStepCost {
  double seconds = 0;  // the step: every segment as long as its slowest device
  // [device] (ids of the plan; inactive ones 0): compute time (the sum of its
  // segments, at its speed), its longest segment (the longest it goes
  // without reaching a collective), and its work (FLOPs: projections and
  // attention core; FFN shards).
  std::vector<double> compute_s, longest_segment_s, attention_flops, ffn_flops;
};

class ClusterCostModel {
 public:
  ClusterCostModel(const Plan& plan, const ModelConfig& model, const HardwareProfile& hw);

  double StepSeconds(const StepPlan& step) const;
  // The step with each device's speed (`speed`: [device], relative to the
  // profile, in (0, 1]; empty: all 1) and what each device did.
  void Cost(const StepPlan& step, const std::vector<double>& speed, ClusterStepCost* out) const;
  // Replaces the hardware constants (profile fitting); the plan stays.
  void SetHardware(const HardwareProfile& hw) { hw_ = hw; }
  // Per-device time of one step, for balance reports (sum over segments).
  std::vector<double> DeviceSeconds(const StepPlan& step) const;

  int64_t WeightBytes(int device) const { return weight_bytes_[device]; }
  int64_t PageBytes(int block_size) const;
  // KV pages each device holds after weights and an activation reserve.
  std::vector<int64_t> KvCapacityPages(int block_size, int max_batch_tokens) const;
  // Bytes of one head group's weights (q, k, v rows and o columns), of one
  // query head's (q rows, o columns), of one group's k and v rows, of one
  // FFN shard, and of one vocabulary chunk (embedding and LM head).
  int64_t HeadBytes() const;
  int64_t QueryBytes() const;
  int64_t KvHeadBytes() const;
  int64_t ShardBytes() const;
  int64_t ChunkBytes() const;
  // K and V of one token of one (layer, head group).
  int64_t KvBytesPerTokenSlot() const;

 private:
  struct Chunks;
  // The step's duration; with `out`, per device too (`speed` may be empty).
  double Segments(const StepPlan& step, const std::vector<double>& speed,
                  ClusterStepCost* out) const;

  Plan plan_;
  ModelConfig m_;
  HardwareProfile hw_;
  std::vector<int64_t> weight_bytes_;                  // [device]
  std::vector<std::vector<int>> tp_queries_;           // [layer][device] TP query heads
  std::vector<std::vector<int>> tp_groups_;            // [layer][device] TP head groups (KV)
  std::vector<int> dp_heads_;                          // [layer]
  std::vector<std::vector<std::vector<int>>> shards_;  // [layer][device][expert]
  std::vector<int64_t> vocab_rows_;                    // [device]
};

}  // namespace failsafe
