// Plans: which head groups (per layer), FFN shards and vocabulary chunks each
// device holds, and which head groups are DP heads. A plan is a pure value
// computed from the model, the alive devices, the policy and (on replanning)
// the previous plan.
//
// Any number of devices serves any model. With at most as many active devices
// as head groups, a TP head group lives whole on one device. With more, a
// policy either replicates head groups (nonuniform, cyclic, standard): each
// device holds the K/V projection and the KV cache of one head group and
// computes a distinct part of its query heads, so every query head is still
// computed once and the o-projection partial sums still add up in the one
// all-reduce; or it makes them DP heads (hybrid: floor(H/n) TP heads per
// device, possibly none, down to pure DP attention).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "model/config.h"

namespace failsafe {

enum class Policy {
  // vLLM's rule: the largest power-of-two TP size that divides the query
  // heads, and divides the head groups or (replicating them) is a multiple of
  // their count; spare devices idle.
  kStandard,
  // All devices; head groups split contiguously, the same in every layer. With
  // more devices than head groups: each device takes part of one head group's
  // query heads (groups replicated on floor or ceil of n/H devices).
  kNonUniform,
  // Nonuniform, but the devices with an extra head (or the lighter share of a
  // replicated group) rotate by layer, so KV and work even out over the model.
  kCyclic,
  // Equal TP heads per device per layer (floor(H/n), possibly none); the
  // remainder are DP heads.
  kHybrid,
};
const char* PolicyName(Policy p);
Result<Policy> ParsePolicy(const std::string& name);

// The units a model is cut into. Fixed for a model; independent of devices.
struct PlanShape {
  int num_layers = 0;
  int num_kv_heads = 0;       // head groups per layer
  int group_size = 1;         // query heads per head group
  int expert_slots = 1;       // experts (1 for a dense FFN)
  int shards_per_expert = 0;  // FFN shards per expert (or per dense FFN)
  int shard_width = 0;        // intermediate columns per FFN shard
  int vocab_chunks = 0;
  int vocab_chunk_size = 0;  // rows per chunk; the last chunk may be short
  int vocab_size = 0;

  static PlanShape ForModel(const ModelConfig& c);
  int num_shards() const { return expert_slots * shards_per_expert; }
  int num_query_heads() const { return num_kv_heads * group_size; }
  int ShardExpert(int shard) const { return shard / shards_per_expert; }
  // Vocabulary rows [begin, end) of a chunk.
  int ChunkBegin(int chunk) const { return chunk * vocab_chunk_size; }
  int ChunkEnd(int chunk) const;
};

struct LayerPlan {
  // [device] -> head groups whose K/V the device computes and caches as TP
  // heads, ascending. A group may be held by several devices (replicas).
  std::vector<std::vector<int>> tp_heads;
  // [device] -> query heads (head group * group_size + j) it computes as TP
  // heads, ascending. Each query head of a TP head group is on exactly one
  // device, and tp_heads[d] is exactly the groups of tp_queries[d].
  std::vector<std::vector<int>> tp_queries;
  std::vector<int> dp_heads;  // KV heads computed as DP heads, ascending
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
  // Does the device hold this head group in this layer as a TP head (whole,
  // or as one of its replicas)?
  bool HoldsTpHead(int device, int layer, int head) const;
  bool IsDpHead(int layer, int head) const;
  // Devices holding a TP head group, ascending (several if replicated).
  std::vector<int> TpHolders(int layer, int head) const;
  // The device whose copy of a (layer, head group)'s KV goes to the host
  // backup, for a sequence with DP rank `dp_rank`: the DP rank for a DP head;
  // for a replicated TP head one of its holders, chosen by layer so that the
  // copying is spread; -1 if nobody holds it. Replicas never write twice.
  int KvWriter(int layer, int head, int dp_rank) const;
  // Every device that is the KvWriter of some (layer, head group) for a
  // sequence with DP rank `dp_rank`, ascending: whose backup progress says
  // how much of the sequence the backup holds.
  std::vector<int> KvWriters(int dp_rank) const;
  // The devices that cache a (layer, head group)'s KV for a sequence with DP
  // rank `dp_rank`: the DP rank for a DP head, every holder of a TP head.
  std::vector<int> KvHolders(int layer, int head, int dp_rank) const;
  // The KV slots (layer * num_kv_heads + head group) `device` caches for a
  // sequence with DP rank `dp_rank`, ascending: its TP head groups of every
  // layer, and every DP head group if it is the DP rank; empty if the device
  // is not active. The one definition of "which device stores what": the
  // scheduler's block tables and the devices' page stores index a sequence's
  // pages on a device as [block][position of the slot in this list].
  std::vector<int> KvSlots(int device, int dp_rank) const;
  int num_dp_heads_total() const;  // over all layers
  // Over all layers: head groups whose KV the device caches (TP), and the
  // query heads it computes (TP).
  int num_tp_heads_total(int device) const;
  int num_tp_queries_total(int device) const;
  // The largest number of devices holding one TP head group (1: no replicas).
  int max_replicas() const;
  bool operator==(const Plan& o) const;
};

// A fresh plan for the alive devices (ids in [0, num_devices)).
Result<Plan> MakePlan(const ModelConfig& config, Policy policy, int num_devices,
                      const std::vector<int>& alive);

// Checks the invariants: every head group is DP, or TP with each of its query
// heads on exactly one active device (the devices holding part of it cache
// its KV); every FFN shard and vocab chunk on exactly one active device.
Status ValidatePlan(const Plan& plan);

// Every query head of the layer's TP head groups, on the devices holding the
// group: tp_queries for plans whose groups are whole.
void SetWholeGroupQueries(int group_size, LayerPlan* layer);

}  // namespace failsafe
