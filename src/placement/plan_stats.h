// Per-device costs of a plan: weight bytes, KV bytes per token and attention
// FLOPs per token, split into the TP part (every token) and the DP part (only
// tokens of requests whose DP rank the device is). A replicated head group
// costs each of its devices the K/V projection and the KV cache, and the
// query heads it computes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"
#include "placement/plan.h"

namespace failsafe {

struct DeviceCost {
  int device = -1;
  int64_t weight_bytes = 0;                      // fp32
  int64_t tp_kv_bytes_per_token = 0;             // K and V of its TP heads, all layers
  int64_t dp_kv_bytes_per_token = 0;             // K and V of the DP heads, per token it owns
  double tp_attn_flops_per_token = 0;            // q/k/v/o projections of its TP heads
  double dp_attn_flops_per_token = 0;            // same for the DP heads, per owned token
  double attn_core_flops_per_context_token = 0;  // scores + values, TP heads, per (query, key) pair
  double ffn_flops_per_token =
      0;                   // dense: its shards; MoE: its shards x experts per token / experts
  int tp_heads = 0;        // head groups whose KV it caches (TP), over all layers
  int tp_query_heads = 0;  // query heads it computes (TP), over all layers
  int ffn_shards = 0;      // over all layers and experts
};

std::vector<DeviceCost> PlanCosts(const Plan& plan, const ModelConfig& config);

// How evenly a plan spreads the work that every token costs (its TP part),
// and what replicated head groups cost in KV.
struct PlanBalance {
  int max_replicas = 1;           // most devices holding one TP head group
  double compute_over_mean = 1;   // busiest device's TP attention + FFN FLOPs / the mean
  double kv_over_mean = 1;        // largest TP KV bytes per token / the mean
  double kv_held_over_model = 1;  // KV every device caches per token / the model's own
};
PlanBalance BalanceOf(const Plan& plan, const ModelConfig& config);

// KV pages each active device can hold within `device_memory_bytes`, after its
// weights and `reserve_bytes` of activations: [device id] -> pages (0 for
// inactive devices). Fails, naming the device, if the weights do not fit.
Result<std::vector<int64_t>> KvPagesWithinBudget(const Plan& plan, const ModelConfig& config,
                                                 int64_t device_memory_bytes, int64_t reserve_bytes,
                                                 int64_t page_bytes);

// The plan as text: a per-layer table and the per-device costs.
std::string PlanReport(const Plan& plan, const ModelConfig& config);
// The same as a JSON object.
std::string PlanReportJson(const Plan& plan, const ModelConfig& config);

}  // namespace failsafe
