#include "placement/plan_stats.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "placement/plan_json.h"

namespace failsafe {

std::vector<DeviceCost> PlanCosts(const Plan& p, const ModelConfig& c) {
  const int64_t h = c.hidden_size, hd = c.head_dim, g = c.group_size();
  const int64_t head_weights = ((g + 2) * hd * h + g * hd * h) * 4;  // q, k, v rows and o columns
  const double head_flops = 2.0 * ((g + 2) * hd * h + g * hd * h);
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
      const int dp = static_cast<int>(lp.dp_heads.size());
      dc.tp_heads += tp;
      dc.weight_bytes += (tp + dp) * head_weights;
      dc.tp_kv_bytes_per_token += tp * kv_per_head;
      dc.dp_kv_bytes_per_token += dp * kv_per_head;
      dc.tp_attn_flops_per_token += tp * head_flops;
      dc.dp_attn_flops_per_token += dp * head_flops;
      dc.attn_core_flops_per_context_token += tp * 4.0 * g * hd;
      const int shards = static_cast<int>(lp.ffn_shards[d].size());
      dc.ffn_shards += shards;
      dc.weight_bytes += shards * shard_weights;
      if (c.is_moe()) {
        dc.weight_bytes += static_cast<int64_t>(c.num_experts) * h * 4;  // router
        dc.ffn_flops_per_token += shards * shard_flops * c.experts_per_token / c.num_experts;
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

std::string PlanReport(const Plan& p, const ModelConfig& c) {
  std::string s = fmt::format("policy {}, {} devices alive of {}, active: ", PolicyName(p.policy),
                              p.alive.size(), p.num_devices);
  for (size_t i = 0; i < p.active.size(); ++i) s += (i ? "," : "") + std::to_string(p.active[i]);
  s += fmt::format("\nFFN: {} shards of width {} per {}; vocabulary: {} chunks of {} rows\n\n",
                   p.shape.shards_per_expert, p.shape.shard_width, c.is_moe() ? "expert" : "layer",
                   p.shape.vocab_chunks, p.shape.vocab_chunk_size);
  auto heads = [](const std::vector<int>& v) {
    std::string out;
    for (size_t i = 0; i < v.size(); ++i) out += (i ? "," : "") + std::to_string(v[i]);
    return out.empty() ? std::string("-") : out;
  };
  s += "layer";
  for (int d : p.active) s += fmt::format(" | dev{} heads (shards)", d);
  s += " | DP heads\n";
  for (int l = 0; l < c.num_layers; ++l) {
    s += fmt::format("{:5}", l);
    for (int d : p.active) {
      s += fmt::format(" | {:>11} ({:3})", heads(p.layers[l].tp_heads[d]),
                       p.layers[l].ffn_shards[d].size());
    }
    s += fmt::format(" | {}\n", heads(p.layers[l].dp_heads));
  }
  s += fmt::format("\n{:>6} {:>12} {:>10} {:>12} {:>14} {:>14} {:>14}\n", "device", "weights",
                   "TP heads", "KV B/token", "DP KV B/own", "attn GF/token", "DP GF/own tok");
  for (auto& dc : PlanCosts(p, c)) {
    s += fmt::format("{:>6} {:>9.1f} MiB {:>10} {:>12} {:>14} {:>14.4f} {:>14.4f}\n", dc.device,
                     dc.weight_bytes / 1048576.0, dc.tp_heads, dc.tp_kv_bytes_per_token,
                     dc.dp_kv_bytes_per_token, dc.tp_attn_flops_per_token / 1e9,
                     dc.dp_attn_flops_per_token / 1e9);
  }
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
         {"ffn_shards", dc.ffn_shards},
         {"tp_kv_bytes_per_token", dc.tp_kv_bytes_per_token},
         {"dp_kv_bytes_per_owned_token", dc.dp_kv_bytes_per_token},
         {"tp_attention_flops_per_token", dc.tp_attn_flops_per_token},
         {"dp_attention_flops_per_owned_token", dc.dp_attn_flops_per_token},
         {"attention_core_flops_per_context_token", dc.attn_core_flops_per_context_token},
         {"ffn_flops_per_token", dc.ffn_flops_per_token}});
  }
  j["devices"] = devs;
  return j.dump();
}

}  // namespace failsafe
