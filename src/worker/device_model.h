// A device's share of the model: its weight slices, its KV cache, and the
// forward pass over its shard.
//
// In a step, a device computes its TP head groups for every token and its DP
// head groups only for tokens of sequences whose DP rank it is; both feed one
// o-projection partial sum, reduced by the single all-reduce that tensor
// parallelism already needs. FFN shards and vocabulary chunks work the same
// way (partial sums; logits columns written in place).
//
// Thread-safety: one thread (the device's compute thread) calls everything.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "comm/communicator.h"
#include "common/status.h"
#include "model/config.h"
#include "model/weights.h"
#include "placement/plan.h"
#include "worker/item_matrix.h"
#include "worker/kv_cache.h"
#include "worker/step.h"

namespace failsafe {

struct DeviceOptions {
  int block_size = 16;   // tokens per KV page
  int64_t kv_pages = 0;  // KV pool size in pages
};

class DeviceModel {
 public:
  DeviceModel(const ModelConfig& config, int device_id, Backend* backend,
              const DeviceOptions& options);

  int device_id() const { return device_; }
  const ModelConfig& config() const { return config_; }
  const Plan& plan() const { return plan_; }
  KvCache& kv() { return kv_; }
  const KvCache& kv() const { return kv_; }
  int64_t weight_bytes() const;

  // Loads the device's share of `plan` from the host weights, replacing
  // whatever it held.
  Status LoadShare(const Plan& plan, const WeightStore& host);

  // Runs one step. Every active device of the plan must call it with the same
  // batch. Writes logits [batch.num_logits_rows, vocab_size] for the
  // vocabulary chunks this device holds (other columns untouched).
  Status Forward(const StepBatch& batch, Communicator& comm, float* logits, ForwardStats* stats);

  void FreeSeq(int64_t seq) { kv_.FreeSeq(seq); }

 private:
  struct LayerWeights {
    std::vector<float> attn_norm, ffn_norm;
    ItemMatrix tp_qkv, tp_o;    // TP head groups: [q(G heads) k v] rows and o^T rows per group
    ItemMatrix dp_qkv, dp_o;    // DP head groups, same layout
    ItemMatrix ffn_gate_up;     // per shard: gate rows then up rows [2 * width, hidden]
    ItemMatrix ffn_down;        // per shard: down^T rows [width, hidden]
    std::vector<float> router;  // MoE: [experts, hidden]
  };

  // Rows of one attention computation: all tokens (TP heads) or the tokens of
  // the sequences whose DP rank this device is (DP heads).
  struct HeadRows {
    const float* in = nullptr;  // [rows, hidden], normalised
    int rows = 0;
    const int32_t* positions = nullptr;     // [rows]
    std::vector<std::pair<int, int>> seqs;  // (index in the batch, first row)
  };

  // Forward pieces; each ends before its collective.
  void Embed(const StepBatch& b);
  void AttentionPartial(int layer, const StepBatch& b, ForwardStats* stats);
  void FfnPartial(int layer, int num_tokens, ForwardStats* stats);
  void LmHead(const StepBatch& b, float* logits, ForwardStats* stats);
  // qkv [rows, heads * (G + 2) * head_dim] and attn [rows, heads * G * head_dim].
  void RunHeads(const ItemMatrix& qkv_w, int layer, const StepBatch& b, const HeadRows& hr,
                float* qkv, float* attn, ForwardStats* stats);
  // out[rows, hidden] = FFN of `in` over the held shards of one expert (-1: dense).
  void FfnOnRows(const LayerWeights& lw, int expert, const float* in, int rows,
                 const float* row_scale, float* out, ForwardStats* stats);
  Status ReserveKv(const StepBatch& b);

  const ModelConfig config_;
  const int device_;
  Backend* const backend_;
  const DeviceOptions options_;
  const std::vector<float> inv_freq_;
  Plan plan_;
  std::vector<LayerWeights> layers_;
  ItemMatrix embed_,
      lm_head_;  // per vocabulary chunk [chunk_size, hidden]; lm_head_ shares embed_ when tied
  std::vector<float> final_norm_;
  KvCache kv_;

  // Step scratch, [tokens, ...] unless noted.
  std::vector<float> x_, h_, qkv_, attn_, partial_, dp_in_, dp_qkv_, dp_attn_, dp_out_;
  std::vector<float> gu_, act_, expert_in_, expert_out_, router_logits_, gate_w_, row_scale_,
      lm_out_;
  std::vector<int32_t> positions_, gate_ids_, dp_positions_;
  std::vector<int> expert_rows_;
  std::vector<AttentionArgs> problems_;
};

}  // namespace failsafe
