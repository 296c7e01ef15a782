#include "sim/cost_model.h"

#include <algorithm>
#include <cmath>

#include "common/check.h"
#include "placement/plan_stats.h"

namespace failsafe {

double ReplanSeconds(const HardwareProfile& hw, const PlanShape& shape, int64_t sequences) {
  const double items =
      static_cast<double>(shape.num_layers) * (shape.num_query_heads() + shape.num_shards()) +
      shape.vocab_chunks;
  const double slots = static_cast<double>(shape.num_layers) * shape.num_kv_heads;
  return hw.replan_per_item_s * items +
         hw.replan_per_seq_slot_s * slots * static_cast<double>(sequences);
}

ClusterCostModel::ClusterCostModel(const Plan& plan, const ModelConfig& m,
                                   const HardwareProfile& hw)
    : plan_(plan), m_(m), hw_(hw) {
  const int nd = plan.num_devices;
  weight_bytes_.assign(nd, 0);
  vocab_rows_.assign(nd, 0);
  for (const DeviceCost& dc : PlanCosts(plan, m)) {
    weight_bytes_[dc.device] = dc.weight_bytes / 4 * hw.bytes_per_element;  // PlanCosts counts fp32
  }
  tp_queries_.assign(m.num_layers, std::vector<int>(nd, 0));
  tp_groups_.assign(m.num_layers, std::vector<int>(nd, 0));
  dp_heads_.assign(m.num_layers, 0);
  shards_.assign(m.num_layers,
                 std::vector<std::vector<int>>(nd, std::vector<int>(plan.shape.expert_slots, 0)));
  for (int l = 0; l < m.num_layers; ++l) {
    dp_heads_[l] = static_cast<int>(plan.layers[l].dp_heads.size());
    for (int d : plan.active) {
      tp_queries_[l][d] = static_cast<int>(plan.layers[l].tp_queries[d].size());
      tp_groups_[l][d] = static_cast<int>(plan.layers[l].tp_heads[d].size());
      for (int s : plan.layers[l].ffn_shards[d]) shards_[l][d][plan.shape.ShardExpert(s)]++;
    }
  }
  for (int d : plan.active) {
    for (int ch : plan.vocab_chunks[d])
      vocab_rows_[d] += plan.shape.ChunkEnd(ch) - plan.shape.ChunkBegin(ch);
  }
}

int64_t ClusterCostModel::HeadBytes() const {
  const int64_t g = m_.group_size(), hd = m_.head_dim, h = m_.hidden_size;
  return ((2 * g + 2) * hd * h) * hw_.bytes_per_element;
}
int64_t ClusterCostModel::QueryBytes() const {
  return 2LL * m_.head_dim * m_.hidden_size * hw_.bytes_per_element;
}
int64_t ClusterCostModel::KvHeadBytes() const {
  return 2LL * m_.head_dim * m_.hidden_size * hw_.bytes_per_element;
}
int64_t ClusterCostModel::ShardBytes() const {
  return 3LL * plan_.shape.shard_width * m_.hidden_size * hw_.bytes_per_element;
}
int64_t ClusterCostModel::ChunkBytes() const {
  return static_cast<int64_t>(plan_.shape.vocab_chunk_size) * m_.hidden_size *
         hw_.bytes_per_element * (m_.tie_word_embeddings ? 1 : 2);
}
int64_t ClusterCostModel::KvBytesPerTokenSlot() const {
  return 2LL * m_.head_dim * hw_.bytes_per_element;
}
int64_t ClusterCostModel::PageBytes(int block_size) const {
  return block_size * KvBytesPerTokenSlot();
}

std::vector<int64_t> ClusterCostModel::KvCapacityPages(int block_size, int max_batch_tokens) const {
  std::vector<int64_t> out(plan_.num_devices, 0);
  const double reserve = static_cast<double>(max_batch_tokens) *
                         (8.0 * m_.hidden_size + 3.0 * m_.intermediate_size) *
                         hw_.bytes_per_element;
  for (int d : plan_.active) {
    const double room = hw_.hbm_bytes * hw_.memory_utilization - weight_bytes_[d] - reserve;
    out[d] = room > 0 ? static_cast<int64_t>(room / PageBytes(block_size)) : 0;
  }
  return out;
}

// Sums over the step's chunks, for all tokens and per owning device.
struct ClusterCostModel::Chunks {
  double tokens = 0, pairs = 0, context = 0;               // all chunks
  std::vector<double> own_tokens, own_pairs, own_context;  // [device]: chunks of sequences it owns
  int samples = 0;
};

double ClusterCostModel::Segments(const StepPlan& step, const std::vector<double>& speed,
                                  ClusterStepCost* out) const {
  const int nd = plan_.num_devices;
  if (out) {
    for (auto* v :
         {&out->compute_s, &out->longest_segment_s, &out->attention_flops, &out->ffn_flops})
      v->assign(nd, 0.0);
    out->seconds = 0;
  }
  FS_CHECK(speed.empty() || static_cast<int>(speed.size()) >= nd);
  // Seconds of work at the profile's speed -> at the device's.
  auto slowed = [&](int d, double s) { return speed.empty() ? s : s / speed[d]; };
  Chunks c;
  c.own_tokens.assign(nd, 0);
  c.own_pairs.assign(nd, 0);
  c.own_context.assign(nd, 0);
  const int window = m_.sliding_window;
  for (const ScheduledSeq& s : step.seqs) {
    double ctx = s.start + s.num_tokens;
    double pairs =
        static_cast<double>(s.num_tokens) * s.start + 0.5 * s.num_tokens * (s.num_tokens + 1.0);
    if (window > 0) {
      pairs = std::min(pairs, static_cast<double>(s.num_tokens) * window);
      ctx = std::min(ctx, static_cast<double>(window + s.num_tokens));
    }
    c.tokens += s.num_tokens;
    c.pairs += pairs;
    c.context += ctx;
    if (s.dp_rank >= 0 && s.dp_rank < nd) {
      c.own_tokens[s.dp_rank] += s.num_tokens;
      c.own_pairs[s.dp_rank] += pairs;
      c.own_context[s.dp_rank] += ctx;
    }
    c.samples += s.sample;
  }
  if (c.tokens == 0) return 0;
  const double g = m_.group_size(), hd = m_.head_dim, h = m_.hidden_size,
               bpe = hw_.bytes_per_element;
  const double gemm_rate = hw_.peak_flops * hw_.gemm_efficiency;
  const double attn_rate = hw_.peak_flops * hw_.attention_efficiency;
  const double bw = hw_.hbm_bytes_per_s * hw_.bandwidth_efficiency;
  const double unit_weight_bytes = 2 * hd * h * bpe;  // one query head (q, o) or group (k, v)
  const double unit_proj_flops = 4.0 * hd * h;        // per token, the same units
  const double pair_flops = 4.0 * hd;                 // per (query, key) pair and query head
  const double kv_token_bytes = 2.0 * hd * bpe;       // per context token read
  const int n = static_cast<int>(plan_.active.size());
  const double ar_bytes = c.tokens * h * bpe;
  const double all_reduce =
      n > 1 ? 2.0 * (n - 1) / n * ar_bytes / hw_.nvlink_bytes_per_s + hw_.collective_latency_s
            : 0.0;
  // MoE: tokens per expert and the chance an expert is used at all (routed
  // experts; a shared expert takes every token).
  const int experts = plan_.shape.expert_slots;
  const double shard_flops_per_token = 2.0 * 3 * plan_.shape.shard_width * h;
  const double shard_bytes = 3.0 * plan_.shape.shard_width * h * bpe;

  // A GEMM of m rows: streamed weights when m is small, else a GEMM
  // library's efficiency curve; never faster than reading its weights.
  auto gemm_s = [&](double flops, double bytes, double m) {
    if (flops <= 0) return 0.0;
    if (m <= hw_.gemv_max_rows) {
      const double stream = hw_.peak_flops * hw_.gemv_efficiency;
      return std::max(stream > 0 ? flops / stream : 0.0, bytes / bw);
    }
    double rate = gemm_rate;
    if (hw_.gemm_half_rows > 0) rate *= m / (m + hw_.gemm_half_rows);
    return std::max(flops / rate, bytes / bw);
  };
  const double seg = hw_.segment_overhead_s;
  double total = hw_.step_overhead_s + all_reduce + seg;  // embedding all-reduce
  for (int l = 0; l < m_.num_layers; ++l) {
    double attn_max = 0, ffn_max = 0;
    for (int d : plan_.active) {
      const double tpq = tp_queries_[l][d], tpk = tp_groups_[l][d], dp = dp_heads_[l];
      const double core_flops = pair_flops * (tpq * c.pairs + dp * g * c.own_pairs[d]);
      const double core_bytes = kv_token_bytes * (tpk * c.context + dp * c.own_context[d]);
      const double tp_units = tpq + tpk, dp_units = dp * (g + 1);
      const double proj_flops = unit_proj_flops * tp_units * c.tokens,
                   own_proj_flops = unit_proj_flops * dp_units * c.own_tokens[d];
      const double attn = slowed(
          d, gemm_s(proj_flops, unit_weight_bytes * tp_units, c.tokens) +
                 gemm_s(own_proj_flops, c.own_tokens[d] > 0 ? unit_weight_bytes * dp_units : 0.0,
                        c.own_tokens[d]) +
                 std::max(core_flops / attn_rate, core_bytes / bw));
      double ffn = 0, ffn_flops = 0;
      for (int e = 0; e < experts; ++e) {
        const double sh = shards_[l][d][e];
        if (sh == 0) continue;
        const double share = m_.ExpertShare(e), tokens_per_expert = c.tokens * share;
        const double p_used = share < 1 ? 1.0 - std::pow(1.0 - share, c.tokens) : 1.0;
        ffn_flops += sh * shard_flops_per_token * tokens_per_expert;
        ffn += gemm_s(sh * shard_flops_per_token * tokens_per_expert, sh * shard_bytes * p_used,
                      tokens_per_expert);
      }
      ffn = slowed(d, ffn);
      if (out) {
        out->compute_s[d] += attn + ffn;
        out->longest_segment_s[d] = std::max({out->longest_segment_s[d], attn, ffn});
        out->attention_flops[d] += proj_flops + own_proj_flops + core_flops;
        out->ffn_flops[d] += ffn_flops;
      }
      attn_max = std::max(attn_max, attn);
      ffn_max = std::max(ffn_max, ffn);
    }
    total += attn_max + all_reduce + ffn_max + all_reduce + 2 * seg;
  }
  // LM head on the sampled rows.
  double head_max = 0;
  for (int d : plan_.active) {
    const double t = slowed(
        d, gemm_s(2.0 * c.samples * h * vocab_rows_[d], vocab_rows_[d] * h * bpe, c.samples));
    head_max = std::max(head_max, t);
    if (out) {
      out->compute_s[d] += t;
      out->longest_segment_s[d] = std::max(out->longest_segment_s[d], t);
    }
  }
  if (out) out->seconds = total + head_max;
  return total + head_max;
}

double ClusterCostModel::StepSeconds(const StepPlan& step) const {
  return Segments(step, {}, nullptr);
}

void ClusterCostModel::Cost(const StepPlan& step, const std::vector<double>& speed,
                            ClusterStepCost* out) const {
  Segments(step, speed, out);
}

std::vector<double> ClusterCostModel::DeviceSeconds(const StepPlan& step) const {
  ClusterStepCost c;
  Segments(step, {}, &c);
  return c.compute_s;
}

}  // namespace failsafe
