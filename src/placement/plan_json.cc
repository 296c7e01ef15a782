#include "placement/plan_json.h"

#include <nlohmann/json.hpp>

namespace failsafe {

using nlohmann::json;

std::string PlanToJson(const Plan& p) {
  json j;
  j["policy"] = PolicyName(p.policy);
  j["num_devices"] = p.num_devices;
  j["alive"] = p.alive;
  j["active"] = p.active;
  const PlanShape& s = p.shape;
  j["shape"] = {{"num_layers", s.num_layers},
                {"num_kv_heads", s.num_kv_heads},
                {"group_size", s.group_size},
                {"expert_slots", s.expert_slots},
                {"shards_per_expert", s.shards_per_expert},
                {"shard_width", s.shard_width},
                {"vocab_chunks", s.vocab_chunks},
                {"vocab_chunk_size", s.vocab_chunk_size},
                {"vocab_size", s.vocab_size}};
  json layers = json::array();
  for (auto& l : p.layers) {
    layers.push_back({{"tp_heads", l.tp_heads},
                      {"tp_queries", l.tp_queries},
                      {"dp_heads", l.dp_heads},
                      {"ffn_shards", l.ffn_shards}});
  }
  j["layers"] = layers;
  j["vocab_chunks"] = p.vocab_chunks;
  return j.dump();
}

Result<Plan> PlanFromJson(const std::string& text) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return InvalidArgument("plan: not a JSON object");
  Plan p;
  try {
    FS_ASSIGN_OR_RETURN(p.policy, ParsePolicy(j.at("policy").get<std::string>()));
    p.num_devices = j.at("num_devices").get<int>();
    p.alive = j.at("alive").get<std::vector<int>>();
    p.active = j.at("active").get<std::vector<int>>();
    const json& s = j.at("shape");
    p.shape.num_layers = s.at("num_layers");
    p.shape.num_kv_heads = s.at("num_kv_heads");
    p.shape.group_size = s.at("group_size");
    p.shape.expert_slots = s.at("expert_slots");
    p.shape.shards_per_expert = s.at("shards_per_expert");
    p.shape.shard_width = s.at("shard_width");
    p.shape.vocab_chunks = s.at("vocab_chunks");
    p.shape.vocab_chunk_size = s.at("vocab_chunk_size");
    p.shape.vocab_size = s.at("vocab_size");
    for (auto& l : j.at("layers")) {
      LayerPlan lp;
      lp.tp_heads = l.at("tp_heads").get<std::vector<std::vector<int>>>();
      lp.tp_queries = l.at("tp_queries").get<std::vector<std::vector<int>>>();
      lp.dp_heads = l.at("dp_heads").get<std::vector<int>>();
      lp.ffn_shards = l.at("ffn_shards").get<std::vector<std::vector<int>>>();
      p.layers.push_back(std::move(lp));
    }
    p.vocab_chunks = j.at("vocab_chunks").get<std::vector<std::vector<int>>>();
  } catch (const std::exception& e) {
    return InvalidArgument("plan: {}", e.what());
  }
  if (p.num_devices < 1 || p.num_devices > 4096) return InvalidArgument("plan: bad device count");
  Status st = ValidatePlan(p);
  if (!st.ok()) return InvalidArgument("plan: {}", st.message());
  return p;
}

}  // namespace failsafe
