// Loading a device's share of the weights from the host copy.
#include <algorithm>
#include <cmath>
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
      inv_freq_local_(config.rope_local_theta > 0 ? RopeInvFreq(config, /*local=*/true)
                                                  : std::vector<float>()),
      kv_(config.num_layers, config.num_kv_heads, options.block_size, config.head_dim,
          options.kv_pages, backend, options.kv_dtype) {
  if (options.peer_collectives) {
    // Between distinct GPUs the device library (NCCL) where it is there;
    // else, or between processes sharing a GPU, peer memory.
    if (!backend->host_memory()) group_ = std::make_unique<DeviceGroupReducer>(backend);
    peer_ = std::make_unique<PeerReducer>(backend);
  }
  for (DeviceArray<float>* a : {&rope_table_device_,
                                &rope_table_local_device_,
                                &out_,
                                &final_norm_,
                                &x_,
                                &h_,
                                &q_,
                                &kv_proj_,
                                &attn_,
                                &dp_in_,
                                &dp_q_,
                                &dp_kv_proj_,
                                &dp_attn_,
                                &gu_,
                                &act_,
                                &expert_in_,
                                &router_logits_,
                                &shared_logits_,
                                &gate_w_,
                                &lm_in_,
                                &lm_out_})
    a->set_memory(backend);
  for (DeviceArray<int64_t>* a : {&partial_, &dp_out_, &expert_out_}) a->set_memory(backend);
  for (DeviceArray<int32_t>* a : {&positions_, &gate_ids_, &dp_positions_}) a->set_memory(backend);
}

int64_t DeviceModel::weight_bytes() const {
  int64_t b = embed_.bytes() + (config_.tie_word_embeddings ? 0 : lm_head_.bytes()) +
              config_.hidden_size * 4;  // the final norm
  for (auto& l : layers_) {
    b += (2 * config_.hidden_size +
          (config_.is_moe() ? static_cast<int64_t>(config_.num_experts) * config_.hidden_size : 0) +
          (config_.shared_expert_size > 0 ? config_.hidden_size : 0)) *
         4;
    b += l.tp.bytes() + l.dp.bytes();
    if (config_.qkv_bias()) b += static_cast<int64_t>(config_.q_dim() + 2 * config_.kv_dim()) * 4;
    if (config_.qk_norm()) b += 2LL * config_.head_dim * 4;
    if (config_.gemma()) b += 2LL * config_.hidden_size * 4;
    b += l.ffn_gate_up.bytes() + l.ffn_down.bytes();
  }
  return b;
}

HostLoader::HostLoader(const ModelConfig& c, const PlanShape& shape, const WeightStore& host)
    : c_(c), shape_(shape), host_(host) {}

void HostLoader::Read(const tn::Rows& rows, int64_t row, int64_t n, float* dst) const {
  host_.Get(rows.tensor).ReadRows(rows.first + row, n, dst);
}

void HostLoader::Query(int layer, int q, float* dst) const {
  const int hd = c_.head_dim;
  Read(tn::QRows(c_, layer), static_cast<int64_t>(q) * hd, hd, dst);
}

void HostLoader::Kv(int layer, int head, float* dst) const {
  const int hd = c_.head_dim, hidden = c_.hidden_size;
  Read(tn::KRows(c_, layer), static_cast<int64_t>(head) * hd, hd, dst);
  Read(tn::VRows(c_, layer), static_cast<int64_t>(head) * hd, hd,
       dst + static_cast<int64_t>(hd) * hidden);
}

void HostLoader::O(int layer, int q, float* dst) const {
  const int hd = c_.head_dim;
  host_.Get(tn::O(layer)).ReadColsTransposed(static_cast<int64_t>(q) * hd, hd, dst);
}

void HostLoader::HeadRows(int layer, int head, int row_begin, int row_end, float* dst) const {
  // Rows of a head group, flattened: q (G*hd), k (hd), v (hd), then o^T (G*hd).
  const int hd = c_.head_dim, g = c_.group_size(), hidden = c_.hidden_size;
  for (int r = row_begin; r < row_end; ++r) {
    float* out = dst + static_cast<int64_t>(r - row_begin) * hidden;
    if (r < g * hd) {
      Read(tn::QRows(c_, layer), static_cast<int64_t>(head) * g * hd + r, 1, out);
    } else if (r < (g + 1) * hd) {
      Read(tn::KRows(c_, layer), static_cast<int64_t>(head) * hd + r - g * hd, 1, out);
    } else if (r < (g + 2) * hd) {
      Read(tn::VRows(c_, layer), static_cast<int64_t>(head) * hd + r - (g + 1) * hd, 1, out);
    } else {
      host_.Get(tn::O(layer))
          .ReadColsTransposed(static_cast<int64_t>(head) * g * hd + r - (g + 2) * hd, 1, out);
    }
  }
}

