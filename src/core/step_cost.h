// An estimate of one step's time on every device, from the plan and the
// model's shapes. The adaptive prefill policy uses it to compare batches; the
// simulator builds its GPU cost model on the same counts.
//
// Work of one chunk of N tokens of a sequence with L tokens already in its KV,
// per (layer, head group) the device computes:
//   attention pairs  N*L + N*(N+1)/2          (causal (query, key) pairs)
//   attention FLOPs  4*G*head_dim * pairs     (scores and weighted values)
//   KV bytes read    8*head_dim*(L+N)          (K and V of the context, once per chunk)
//   projections      2*N*hidden*(2G+2)*head_dim FLOPs (q, k, v, o)
// A device computes its TP head groups for every chunk and the DP head groups
// only for chunks of sequences whose DP rank it is. Per token it also
// computes its FFN shards, and every step reads all its weights once. Time is
// FLOPs / flop rate + bytes / bandwidth, summed per device; the step lasts as
// long as the slowest device.
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

  // Work of one (layer, head group) for a chunk, for reports and tests.
  static double AttentionPairs(int n, int context_before) {
    return static_cast<double>(n) * context_before + 0.5 * n * (n + 1.0);
  }

 private:
  std::vector<int> devices_;
  std::vector<double> tp_head_layers_;  // [device] -> sum over layers of TP head groups
  double dp_head_layers_ = 0;
  std::vector<double> ffn_time_per_token_;  // [device]
  std::vector<double> fixed_;               // [device] weight reads per step
  std::vector<double> time_;                // [device] current step
  double pair_time_ = 0;                    // seconds per (query, key) pair per head-layer
  double kv_time_ = 0;                      // seconds per context token read per head-layer
  double proj_time_ = 0;                    // seconds per token per head-layer
};

}  // namespace failsafe
