// Loading a device's share of the weights from the host copy.
#include <algorithm>
#include <cstring>

#include "common/check.h"
#include "worker/device_model.h"

namespace failsafe {

namespace tn = tensor_names;

DeviceModel::DeviceModel(const ModelConfig& config, int device_id, Backend* backend,
                         const DeviceOptions& options)
    : config_(config),
      device_(device_id),
      backend_(backend),
      options_(options),
      inv_freq_(RopeInvFreq(config)),
      kv_(config.num_layers, config.num_kv_heads, options.block_size, config.head_dim,
          options.kv_pages) {}

int64_t DeviceModel::weight_bytes() const {
  int64_t b = embed_.bytes() + (config_.tie_word_embeddings ? 0 : lm_head_.bytes()) +
              final_norm_.size() * 4;
  for (auto& l : layers_) {
    b += (l.attn_norm.size() + l.ffn_norm.size() + l.router.size()) * 4;
    b += l.tp_qkv.bytes() + l.tp_o.bytes() + l.dp_qkv.bytes() + l.dp_o.bytes();
    b += l.ffn_gate_up.bytes() + l.ffn_down.bytes();
  }
  return b;
}

namespace {

// Runs of consecutive ids in an ascending list: (first, count).
std::vector<std::pair<int, int>> Runs(const std::vector<int>& ids, int break_every = 0) {
  std::vector<std::pair<int, int>> runs;
  for (int id : ids) {
    bool extend = !runs.empty() && runs.back().first + runs.back().second == id &&
                  (break_every == 0 || id % break_every != 0);
    if (extend) {
      runs.back().second++;
    } else {
      runs.emplace_back(id, 1);
    }
  }
  return runs;
}

}  // namespace

Status DeviceModel::LoadShare(const Plan& plan, const WeightStore& host) {
  plan_ = plan;
  const ModelConfig& c = config_;
  const int hd = c.head_dim, g = c.group_size(), hidden = c.hidden_size;
  const PlanShape& shape = plan.shape;
  const int w = shape.shard_width;
  layers_.assign(c.num_layers, {});
  for (int l = 0; l < c.num_layers; ++l) {
    LayerWeights& lw = layers_[l];
    lw.attn_norm.resize(hidden);
    lw.ffn_norm.resize(hidden);
    host.Get(tn::AttnNorm(l)).ReadRows(0, 1, lw.attn_norm.data());
    host.Get(tn::FfnNorm(l)).ReadRows(0, 1, lw.ffn_norm.data());
    if (!plan.IsActive(device_)) continue;
    TensorRef q = host.Get(tn::Q(l)), k = host.Get(tn::K(l)), v = host.Get(tn::V(l)),
              o = host.Get(tn::O(l));
    auto fill_qkv = [&](int head, float* dst) {
      q.ReadRows(static_cast<int64_t>(head) * g * hd, g * hd, dst);
      k.ReadRows(static_cast<int64_t>(head) * hd, hd, dst + static_cast<int64_t>(g) * hd * hidden);
      v.ReadRows(static_cast<int64_t>(head) * hd, hd,
                 dst + static_cast<int64_t>(g + 1) * hd * hidden);
    };
    auto fill_o = [&](int head, float* dst) {
      o.ReadColsTransposed(static_cast<int64_t>(head) * g * hd, g * hd, dst);
    };
    lw.tp_qkv = ItemMatrix((g + 2) * hd, hidden);
    lw.tp_o = ItemMatrix(g * hd, hidden);
    lw.dp_qkv = ItemMatrix((g + 2) * hd, hidden);
    lw.dp_o = ItemMatrix(g * hd, hidden);
    for (auto [first, count] : Runs(plan.layers[l].tp_heads[device_])) {
      lw.tp_qkv.Add(first, count, fill_qkv);
      lw.tp_o.Add(first, count, fill_o);
    }
    for (auto [first, count] : Runs(plan.layers[l].dp_heads)) {
      lw.dp_qkv.Add(first, count, fill_qkv);
      lw.dp_o.Add(first, count, fill_o);
    }
    lw.ffn_gate_up = ItemMatrix(2 * w, hidden);
    lw.ffn_down = ItemMatrix(w, hidden);
    for (auto [first, count] : Runs(plan.layers[l].ffn_shards[device_], shape.shards_per_expert)) {
      const int expert = c.is_moe() ? shape.ShardExpert(first) : -1;
      TensorRef gate = host.Get(tn::Gate(l, expert)), up = host.Get(tn::Up(l, expert));
      TensorRef down = host.Get(tn::Down(l, expert));
      lw.ffn_gate_up.Add(first, count, [&](int shard, float* dst) {
        const int64_t col = static_cast<int64_t>(shard % shape.shards_per_expert) * w;
        gate.ReadRows(col, w, dst);
        up.ReadRows(col, w, dst + static_cast<int64_t>(w) * hidden);
      });
      lw.ffn_down.Add(first, count, [&](int shard, float* dst) {
        down.ReadColsTransposed(static_cast<int64_t>(shard % shape.shards_per_expert) * w, w, dst);
      });
    }
    if (c.is_moe()) {
      lw.router.resize(static_cast<size_t>(c.num_experts) * hidden);
      host.Get(tn::Router(l)).ReadRows(0, c.num_experts, lw.router.data());
    }
  }
  final_norm_.resize(hidden);
  host.Get(tn::FinalNorm()).ReadRows(0, 1, final_norm_.data());
  auto fill_vocab = [&](const TensorRef& t) {
    return [&, t](int chunk, float* dst) {
      const int begin = shape.ChunkBegin(chunk), end = shape.ChunkEnd(chunk);
      t.ReadRows(begin, end - begin, dst);
      std::memset(
          dst + static_cast<int64_t>(end - begin) * hidden, 0,
          sizeof(float) * static_cast<size_t>(shape.vocab_chunk_size - (end - begin)) * hidden);
    };
  };
  embed_ = ItemMatrix(shape.vocab_chunk_size, hidden);
  lm_head_ = ItemMatrix(shape.vocab_chunk_size, hidden);
  TensorRef embed = host.Get(tn::Embedding()), head = host.Get(tn::LmHead(c));
  for (auto [first, count] : Runs(plan.vocab_chunks[device_])) {
    embed_.Add(first, count, fill_vocab(embed));
    if (c.tie_word_embeddings) {
      for (auto& seg : embed_.segments()) {
        if (seg.first == first) lm_head_.AddShared(seg);
      }
    } else {
      lm_head_.Add(first, count, fill_vocab(head));
    }
  }
  return Status::Ok();
}

}  // namespace failsafe