int HostLoader::Expert(int shard) const { return c_.is_moe() ? shape_.ShardExpert(shard) : -1; }

int64_t HostLoader::ShardOffset(int shard) const {
  return static_cast<int64_t>(shard % shape_.shards_per_expert) * shape_.shard_width;
}

void HostLoader::GateUp(int layer, int shard, float* dst) const {
  const int w = shape_.shard_width, hidden = c_.hidden_size;
  Read(tn::GateRows(c_, layer, Expert(shard)), ShardOffset(shard), w, dst);
  Read(tn::UpRows(c_, layer, Expert(shard)), ShardOffset(shard), w,
       dst + static_cast<int64_t>(w) * hidden);
}

void HostLoader::Down(int layer, int shard, float* dst) const {
  const tn::Rows cols = tn::DownCols(c_, layer, Expert(shard));
  host_.Get(cols.tensor)
      .ReadColsTransposed(cols.first + ShardOffset(shard), shape_.shard_width, dst);
}

void HostLoader::Vocab(bool lm_head, int chunk, float* dst) const {
  const int hidden = c_.hidden_size;
  const int begin = shape_.ChunkBegin(chunk), end = shape_.ChunkEnd(chunk);
  host_.Get(lm_head ? tn::LmHead(c_) : tn::Embedding()).ReadRows(begin, end - begin, dst);
  std::memset(
      dst + static_cast<int64_t>(end - begin) * hidden, 0,
      sizeof(float) * static_cast<size_t>(shape_.vocab_chunk_size - (end - begin)) * hidden);
}

bool HostLoader::Copy(const tn::Rows& rows, int64_t row, int64_t n, DType dt,
                      unsigned char* dst) const {
  return host_.Get(rows.tensor).CopyRows(rows.first + row, n, dt, dst);
}

bool HostLoader::CopyQuery(int layer, int q, DType dt, unsigned char* dst) const {
  const int hd = c_.head_dim;
  return Copy(tn::QRows(c_, layer), static_cast<int64_t>(q) * hd, hd, dt, dst);
}

bool HostLoader::CopyKv(int layer, int head, DType dt, unsigned char* dst) const {
  const int hd = c_.head_dim, hidden = c_.hidden_size;
  return Copy(tn::KRows(c_, layer), static_cast<int64_t>(head) * hd, hd, dt, dst) &&
         Copy(tn::VRows(c_, layer), static_cast<int64_t>(head) * hd, hd, dt,
              dst + static_cast<int64_t>(hd) * hidden * DTypeSize(dt));
}

bool HostLoader::CopyO(int layer, int q, DType dt, unsigned char* dst) const {
  const int hd = c_.head_dim;
  return host_.Get(tn::O(layer)).CopyCols(static_cast<int64_t>(q) * hd, hd, dt, dst);
}

bool HostLoader::CopyGateUp(int layer, int shard, DType dt, unsigned char* dst) const {
  const int w = shape_.shard_width, hidden = c_.hidden_size;
  return Copy(tn::GateRows(c_, layer, Expert(shard)), ShardOffset(shard), w, dt, dst) &&
         Copy(tn::UpRows(c_, layer, Expert(shard)), ShardOffset(shard), w, dt,
              dst + static_cast<int64_t>(w) * hidden * DTypeSize(dt));
}

bool HostLoader::CopyDown(int layer, int shard, DType dt, unsigned char* dst) const {
  const tn::Rows cols = tn::DownCols(c_, layer, Expert(shard));
  return host_.Get(cols.tensor)
      .CopyCols(cols.first + ShardOffset(shard), shape_.shard_width, dt, dst);
}

bool HostLoader::CopyVocab(bool lm_head, int chunk, DType dt, unsigned char* dst) const {
  const int hidden = c_.hidden_size;
  const int begin = shape_.ChunkBegin(chunk), end = shape_.ChunkEnd(chunk);
  if (!host_.Get(lm_head ? tn::LmHead(c_) : tn::Embedding()).CopyRows(begin, end - begin, dt, dst))
    return false;
  const size_t row = static_cast<size_t>(hidden) * DTypeSize(dt);
  std::memset(dst + static_cast<size_t>(end - begin) * row, 0,
              static_cast<size_t>(shape_.vocab_chunk_size - (end - begin)) * row);
  return true;
}

