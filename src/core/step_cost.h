// An estimate of one step's time on every device, from the plan and the
// model's shapes. The adaptive prefill policy uses it to compare batches; the
// simulator builds its GPU cost model on the same counts.
//
// Work of one chunk of N tokens of a sequence with L tokens already in its KV,
// per layer, for each query head and each head group (KV head) the device
// computes:
//   attention pairs  N*L + N*(N+1)/2          (causal (query, key) pairs)
//   attention FLOPs  4*head_dim * pairs       per query head (scores and weighted values)
//   KV bytes read    8*head_dim*(L+N)         per head group (K and V of the context)
//   projections      4*N*hidden*head_dim FLOPs per query head (q, o) and per group (k, v)
// A device computes its TP heads for every chunk (a replicated head group:
// its K/V and its part of the query heads) and the DP head groups only for
// chunks of sequences whose DP rank it is. Per token it also computes its FFN
// shards, and every step reads all its weights once. Time is FLOPs / flop
// rate + bytes / bandwidth, summed per device; the step lasts as long as the
// slowest device.
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.h"
#include "placement/plan.h"

namespace failsafe {

struct DeviceSpeed {
  double flops_per_s = 100e9;  // sustained GEMM rate
  double bytes_per_s = 25e9;   // memory bandwidth
};

class StepCost {
 public:
  StepCost() = default;
  StepCost(const Plan& plan, const ModelConfig& config, const DeviceSpeed& speed);

  // Starts an empty step: only the fixed weight reads.
  void Reset();
  // Adds a chunk: its cost goes to every device's TP heads and to `dp_rank`'s
  // DP heads.
  void AddChunk(int num_tokens, int context_before, int dp_rank);
  // Extra time of growing a chunk from n to n + delta tokens (same L, rank).
  void GrowChunk(int n, int delta, int context_before, int dp_rank);
  double DeviceTime(int device) const { return time_[device]; }
  double StepTime() const;  // slowest device, seconds
  const std::vector<int>& devices() const { return devices_; }

  // (Query, key) pairs of one chunk, per query head and layer.
  static double AttentionPairs(int n, int context_before) {
    return static_cast<double>(n) * context_before + 0.5 * n * (n + 1.0);
  }

 private:
  std::vector<int> devices_;
  std::vector<double> tp_query_layers_;  // [device] -> sum over layers of TP query heads
  std::vector<double> tp_kv_layers_;     // [device] -> sum over layers of TP head groups (KV)
  double dp_head_layers_ = 0;
  std::vector<double> ffn_time_per_token_;  // [device]
  std::vector<double> fixed_;               // [device] weight reads per step
  std::vector<double> time_;                // [device] current step
  double pair_time_ = 0;  // seconds per (query, key) pair per query head and layer
  double kv_time_ = 0;    // seconds per context token read per head group and layer
  double proj_time_ = 0;  // seconds per token per query head (q, o) or head group (k, v)
  int group_size_ = 1;
};

// The time of one reference step on `plan`: `seqs` decodes at `context`
// tokens each, their DP ranks spread over the active devices in turn (as the
// load-aware router keeps them). Comparing two plans on it gives the share of
// throughput one keeps of the other's.
double ReferenceStepTime(const Plan& plan, const ModelConfig& config, const DeviceSpeed& speed,
                         int seqs, int context);

}  // namespace failsafe
