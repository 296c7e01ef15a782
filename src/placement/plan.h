// Plans: which head groups (per layer), FFN shards and vocabulary chunks each
// device holds, and which head groups are DP heads. A plan is a pure value
// computed from the model, the alive devices, the policy and (on replanning)
// the previous plan.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "model/config.h"

namespace failsafe {

enum class Policy {
  kStandard,    // power-of-two TP that divides the head groups; spare devices idle
  kNonUniform,  // all devices; heads split contiguously, the same in every layer
  kCyclic,      // nonuniform, but the devices with an extra head rotate by layer
  kHybrid,      // equal TP heads per device per layer; the remainder are DP heads
};
const char* PolicyName(Policy p);
Result<Policy> ParsePolicy(const std::string& name);

// The units a model is cut into. Fixed for a model; independent of devices.
struct PlanShape {
  int num_layers = 0;
  int num_kv_heads = 0;       // head groups per layer
  int expert_slots = 1;       // experts (1 for a dense FFN)
  int shards_per_expert = 0;  // FFN shards per expert (or per dense FFN)
  int shard_width = 0;        // intermediate columns per FFN shard
  int vocab_chunks = 0;
  int vocab_chunk_size = 0;  // rows per chunk; the last chunk may be short
  int vocab_size = 0;

  static PlanShape ForModel(const ModelConfig& c);
  int num_shards() const { return expert_slots * shards_per_expert; }
  int ShardExpert(int shard) const { return shard / shards_per_expert; }
  // Vocabulary rows [begin, end) of a chunk.
  int ChunkBegin(int chunk) const { return chunk * vocab_chunk_size; }
  int ChunkEnd(int chunk) const;
};

struct LayerPlan {
  std::vector<std::vector<int>> tp_heads;  // [device] -> KV heads held as TP heads, ascending
  std::vector<int> dp_heads;               // KV heads computed as DP heads, ascending
  std::vector<std::vector<int>>
      ffn_shards;  // [device] -> FFN shards (expert * shards_per_expert + s)
};

struct Plan {
  Policy policy = Policy::kHybrid;
  int num_devices = 0;      // N: device ids are 0..N-1
  std::vector<int> alive;   // devices that are up, ascending
  std::vector<int> active;  // devices that hold a share (subset of alive), ascending
  PlanShape shape;
  std::vector<LayerPlan> layers;
  std::vector<std::vector<int>> vocab_chunks;  // [device] -> chunks, ascending

  bool IsActive(int device) const;
  // Position of the device in `active` (its communicator rank), or -1.
  int RankOf(int device) const;
  // Does the device hold this head group in this layer (as TP, or as DP)?
  bool HoldsTpHead(int device, int layer, int head) const;
  bool IsDpHead(int layer, int head) const;
  int num_dp_heads_total() const;  // over all layers
  int num_tp_heads_total(int device) const;
  bool operator==(const Plan& o) const;
};

// A fresh plan for the alive devices (ids in [0, num_devices)).
Result<Plan> MakePlan(const ModelConfig& config, Policy policy, int num_devices,
                      const std::vector<int>& alive);

// Checks the invariants: every head group is TP on exactly one active device
// or DP; every FFN shard and vocab chunk on exactly one active device.
Status ValidatePlan(const Plan& plan);

}  // namespace failsafe
