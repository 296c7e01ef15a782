#include "placement/plan_stats.h"

#include <fmt/format.h>

#include <algorithm>

#include <nlohmann/json.hpp>

#include "placement/plan_json.h"

namespace failsafe {

std::vector<DeviceCost> PlanCosts(const Plan& p, const ModelConfig& c) {
  const int64_t h = c.hidden_size, hd = c.head_dim, g = c.group_size();
  const int64_t query_weights = 2 * hd * h * 4;  // q rows and o columns of one query head
  const int64_t kv_weights = 2 * hd * h * 4;     // k and v rows of one head group
  const double query_flops = 2.0 * 2 * hd * h, kv_flops = 2.0 * 2 * hd * h;  // per token
  const int64_t shard_weights = 3LL * p.shape.shard_width * h * 4;
  const double shard_flops = 2.0 * 3 * p.shape.shard_width * h;
  const int64_t kv_per_head = 2 * hd * 4;
  std::vector<DeviceCost> out;
  for (int d : p.active) {
    DeviceCost dc;
    dc.device = d;
    dc.weight_bytes = 2LL * c.num_layers * h * 4 + h * 4;  // norms
    for (int l = 0; l < c.num_layers; ++l) {
      const LayerPlan& lp = p.layers[l];
      const int tp = static_cast<int>(lp.tp_heads[d].size());
      const int tpq = static_cast<int>(lp.tp_queries[d].size());
      const int dp = static_cast<int>(lp.dp_heads.size());
      dc.tp_heads += tp;
      dc.tp_query_heads += tpq;
      dc.weight_bytes +=
          tpq * query_weights + tp * kv_weights + dp * (g * query_weights + kv_weights);
      dc.tp_kv_bytes_per_token += tp * kv_per_head;
      dc.dp_kv_bytes_per_token += dp * kv_per_head;
      dc.tp_attn_flops_per_token += tpq * query_flops + tp * kv_flops;
      dc.dp_attn_flops_per_token += dp * (g * query_flops + kv_flops);
      dc.attn_core_flops_per_context_token += tpq * 4.0 * hd;
      const int shards = static_cast<int>(lp.ffn_shards[d].size());
      dc.ffn_shards += shards;
      dc.weight_bytes += shards * shard_weights;
      if (c.is_moe()) {
        // The router and the shared expert's gate.
        dc.weight_bytes += static_cast<int64_t>(c.num_experts + (c.shared_expert_size > 0)) * h * 4;
      }
      // Routed experts' shards compute for k / experts of the tokens.
      int shared = 0;
      for (int s : lp.ffn_shards[d]) shared += c.ExpertShare(p.shape.ShardExpert(s)) == 1.0;
      if (c.is_moe()) {
        dc.ffn_flops_per_token +=
            (shards - shared) * shard_flops * c.experts_per_token / c.num_experts +
            shared * shard_flops;
      } else {
        dc.ffn_flops_per_token += shards * shard_flops;
      }
    }
    int64_t vocab_rows = 0;
    for (int ch : p.vocab_chunks[d]) vocab_rows += p.shape.ChunkEnd(ch) - p.shape.ChunkBegin(ch);
    dc.weight_bytes += vocab_rows * h * 4 * (c.tie_word_embeddings ? 1 : 2);
    out.push_back(dc);
  }
  return out;
}

Result<std::vector<int64_t>> KvPagesWithinBudget(const Plan& p, const ModelConfig& c,
                                                 int64_t budget, int64_t reserve,
                                                 int64_t page_bytes) {
  std::vector<int64_t> pages(p.num_devices, 0);
  for (const DeviceCost& dc : PlanCosts(p, c)) {
    const int64_t left = budget - dc.weight_bytes - reserve;
    if (left < page_bytes * c.num_layers) {
      return ResourceExhausted(
          "device {} needs {:.1f} MiB for its weights and {:.1f} MiB for activations under policy "
          "'{}', which "
          "leaves no room for KV in a device memory of {:.1f} MiB",
          dc.device, dc.weight_bytes / 1048576.0, reserve / 1048576.0, PolicyName(p.policy),
          budget / 1048576.0);
    }
    pages[dc.device] = left / page_bytes;
  }
  return pages;
}

namespace {

// A device's TP head groups in one layer: "3" for a whole group, "3(q6-7)"
// for the query heads it computes of a replicated one.
std::string HeadsCell(const LayerPlan& lp, int d, int group) {
  std::string out;
  for (int h : lp.tp_heads[d]) {
    std::vector<int> qs;
    for (int q : lp.tp_queries[d]) {
      if (q / group == h) qs.push_back(q);
    }
    out += (out.empty() ? "" : ",") + std::to_string(h);
    if (static_cast<int>(qs.size()) == group) continue;
    const bool run = qs.back() - qs.front() + 1 == static_cast<int>(qs.size());
    if (qs.size() == 1) {
      out += fmt::format("(q{})", qs[0]);
    } else if (run) {
      out += fmt::format("(q{}-{})", qs.front(), qs.back());
    } else {
      std::string list;
      for (int q : qs) list += (list.empty() ? "" : ",") + std::to_string(q);
      out += "(q" + list + ")";
    }
  }
  return out.empty() ? std::string("-") : out;
}

std::string List(const std::vector<int>& v) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? "," : "") + std::to_string(v[i]);
  return out.empty() ? std::string("-") : out;
}

}  // namespace