std::vector<std::pair<int, int>> ItemRuns(const std::vector<int>& ids, int break_every) {
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

void DeviceModel::AddAttention(AttentionWeights* w, int layer, const std::vector<int>& queries,
                               const std::vector<int>& groups, const HostLoader& load) {
  // Each item as the checkpoint stores it where the matrix holds it so
  // (ItemMatrix::RawSource: rows for [n, k] weights, the transposed [k, n]
  // items' column runs), else through f32.
  const DType dt = w->q.dtype();
  for (auto [first, count] : ItemRuns(queries, 0)) {
    w->q.Add(first, count, [&](int q, float* dst) { load.Query(layer, q, dst); }, true,
             {ItemLayout::kRowMajor,
              [&](int q, unsigned char* dst) { return load.CopyQuery(layer, q, dt, dst); }});
    w->o.Add(first, count, [&](int q, float* dst) { load.O(layer, q, dst); }, true,
             {ItemLayout::kTransposed,
              [&](int q, unsigned char* dst) { return load.CopyO(layer, q, dt, dst); }});
  }
  for (auto [first, count] : ItemRuns(groups, 0))
    w->kv.Add(first, count, [&](int h, float* dst) { load.Kv(layer, h, dst); }, true,
              {ItemLayout::kRowMajor,
               [&](int h, unsigned char* dst) { return load.CopyKv(layer, h, dt, dst); }});
}

std::vector<int> DeviceModel::QueriesOfGroups(const std::vector<int>& groups) const {
  const int g = config_.group_size();
  std::vector<int> out;
  for (int h : groups) {
    for (int j = 0; j < g; ++j) out.push_back(h * g + j);
  }
  return out;
}

void DeviceModel::UpdateBackupSlots() {
  backup_tp_slot_.assign(kv_.num_slots(), 0);
  kv_slots_tp_ = plan_.KvSlots(device_, -1);
  kv_slots_rank_ = plan_.KvSlots(device_, device_);
  if (!plan_.IsActive(device_)) return;
  for (int l = 0; l < config_.num_layers; ++l) {
    for (int h : plan_.layers[l].tp_heads[device_])
      backup_tp_slot_[kv_.Slot(l, h)] = plan_.KvWriter(l, h, -1) == device_;
  }
}

void DeviceModel::AddShards(LayerWeights* lw, int layer, const std::vector<int>& shards,
                            const HostLoader& load) {
  const DType dt = lw->ffn_gate_up.dtype();
  for (auto [first, count] : ItemRuns(shards, plan_.shape.shards_per_expert)) {
    lw->ffn_gate_up.Add(first, count, [&](int s, float* dst) { load.GateUp(layer, s, dst); }, true,
                        {ItemLayout::kRowMajor, [&](int s, unsigned char* dst) {
                           return load.CopyGateUp(layer, s, dt, dst);
                         }});
    lw->ffn_down.Add(first, count, [&](int s, float* dst) { load.Down(layer, s, dst); }, true,
                     {ItemLayout::kTransposed,
                      [&](int s, unsigned char* dst) { return load.CopyDown(layer, s, dt, dst); }});
  }
}

void DeviceModel::AddChunks(const std::vector<int>& chunks, const HostLoader& load) {
  const DType dt = embed_.dtype();
  for (auto [first, count] : ItemRuns(chunks, 0)) {
    embed_.Add(first, count, [&](int ch, float* dst) { load.Vocab(false, ch, dst); }, true,
               {ItemLayout::kRowMajor,
                [&](int ch, unsigned char* dst) { return load.CopyVocab(false, ch, dt, dst); }});
    if (config_.tie_word_embeddings) {
      for (auto& seg : embed_.segments()) {
        if (seg.first == first) lm_head_.AddShared(seg);
      }
    } else {
      lm_head_.Add(first, count, [&](int ch, float* dst) { load.Vocab(true, ch, dst); }, true,
                   {ItemLayout::kRowMajor,
                    [&](int ch, unsigned char* dst) { return load.CopyVocab(true, ch, dt, dst); }});
    }
  }
}

void DeviceModel::InitLayers(const Plan& plan, const WeightStore& host) {
  plan_ = plan;
  const ModelConfig& c = config_;
  const int hd = c.head_dim, hidden = c.hidden_size;
  const int w = plan.shape.shard_width;
  const DType wt = host.MatrixDType();
  // The matrices LinearNT multiplies by ([n, k]: q/k/v, gate/up, the
  // vocabulary) and the transposed-stored o and down projections are held
  // as the backend reads them fastest (the CPU's: [n, k] blocked whatever
  // their rows per item, an item's last rows % 16 rows in a narrower block).
  const ItemLayout nt = backend_->BlockedNT(wt) ? ItemLayout::kBlocked : ItemLayout::kRowMajor;
  const ItemLayout nn = backend_->ColumnBlockedNN(wt) ? ItemLayout::kColumnBlocked
                        : backend_->TransposedNN(wt)  ? ItemLayout::kTransposed
                                                      : ItemLayout::kRowMajor;
  Backend* mem = backend_;
  // Small tensors every device holds whole: read, then uploaded.
  auto read = [&](const std::string& name) {
    const TensorRef t = host.Get(name);
    std::vector<float> v(static_cast<size_t>(t.rows() * t.cols()));
    t.ReadRows(0, t.rows(), v.data());
    return v;
  };
  auto upload = [&](const std::vector<float>& v, DeviceArray<float>* dst) {
    dst->set_memory(mem);
    Upload(v, dst);
  };
  // An RMS norm's weight; Gemma's scale by (1 + w), added here in f32 as its
  // modeling code does.
  auto norm_of = [&](const std::string& name, DeviceArray<float>* dst) {
    std::vector<float> v = read(name);
    if (c.gemma()) {
      for (float& x : v) x = 1.0f + x;
    }
    upload(v, dst);
  };
  layers_.clear();
  layers_.resize(c.num_layers);
  for (int l = 0; l < c.num_layers; ++l) {
    LayerWeights& lw = layers_[l];
    norm_of(tn::AttnNorm(l), &lw.attn_norm);
    norm_of(tn::FfnNorm(c, l), &lw.ffn_norm);
    if (c.gemma()) {
      norm_of(tn::AttnOutNorm(l), &lw.attn_out_norm);
      norm_of(tn::FfnOutNorm(l), &lw.ffn_out_norm);
    }
    for (AttentionWeights* a : {&lw.tp, &lw.dp}) {
      a->q = ItemMatrix(hd, hidden, wt, nt, mem);
      a->kv = ItemMatrix(2 * hd, hidden, wt, nt, mem);
      a->o = ItemMatrix(hd, hidden, wt, nn, mem);
    }
    lw.ffn_gate_up = ItemMatrix(2 * w, hidden, wt, nt, mem);
    lw.ffn_down = ItemMatrix(w, hidden, wt, nn, mem);
    if (c.is_moe()) upload(read(tn::Router(c, l)), &lw.router);
    if (c.shared_expert_size > 0) upload(read(tn::SharedExpertGate(l)), &lw.shared_gate);
    if (c.qk_norm()) {
      norm_of(tn::QNorm(l), &lw.q_norm);
      norm_of(tn::KNorm(l), &lw.k_norm);
    }
    if (c.qkv_bias()) {
      upload(read(tn::QBias(l)), &lw.q_bias);
      // As the kv items lie: each group's k bias, then its v bias.
      const std::vector<float> k = read(tn::KBias(l)), v = read(tn::VBias(l));
      std::vector<float> kv(2 * static_cast<size_t>(c.kv_dim()));
      for (int h = 0; h < c.num_kv_heads; ++h) {
        std::copy_n(k.begin() + h * hd, hd, kv.begin() + 2 * h * hd);
        std::copy_n(v.begin() + h * hd, hd, kv.begin() + (2 * h + 1) * hd);
      }
      upload(kv, &lw.kv_bias);
    }
  }
  norm_of(tn::FinalNorm(), &final_norm_);
  // Gemma scales the embeddings by sqrt(hidden) in the model's type.
  embed_scale_ = 0;
  if (c.gemma()) {
    const float s = std::sqrt(static_cast<float>(hidden));
    embed_scale_ = wt == DType::kBF16  ? BFloat16ToFloat(FloatToBFloat16(s))
                   : wt == DType::kF16 ? HalfToFloat(FloatToHalf(s))
                                       : s;
  }
  embed_ = ItemMatrix(plan.shape.vocab_chunk_size, hidden, wt, nt, mem);
  lm_head_ = ItemMatrix(plan.shape.vocab_chunk_size, hidden, wt, nt, mem);
}

Status DeviceModel::LoadShare(const Plan& plan, const WeightStore& host) {
  ++graph_epoch_;
  InitLayers(plan, host);
  UpdateBackupSlots();
  if (!plan.IsActive(device_)) return Status::Ok();
  HostLoader load(config_, plan.shape, host);
  for (int l = 0; l < config_.num_layers; ++l) {
    LayerWeights& lw = layers_[l];
    const LayerPlan& lp = plan.layers[l];
    AddAttention(&lw.tp, l, lp.tp_queries[device_], lp.tp_heads[device_], load);
    AddAttention(&lw.dp, l, QueriesOfGroups(lp.dp_heads), lp.dp_heads, load);
    AddShards(&lw, l, plan.layers[l].ffn_shards[device_], load);
  }
  AddChunks(plan.vocab_chunks[device_], load);
  return Status::Ok();
}

}  // namespace failsafe
