#include "core/step_cost.h"

#include <algorithm>

namespace failsafe {

StepCost::StepCost(const Plan& plan, const ModelConfig& c, const DeviceSpeed& speed)
    : devices_(plan.active) {
  const double g = c.group_size(), hd = c.head_dim, h = c.hidden_size;
  group_size_ = c.group_size();
  pair_time_ = 4.0 * hd / speed.flops_per_s;
  kv_time_ = 8.0 * hd / speed.bytes_per_s;
  proj_time_ = 4.0 * h * hd / speed.flops_per_s;
  tp_query_layers_.assign(plan.num_devices, 0);
  tp_kv_layers_.assign(plan.num_devices, 0);
  ffn_time_per_token_.assign(plan.num_devices, 0);
  fixed_.assign(plan.num_devices, 0);
  time_.assign(plan.num_devices, 0);
  dp_head_layers_ = plan.num_dp_heads_total();
  for (int d : plan.active) {
    tp_query_layers_[d] = plan.num_tp_queries_total(d);
    tp_kv_layers_[d] = plan.num_tp_heads_total(d);
    // Shards held; of them, those every token takes (a dense FFN's, a
    // shared expert's) and those a routed expert's share of tokens takes.
    double shards = 0, every = 0;
    for (auto& l : plan.layers) {
      shards += l.ffn_shards[d].size();
      if (c.is_moe()) {
        for (int s : l.ffn_shards[d]) every += c.ExpertShare(plan.shape.ShardExpert(s)) == 1.0;
      }
    }
    const double moe_share =
        c.is_moe() ? static_cast<double>(c.experts_per_token) / c.num_experts : 1.0;
    const double flops_per_shard = 2.0 * 3 * plan.shape.shard_width * h;
    ffn_time_per_token_[d] = flops_per_shard * (shards - every) * moe_share / speed.flops_per_s +
                             flops_per_shard * every / speed.flops_per_s;
    // Weights read once per step: attention (q and o per query head, k and v
    // per head group; TP and DP) and FFN shards.
    const double head_bytes = 2.0 * hd * h * 4;
    const double queries = tp_query_layers_[d] + dp_head_layers_ * g;
    const double groups = tp_kv_layers_[d] + dp_head_layers_;
    const double shard_bytes = 3.0 * plan.shape.shard_width * h * 4;
    fixed_[d] = ((queries + groups) * head_bytes + shards * shard_bytes) / speed.bytes_per_s;
  }
  Reset();
}

void StepCost::Reset() {
  for (int d : devices_) time_[d] = fixed_[d];
}

void StepCost::AddChunk(int n, int l, int dp_rank) { GrowChunk(0, n, l, dp_rank); }

void StepCost::GrowChunk(int n, int delta, int l, int dp_rank) {
  if (delta <= 0) return;
  // Growing a chunk adds attention pairs and projections; the context is read
  // once per chunk, so a new chunk (n == 0) also pays its read.
  const double pairs = AttentionPairs(n + delta, l) - AttentionPairs(n, l);
  const double reads = (n == 0 ? l : 0) + delta;
  auto heads_time = [&](double queries, double groups) {
    return queries * (pairs * pair_time_ + delta * proj_time_) +
           groups * (delta * proj_time_ + reads * kv_time_);
  };
  for (int d : devices_) {
    double extra = heads_time(tp_query_layers_[d], tp_kv_layers_[d]);
    extra += delta * ffn_time_per_token_[d];
    if (d == dp_rank && dp_head_layers_ > 0)
      extra += heads_time(dp_head_layers_ * group_size_, dp_head_layers_);
    time_[d] += extra;
  }
}

double StepCost::StepTime() const {
  double t = 0;
  for (int d : devices_) t = std::max(t, time_[d]);
  return t;
}

double ReferenceStepTime(const Plan& plan, const ModelConfig& config, const DeviceSpeed& speed,
                         int seqs, int context) {
  if (plan.active.empty()) return 0;
  StepCost cost(plan, config, speed);
  for (int i = 0; i < seqs; ++i) {
    cost.AddChunk(1, context, plan.active[i % plan.active.size()]);
  }
  return cost.StepTime();
}

}  // namespace failsafe