PlanBalance BalanceOf(const Plan& p, const ModelConfig& c) {
  const std::vector<DeviceCost> costs = PlanCosts(p, c);
  double kv_max = 0, kv_sum = 0, work_max = 0, work_sum = 0;
  for (auto& dc : costs) {
    const double work = dc.tp_attn_flops_per_token + dc.ffn_flops_per_token;
    kv_max = std::max(kv_max, static_cast<double>(dc.tp_kv_bytes_per_token));
    kv_sum += dc.tp_kv_bytes_per_token;
    work_max = std::max(work_max, work);
    work_sum += work;
  }
  const double n = static_cast<double>(costs.size());
  PlanBalance b;
  b.max_replicas = std::max(1, p.max_replicas());
  b.compute_over_mean = work_sum > 0 ? work_max / (work_sum / n) : 1.0;
  b.kv_over_mean = kv_sum > 0 ? kv_max / (kv_sum / n) : 1.0;
  // A DP head's KV lives on one device per token.
  b.kv_held_over_model =
      (kv_sum + costs.front().dp_kv_bytes_per_token) / static_cast<double>(c.KvBytesPerToken());
  return b;
}

std::string PlanReport(const Plan& p, const ModelConfig& c) {
  std::string s = fmt::format("policy {}, {} devices alive of {}, active: {}\n",
                              PolicyName(p.policy), p.alive.size(), p.num_devices, List(p.active));
  const int group = p.shape.group_size;
  s += fmt::format("attention: {} head group{} of {} query head{}", p.shape.num_kv_heads,
                   p.shape.num_kv_heads == 1 ? "" : "s", group, group == 1 ? "" : "s");
  const int replicas = p.max_replicas();
  if (p.num_dp_heads_total() == p.shape.num_layers * p.shape.num_kv_heads) {
    s += "; all DP heads (pure DP attention: every device holds every head group)";
  } else if (replicas > 1) {
    s += fmt::format(
        "; more devices than head groups: each head group is replicated on up to {} devices, "
        "each caching its KV and computing part of its query heads",
        replicas);
  }
  s += fmt::format("\nFFN: {} shards of width {} per {}; vocabulary: {} chunks of {} rows\n\n",
                   p.shape.shards_per_expert, p.shape.shard_width, c.is_moe() ? "expert" : "layer",
                   p.shape.vocab_chunks, p.shape.vocab_chunk_size);
  s += "layer";
  for (int d : p.active) s += fmt::format(" | dev{} heads (shards)", d);
  s += " | DP heads\n";
  for (int l = 0; l < c.num_layers; ++l) {
    s += fmt::format("{:5}", l);
    for (int d : p.active) {
      s += fmt::format(" | {:>11} ({:3})", HeadsCell(p.layers[l], d, group),
                       p.layers[l].ffn_shards[d].size());
    }
    s += fmt::format(" | {}\n", List(p.layers[l].dp_heads));
  }
  s += fmt::format("\n{:>6} {:>12} {:>9} {:>9} {:>12} {:>14} {:>14} {:>14}\n", "device", "weights",
                   "TP heads", "Q heads", "KV B/token", "DP KV B/own", "attn MF/token",
                   "DP MF/own tok");
  for (auto& dc : PlanCosts(p, c)) {
    s += fmt::format("{:>6} {:>9.1f} MiB {:>9} {:>9} {:>12} {:>14} {:>14.3f} {:>14.3f}\n",
                     dc.device, dc.weight_bytes / 1048576.0, dc.tp_heads, dc.tp_query_heads,
                     dc.tp_kv_bytes_per_token, dc.dp_kv_bytes_per_token,
                     dc.tp_attn_flops_per_token / 1e6, dc.dp_attn_flops_per_token / 1e6);
  }
  const PlanBalance b = BalanceOf(p, c);
  s += fmt::format(
      "\nbalance (TP part, per token): busiest device / mean: compute {:.2f}, KV {:.2f}; KV held "
      "per token: {:.2f}x the model's\n",
      b.compute_over_mean, b.kv_over_mean, b.kv_held_over_model);
  return s;
}

std::string PlanReportJson(const Plan& p, const ModelConfig& c) {
  nlohmann::json j = nlohmann::json::parse(PlanToJson(p));
  nlohmann::json devs = nlohmann::json::array();
  for (auto& dc : PlanCosts(p, c)) {
    devs.push_back(
        {{"device", dc.device},
         {"weight_bytes", dc.weight_bytes},
         {"tp_heads", dc.tp_heads},
         {"tp_query_heads", dc.tp_query_heads},
         {"ffn_shards", dc.ffn_shards},
         {"tp_kv_bytes_per_token", dc.tp_kv_bytes_per_token},
         {"dp_kv_bytes_per_owned_token", dc.dp_kv_bytes_per_token},
         {"tp_attention_flops_per_token", dc.tp_attn_flops_per_token},
         {"dp_attention_flops_per_owned_token", dc.dp_attn_flops_per_token},
         {"attention_core_flops_per_context_token", dc.attn_core_flops_per_context_token},
         {"ffn_flops_per_token", dc.ffn_flops_per_token}});
  }
  j["devices"] = devs;
  const PlanBalance b = BalanceOf(p, c);
  j["balance"] = {{"max_replicas", b.max_replicas},
                  {"compute_over_mean", b.compute_over_mean},
                  {"kv_over_mean", b.kv_over_mean},
                  {"kv_held_over_model", b.kv_held_over_model}};
  return j.dump();
}

}  // namespace failsafe
