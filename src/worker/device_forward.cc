// The forward pass over a device's share of the model.
#include <time.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "common/check.h"
#include "common/clock.h"
#include "common/fixed_point.h"
#include "common/rng.h"
#include "worker/device_model.h"

namespace failsafe {

Status DeviceModel::ApplyKvTables(const StepBatch& b) {
  if (device_ < static_cast<int>(b.kv.size())) {
    const KvTableUpdate& u = b.kv[device_];
    for (const KvBlockRun& run : u.runs) {
      const std::vector<int>& slots = KvSlots(run.dp_rank);
      const int64_t n = static_cast<int64_t>(run.num_blocks) * slots.size();
      if (run.num_blocks < 0 || run.page_offset < 0 ||
          run.page_offset + n > static_cast<int64_t>(u.pages.size())) {
        return InvalidArgument("malformed block table for sequence {}", run.seq_id);
      }
      FS_RETURN_IF_ERROR(kv_.AddBlocks(run.seq_id, slots, run.first_block, run.num_blocks,
                                       u.pages.data() + run.page_offset, run.shared_blocks));
    }
  }
  const int bs = kv_.block_size();
  for (const StepSeq& s : b.seqs) {
    const std::vector<int>& slots = KvSlots(s.dp_rank);
    if (slots.empty()) continue;
    const int blocks = (s.start_pos + s.num_tokens + bs - 1) / bs;
    if (kv_.HeldSlots(s.seq_id) != slots || kv_.NumBlocks(s.seq_id, slots.front()) < blocks) {
      return FailedPrecondition(
          "device {}: sequence {} has no block table for positions up to {} (DP rank {})", device_,
          s.seq_id, s.start_pos + s.num_tokens, s.dp_rank);
    }
    // Shared (cached) blocks are read-only: the scheduler computes past them.
    if (s.start_pos < kv_.SharedBlocks(s.seq_id) * bs) {
      return FailedPrecondition(
          "device {}: sequence {} would write position {} into a shared block", device_, s.seq_id,
          s.start_pos);
    }
  }
  return CopyHostHits(b);
}

Status DeviceModel::PrepareCollectives(Communicator& comm) {
  if (group_) return group_->Ready(comm).status();
  return Status::Ok();
}

template <typename T>
Status DeviceModel::AllReduce(Communicator& comm, T* data, size_t n, std::vector<T>* staging) {
  if (group_) {
    FS_ASSIGN_OR_RETURN(const bool ready, group_->Ready(comm));
    if (ready) return group_->AllReduceSum(comm, data, n);
  }
  if (peer_) {
    FS_ASSIGN_OR_RETURN(const bool ready, peer_->Ready(comm));
    if (ready) return peer_->AllReduceSum(comm, data, n);
  }
  if (backend_->host_memory()) return comm.AllReduceSum(data, n);
  if (comm.size() == 1) return Status::Ok();
  if (staging->size() < n) staging->resize(n);
  backend_->CopyToHost(staging->data(), data, n * sizeof(T));
  FS_RETURN_IF_ERROR(comm.AllReduceSum(staging->data(), n));
  backend_->CopyToDevice(data, staging->data(), n * sizeof(T));
  return Status::Ok();
}

Status DeviceModel::SettleCollectives(Communicator& comm) {
  if (!group_ || !group_->ready()) return Status::Ok();
  return group_->Settle(comm);
}

namespace {

// While a step runs: the backend's own waits (backend.h: SetBeforeWait)
// first wait for the device library's all-reduces, under the group's
// deadline, and a step that ends early still waits for them.
class SettleBeforeWaits {
 public:
  SettleBeforeWaits(Backend* backend, DeviceGroupReducer* group, Communicator& comm)
      : backend_(backend), group_(group), comm_(comm) {
    if (group_) backend_->SetBeforeWait([this] { (void)group_->Settle(comm_); });
  }
  ~SettleBeforeWaits() {
    if (!group_) return;
    backend_->SetBeforeWait({});
    (void)group_->Settle(comm_);
  }
  SettleBeforeWaits(const SettleBeforeWaits&) = delete;
  SettleBeforeWaits& operator=(const SettleBeforeWaits&) = delete;

 private:
  Backend* const backend_;
  DeviceGroupReducer* const group_;
  Communicator& comm_;
};

}  // namespace

Status DeviceModel::Forward(const StepBatch& b, Communicator& comm, float* logits,
                            ForwardStats* stats) {
  const int T = b.num_tokens();
  const int H = config_.hidden_size;
  // Validation is identical on every device, so all fail together before any
  // collective.
  for (int32_t t : b.tokens) {
    if (t < 0 || t >= config_.vocab_size)
      return InvalidArgument("token id {} is outside the vocabulary", t);
  }
  for (const StepSeq& s : b.seqs) {
    if (s.num_tokens <= 0 || s.token_offset < 0 || s.token_offset + s.num_tokens > T ||
        s.start_pos < 0 ||
        (s.logits_row >= 0 && (s.logits_rows < 1 || s.logits_rows > s.num_tokens ||
                               s.logits_row + s.logits_rows > b.num_logits_rows))) {
      return InvalidArgument("malformed step for sequence {}", s.seq_id);
    }
  }
  FS_RETURN_IF_ERROR(ApplyKvTables(b));

  host_positions_.resize(T);
  int32_t* pos = host_positions_.data();
  int end_pos = 0;
  for (const StepSeq& s : b.seqs) {
    for (int i = 0; i < s.num_tokens; ++i) pos[s.token_offset + i] = s.start_pos + i;
    end_pos = std::max(end_pos, s.start_pos + s.num_tokens);
  }
  backend_->CopyToDevice(positions_.Reserve(T), pos, sizeof(int32_t) * T);
  // Rows in steps of 1024, so a growing context extends it now and then.
  ExtendRopeTable(inv_freq_, (end_pos + 1023) / 1024 * 1024, &rope_table_,
                  config_.longrope.attention_factor);
  if (rope_rows_device_ * config_.head_dim != rope_table_.size()) {
    Upload(rope_table_, &rope_table_device_);
    rope_rows_device_ = rope_table_.size() / config_.head_dim;
    if (!inv_freq_local_.empty()) {  // grows with the other
      ExtendRopeTable(inv_freq_local_, static_cast<int>(rope_rows_device_), &rope_table_local_);
      Upload(rope_table_local_, &rope_table_local_device_);
    }
  }

  // Steps that repeat their shapes run as one graph where the backend keeps
  // them (backend.h: BeginGraph).
  bool in_graph = false;
  if (auto key = GraphKey(b, comm)) in_graph = backend_->BeginGraph(key->first, key->second);

  ForwardStats local;
  if (!stats) stats = &local;
  *stats = ForwardStats();
  int64_t seg_cpu = ThreadCpuNanos(), seg_wall = MonotonicNanos();
  auto end_segment = [&] {
    Stretch(seg_wall);
    int64_t c = ThreadCpuNanos(), w = MonotonicNanos();
    stats->segment_cpu_ns.push_back(c - seg_cpu);
    stats->segment_wall_ns.push_back(w - seg_wall);
    seg_cpu = c;
    seg_wall = w;
  };
  // Time in `collective` counts as collective time, not a segment's.
  auto in_collective = [&](auto&& collective) -> Status {
    end_segment();
    Status st = collective();
    int64_t w = MonotonicNanos();
    stats->collective_wall_ns += w - seg_wall;
    seg_cpu = ThreadCpuNanos();
    seg_wall = w;
    return st;
  };
  auto all_reduce = [&](auto* data, size_t n, auto* staging) -> Status {
    return in_collective([&] { return AllReduce(comm, data, n, staging); });
  };
  // Waiting for the device library's all-reduces: time in collectives, as
  // when each was waited for alone.
  auto settle = [&]() -> Status {
    if (!group_ || !group_->unsettled()) return SettleCollectives(comm);
    return in_collective([&] { return SettleCollectives(comm); });
  };

  const size_t n = static_cast<size_t>(T) * H;
  float* x = x_.Reserve(n);
  SettleBeforeWaits settle_before_waits(backend_, group_.get(), comm);
  Embed(b);
  FS_RETURN_IF_ERROR(all_reduce(x, n, &host_stage_f32_));
  if (embed_scale_ != 0) {
    host_row_scale_.assign(T, embed_scale_);
    backend_->ScaleRows(x, H, host_row_scale_.data(), T, H);
  }
  // The partial sums of query heads and FFN shards are exact (fixed point):
  // whichever devices hold which items, the sums and so the residual stream
  // are the same bit for bit.
  residual_normed_ = false;
  for (int l = 0; l < config_.num_layers; ++l) {
    AttentionPartial(l, b, stats);
    FS_RETURN_IF_ERROR(all_reduce(partial_.data(), n, &host_stage_fixed_));
    AddToResidual(layers_[l].attn_out_norm, T, &layers_[l].ffn_norm);
    // (The experts' routing is read on the host.)
    if (config_.is_moe()) FS_RETURN_IF_ERROR(settle());
    FfnPartial(l, T, stats);
    FS_RETURN_IF_ERROR(all_reduce(partial_.data(), n, &host_stage_fixed_));
    AddToResidual(layers_[l].ffn_out_norm, T,
                  l + 1 < config_.num_layers ? &layers_[l + 1].attn_norm : nullptr);
  }
  LmHead(b, stats);
  if (in_graph) backend_->EndGraph();
  FS_RETURN_IF_ERROR(settle());
  CopyLogits(b, logits);
  // The step's KV is in its pages before the backup reads them.
  backend_->Synchronize();
  end_segment();
  EnqueueBackup(b);
  stats->kv_bytes = kv_.used_pages() * kv_.page_bytes();
  return Status::Ok();
}

void DeviceModel::AddToResidual(const DeviceArray<float>& out_norm, int num_tokens,
                                const DeviceArray<float>* next_norm) {
  const int H = config_.hidden_size;
  const int64_t n = static_cast<int64_t>(num_tokens) * H;
  if (!config_.gemma()) {
    if (next_norm) {
      backend_->AddFixedToNorm(partial_.data(), x_.data(), next_norm->data(),
                               h_.Reserve(static_cast<size_t>(n)), num_tokens, H,
                               static_cast<float>(config_.rms_norm_eps));
      residual_normed_ = true;
    } else {
      backend_->AddFixedTo(partial_.data(), x_.data(), n);
    }
    return;
  }
  // Gemma normalises the summed output before the residual takes it: the
  // sum as floats, its norm, then added as one row of n.
  float* out = out_.Reserve(static_cast<size_t>(n));
  backend_->SetZero(out, sizeof(float) * static_cast<size_t>(n));
  backend_->AddFixedTo(partial_.data(), out, n);
  backend_->RmsNorm(out, H, out_norm.data(), out, H, num_tokens, H,
                    static_cast<float>(config_.rms_norm_eps));
  backend_->AddBias(x_.data(), n, out, 1, static_cast<int>(n));
}

void DeviceModel::Upload(const std::vector<float>& host, DeviceArray<float>* dst) {
  if (dst->size() < host.size()) *dst = DeviceArray<float>(backend_, host.size());
  backend_->CopyToDevice(dst->data(), host.data(), sizeof(float) * host.size());
}

void DeviceModel::Stretch(int64_t start_ns) {
  if (speed_ >= 1.0 || speed_ <= 0.0) return;
  const int64_t now = MonotonicNanos();
  stretch_debt_ns_ += static_cast<int64_t>((now - start_ns) * (1.0 / speed_ - 1.0));
  // Sleeps shorter than this are owed to a later segment (timer slack).
  constexpr int64_t kMinSleepNs = 50000;
  if (stretch_debt_ns_ < kMinSleepNs) return;
  timespec ts{static_cast<time_t>(stretch_debt_ns_ / 1000000000),
              static_cast<long>(stretch_debt_ns_ % 1000000000)};
  ::nanosleep(&ts, nullptr);
  stretch_debt_ns_ -= MonotonicNanos() - now;
}

void DeviceModel::Embed(const StepBatch& b) {
  const int H = config_.hidden_size;
  const int cs = plan_.shape.vocab_chunk_size;
  const int T = b.num_tokens();
  backend_->SetZero(x_.data(), sizeof(float) * static_cast<size_t>(T) * H);
  // Each held segment of chunks gives the rows of its tokens.
  for (const auto& seg : embed_.segments()) {
    host_rows_.clear();
    host_dst_rows_.clear();
    for (int t = 0; t < T; ++t) {
      const int chunk = b.tokens[t] / cs;
      if (chunk < seg.first || chunk >= seg.first + seg.count) continue;
      host_rows_.push_back((chunk - seg.first) * cs + b.tokens[t] % cs);
      host_dst_rows_.push_back(t);
    }
    if (host_rows_.empty()) continue;
    backend_->GatherWeightRows(embed_.Weights(seg), seg.count * cs, H, host_rows_.data(),
                               host_dst_rows_.data(), static_cast<int>(host_rows_.size()),
                               x_.data(), H);
  }
}

void DeviceModel::RunHeads(const AttentionWeights& w, int layer, const StepBatch& b,
                           const HeadRows& hr, float* q, float* kv, float* attn,
                           ForwardStats* stats) {
  const int hd = config_.head_dim, g = config_.group_size(), H = config_.hidden_size;
  const int bs = kv_.block_size();
  const int n_q = w.q.num_items(), n_kv = w.kv.num_items();
  const int64_t ld_q = static_cast<int64_t>(n_q) * hd;
  const int64_t ld_kv = static_cast<int64_t>(n_kv) * 2 * hd;
  // 1) q, k, v: one GEMM per segment of consecutive query heads or head groups.
  int k0 = 0;
  for (const auto& seg : w.q.segments()) {
    backend_->LinearNT(hr.in, H, w.q.Weights(seg), q + static_cast<int64_t>(k0) * hd, ld_q, hr.rows,
                       seg.count * hd, H, false);
    k0 += seg.count;
  }
  k0 = 0;
  for (const auto& seg : w.kv.segments()) {
    backend_->LinearNT(hr.in, H, w.kv.Weights(seg), kv + static_cast<int64_t>(k0) * 2 * hd, ld_kv,
                       hr.rows, seg.count * 2 * hd, H, false);
    k0 += seg.count;
  }
  stats->attention_flops += 2.0 * hr.rows * H * (ld_q + ld_kv);
  const LayerWeights& lw = layers_[layer];
  if (config_.qkv_bias()) {
    // Each segment's columns (items of `width`) take its items' biases.
    auto add_bias = [&](const ItemMatrix& m, float* y, int64_t ld, const DeviceArray<float>& bias,
                        int width) {
      int64_t col = 0;
      for (const auto& seg : m.segments()) {
        backend_->AddBias(y + col, ld, bias.data() + static_cast<int64_t>(seg.first) * width,
                          hr.rows, seg.count * width);
        col += static_cast<int64_t>(seg.count) * width;
      }
    };
    add_bias(w.q, q, ld_q, lw.q_bias, hd);
    add_bias(w.kv, kv, ld_kv, lw.kv_bias, 2 * hd);
  }
  if (config_.qk_norm()) {
    // Every query head, and the key of every group (heads 2 * hd apart),
    // normalised in place: rows of hd at a uniform stride.
    const float eps = static_cast<float>(config_.rms_norm_eps);
    backend_->RmsNorm(q, hd, lw.q_norm.data(), q, hd, hr.rows * n_q, hd, eps);
    backend_->RmsNorm(kv, 2 * hd, lw.k_norm.data(), kv, 2 * hd, hr.rows * n_kv, hd, eps);
  }
  // 2) RoPE on the query heads and on the key of each group.
  const float* rope =
      config_.LocalRope(layer) ? rope_table_local_device_.data() : rope_table_device_.data();
  // Each group's key: heads 2 * hd apart (its value between).
  backend_->RopeQK(q, ld_q, hd, n_q, kv, ld_kv, 2 * hd, n_kv, hr.positions, hr.rows, hd, rope);
  // The query heads of each held group are adjacent in q (both ascending):
  // group k's are [first[k], first[k] + count[k]).
  const std::vector<int> groups = w.kv.items(), queries = w.q.items();
  std::vector<int> first(n_kv, 0), count(n_kv, 0);
  for (int i = 0, k = 0; i < n_q; ++i) {
    while (k < n_kv && groups[k] < queries[i] / g) ++k;
    FS_CHECK_MSG(k < n_kv && groups[k] == queries[i] / g, "query head {} without its KV head",
                 queries[i]);
    if (count[k]++ == 0) first[k] = i;
  }
  // 3) Attention problems, each storing its tokens' K and V into the cache
  // first (a group held without query heads only stores).
  problems_.clear();
  const float scale = config_.AttentionScale();
  const float softcap = static_cast<float>(config_.attn_softcap);
  const int window = config_.LayerWindow(layer);
  for (auto [si, row0] : hr.seqs) {
    const StepSeq& s = b.seqs[si];
    for (int k = 0; k < n_kv; ++k) {
      const int slot = kv_.Slot(layer, groups[k]);
      FS_CHECK_MSG(kv_.NumBlocks(s.seq_id, slot) * bs >= s.start_pos + s.num_tokens,
                   "sequence {}: its table does not cover position {}", s.seq_id,
                   s.start_pos + s.num_tokens - 1);
      AttentionArgs a;
      a.new_kv = kv + static_cast<int64_t>(row0) * ld_kv + static_cast<int64_t>(k) * 2 * hd;
      a.ld_new_kv = ld_kv;
      a.q = q + static_cast<int64_t>(row0) * ld_q + static_cast<int64_t>(first[k]) * hd;
      a.ldq = ld_q;
      a.out = attn + static_cast<int64_t>(row0) * ld_q + static_cast<int64_t>(first[k]) * hd;
      a.ldo = ld_q;
      a.num_tokens = s.num_tokens;
      a.start_pos = s.start_pos;
      a.group_size = count[k];
      a.head_dim = hd;
      a.pages = kv_.Pages(s.seq_id, slot);
      a.kv_dtype = kv_.kv_dtype();
      a.block_size = bs;
      a.sliding_window = window;
      a.scale = scale;
      a.softcap = softcap;
      problems_.push_back(a);
      // Attention core: scores and weighted values, 2 * 2 * hd per (query head, key).
      for (int i = 0; i < s.num_tokens; ++i) {
        const int p = s.start_pos + i;
        const int ctx = window > 0 ? std::min(p + 1, window) : p + 1;
        stats->attention_flops += 4.0 * count[k] * hd * ctx;
      }
    }
  }
  backend_->Attention(problems_);
}

void DeviceModel::OProjection(const AttentionWeights& w, const float* attn, int rows, int64_t* out,
                              ForwardStats* stats) {
  const int hd = config_.head_dim, H = config_.hidden_size;
  const int64_t ld_attn = static_cast<int64_t>(w.q.num_items()) * hd;
  int k0 = 0;
  for (const auto& seg : w.o.segments()) {
    // One exact partial sum per query head: the same whichever device holds
    // which query heads of a replicated head group.
    backend_->LinearNNFixed(attn + static_cast<int64_t>(k0) * hd, ld_attn, w.o.Weights(seg), out, H,
                            rows, H, seg.count * hd, hd);
    k0 += seg.count;
  }
  stats->attention_flops += 2.0 * rows * ld_attn * H;
}

void DeviceModel::AttentionPartial(int layer, const StepBatch& b, ForwardStats* stats) {
  const LayerWeights& lw = layers_[layer];
  const int T = b.num_tokens(), H = config_.hidden_size;
  const int hd = config_.head_dim;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  float* h = h_.Reserve(static_cast<size_t>(T) * H);
  int64_t* partial = partial_.Reserve(static_cast<size_t>(T) * H);
  if (!std::exchange(residual_normed_, false)) {
    backend_->SetZero(partial, sizeof(int64_t) * static_cast<size_t>(T) * H);
    backend_->RmsNorm(x_.data(), H, lw.attn_norm.data(), h, H, T, H, eps);
  }

  // TP head groups: every token.
  const int n_tp = lw.tp.q.num_items();
  if (lw.tp.kv.num_items() > 0) {
    HeadRows hr;
    hr.in = h;
    hr.rows = T;
    hr.positions = positions_.data();
    for (size_t i = 0; i < b.seqs.size(); ++i)
      hr.seqs.emplace_back(static_cast<int>(i), b.seqs[i].token_offset);
    float* q = q_.Reserve(static_cast<size_t>(T) * n_tp * hd);
    float* kv = kv_proj_.Reserve(static_cast<size_t>(T) * lw.tp.kv.num_items() * 2 * hd);
    float* attn = attn_.Reserve(static_cast<size_t>(T) * n_tp * hd);
    RunHeads(lw.tp, layer, b, hr, q, kv, attn, stats);
  }
  if (n_tp > 0) OProjection(lw.tp, attn_.data(), T, partial, stats);

  // DP head groups: only tokens of sequences whose DP rank is this device.
  const int n_dp = lw.dp.q.num_items();
  if (n_dp == 0) return;
  HeadRows hr;
  host_rows_.clear();  // the batch's token of each DP row
  host_dp_positions_.clear();
  for (size_t i = 0; i < b.seqs.size(); ++i) {
    const StepSeq& s = b.seqs[i];
    if (s.dp_rank != device_) continue;
    hr.seqs.emplace_back(static_cast<int>(i), static_cast<int>(host_rows_.size()));
    for (int t = 0; t < s.num_tokens; ++t) {
      host_rows_.push_back(s.token_offset + t);
      host_dp_positions_.push_back(host_positions_[s.token_offset + t]);
    }
  }
  const int rows = static_cast<int>(host_rows_.size());
  if (rows == 0) return;
  float* in = dp_in_.Reserve(static_cast<size_t>(rows) * H);
  backend_->GatherRows(h, H, host_rows_.data(), rows, H, in, H);
  int32_t* dpos = dp_positions_.Reserve(rows);
  backend_->CopyToDevice(dpos, host_dp_positions_.data(), sizeof(int32_t) * rows);
  hr.in = in;
  hr.rows = rows;
  hr.positions = dpos;
  float* q = dp_q_.Reserve(static_cast<size_t>(rows) * n_dp * hd);
  float* kv = dp_kv_proj_.Reserve(static_cast<size_t>(rows) * lw.dp.kv.num_items() * 2 * hd);
  float* attn = dp_attn_.Reserve(static_cast<size_t>(rows) * n_dp * hd);
  RunHeads(lw.dp, layer, b, hr, q, kv, attn, stats);
  int64_t* out = dp_out_.Reserve(static_cast<size_t>(rows) * H);
  backend_->SetZero(out, sizeof(int64_t) * static_cast<size_t>(rows) * H);
  OProjection(lw.dp, attn, rows, out, stats);
  backend_->ScatterAddFixed(out, H, host_rows_.data(), rows, H, partial, H);
}

void DeviceModel::FfnOnRows(const LayerWeights& lw, int first, int end, const float* in, int rows,
                            const float* row_scale, int64_t* out, bool out_clear,
                            ForwardStats* stats) {
  const int H = config_.hidden_size;
  const int w = plan_.shape.shard_width;
  if (!out_clear) backend_->SetZero(out, sizeof(int64_t) * static_cast<size_t>(rows) * H);
  const auto& down_segs = lw.ffn_down.segments();
  const auto& gu_segs = lw.ffn_gate_up.segments();
  FS_CHECK(down_segs.size() == gu_segs.size());
  for (size_t si = 0; si < gu_segs.size(); ++si) {
    const auto& seg = gu_segs[si];
    FS_CHECK(down_segs[si].first == seg.first && down_segs[si].count == seg.count);
    const int e = plan_.shape.ShardExpert(seg.first);
    if (e < first || e >= end) continue;
    const int cols = seg.count * 2 * w;
    float* gu = gu_.Reserve(static_cast<size_t>(rows) * cols);
    float* act = act_.Reserve(static_cast<size_t>(rows) * seg.count * w);
    backend_->LinearNT(in, H, lw.ffn_gate_up.Weights(seg), gu, cols, rows, cols, H, false);
    if (config_.gemma()) {
      backend_->GeluTanhMul(gu, cols, act, seg.count * w, rows, w, seg.count);
    } else {
      backend_->SiluMul(gu, cols, act, seg.count * w, rows, w, seg.count);
    }
    if (row_scale) backend_->ScaleRows(act, seg.count * w, row_scale, rows, seg.count * w);
    // One exact partial sum per FFN shard.
    backend_->LinearNNFixed(act, seg.count * w, lw.ffn_down.Weights(down_segs[si]), out, H, rows, H,
                            seg.count * w, w);
    stats->ffn_flops += 2.0 * rows * H * 3.0 * seg.count * w;
  }
}

void DeviceModel::FfnPartial(int layer, int num_tokens, ForwardStats* stats) {
  const LayerWeights& lw = layers_[layer];
  const int T = num_tokens, H = config_.hidden_size;
  float* h = h_.data();
  int64_t* partial = partial_.data();
  // Normed by the residual add before, with the sums cleared.
  const bool partial_clear = std::exchange(residual_normed_, false);
  if (!partial_clear) {
    backend_->RmsNorm(x_.data(), H, lw.ffn_norm.data(), h, H, T, H,
                      static_cast<float>(config_.rms_norm_eps));
  }
  if (!config_.is_moe()) {
    FfnOnRows(lw, 0, 1, h, T, nullptr, partial, partial_clear, stats);
    return;
  }
  // Mixtral: every device routes every token (same inputs, same result), then
  // computes its shards of each chosen expert on that expert's tokens.
  // Qwen2-MoE's shared expert is slots past the routed ones that every token
  // takes, scaled by sigmoid(shared_expert_gate . h): all its held shards in
  // one pass over every row, straight into the partial sums.
  const int E = config_.num_experts, k = config_.experts_per_token;
  float* logits = router_logits_.Reserve(static_cast<size_t>(T) * E);
  backend_->LinearNT(h, H, lw.router.data(), logits, E, T, E, H, false);
  stats->ffn_flops += 2.0 * T * H * E;
  int32_t* ids = gate_ids_.Reserve(static_cast<size_t>(T) * k);
  float* weights = gate_w_.Reserve(static_cast<size_t>(T) * k);
  backend_->MoeGate(logits, T, E, k, config_.renormalize_topk, ids, weights);
  // The routing decides which rows each expert takes: read it on the host.
  host_gate_ids_.resize(static_cast<size_t>(T) * k);
  host_gate_w_.resize(static_cast<size_t>(T) * k);
  backend_->CopyToHost(host_gate_ids_.data(), ids, sizeof(int32_t) * host_gate_ids_.size());
  backend_->CopyToHost(host_gate_w_.data(), weights, sizeof(float) * host_gate_w_.size());
  const int slots = plan_.shape.expert_slots;
  std::vector<bool> held(slots, false);
  for (const auto& seg : lw.ffn_gate_up.segments()) held[plan_.shape.ShardExpert(seg.first)] = true;
  if (std::find(held.begin() + E, held.end(), true) != held.end()) {
    float* shared = shared_logits_.Reserve(static_cast<size_t>(T));
    backend_->LinearNT(h, H, lw.shared_gate.data(), shared, 1, T, 1, H, false);
    stats->ffn_flops += 2.0 * T * H;
    host_row_scale_.resize(T);
    backend_->CopyToHost(host_row_scale_.data(), shared, sizeof(float) * T);
    for (float& g : host_row_scale_) g = 1.0f / (1.0f + std::exp(-g));
    FfnOnRows(lw, E, slots, h, T, host_row_scale_.data(), partial, partial_clear, stats);
  } else if (!partial_clear) {
    backend_->SetZero(partial, sizeof(int64_t) * static_cast<size_t>(T) * H);
  }
  for (int e = 0; e < E; ++e) {
    if (!held[e]) continue;
    host_rows_.clear();
    host_row_scale_.clear();
    for (int t = 0; t < T; ++t) {
      for (int j = 0; j < k; ++j) {
        if (host_gate_ids_[t * k + j] != e) continue;
        host_rows_.push_back(t);
        host_row_scale_.push_back(host_gate_w_[t * k + j]);
      }
    }
    const int rows = static_cast<int>(host_rows_.size());
    if (rows == 0) continue;
    float* in = expert_in_.Reserve(static_cast<size_t>(rows) * H);
    backend_->GatherRows(h, H, host_rows_.data(), rows, H, in, H);
    int64_t* out = expert_out_.Reserve(static_cast<size_t>(rows) * H);
    FfnOnRows(lw, e, e + 1, in, rows, host_row_scale_.data(), out, false, stats);
    backend_->ScatterAddFixed(out, H, host_rows_.data(), rows, H, partial, H);
  }
}

void DeviceModel::LmHead(const StepBatch& b, ForwardStats* stats) {
  const int H = config_.hidden_size;
  const int R = b.num_logits_rows;
  if (R == 0 || lm_head_.num_items() == 0) return;
  // Each sequence's last tokens, at its logits rows (a row no sequence names
  // takes token 0: its logits are never read).
  host_rows_.assign(R, 0);
  for (const StepSeq& s : b.seqs) {
    if (s.logits_row < 0) continue;
    for (int k = 0; k < s.logits_rows; ++k)
      host_rows_[s.logits_row + k] = s.token_offset + s.num_tokens - s.logits_rows + k;
  }
  float* last = lm_in_.Reserve(static_cast<size_t>(R) * H);
  backend_->GatherRows(x_.data(), H, host_rows_.data(), R, H, last, H);
  float* h = h_.Reserve(static_cast<size_t>(R) * H);
  backend_->RmsNorm(last, H, final_norm_.data(), h, H, R, H,
                    static_cast<float>(config_.rms_norm_eps));
  const int cs = plan_.shape.vocab_chunk_size;
  // Each segment's columns side by side in lm_out_ [R, held chunks * cs].
  const int64_t ld = static_cast<int64_t>(lm_head_.num_items()) * cs;
  float* out = lm_out_.Reserve(static_cast<size_t>(R) * ld);
  int64_t col = 0;
  for (const auto& seg : lm_head_.segments()) {
    const int cols = seg.count * cs;
    backend_->LinearNT(h, H, lm_head_.Weights(seg), out + col, ld, R, cols, H, false);
    col += cols;
    stats->other_flops += 2.0 * R * H * cols;
  }
  if (config_.final_softcap > 0)
    backend_->Softcap(out, static_cast<int64_t>(R) * ld, static_cast<float>(config_.final_softcap));
}

void DeviceModel::CopyLogits(const StepBatch& b, float* logits) {
  const int V = config_.vocab_size, R = b.num_logits_rows;
  if (R == 0 || lm_head_.num_items() == 0) return;
  const PlanShape& shape = plan_.shape;
  const int cs = shape.vocab_chunk_size;
  const int64_t ld = static_cast<int64_t>(lm_head_.num_items()) * cs;
  int64_t col = 0;
  for (const auto& seg : lm_head_.segments()) {
    const int begin = shape.ChunkBegin(seg.first);
    const int end = shape.ChunkEnd(seg.first + seg.count - 1);
    backend_->CopyToHost2D(logits + begin, sizeof(float) * V, lm_out_.data() + col,
                           sizeof(float) * ld, sizeof(float) * (end - begin), R);
    col += static_cast<int64_t>(seg.count) * cs;
  }
}

std::optional<std::pair<uint64_t, size_t>> DeviceModel::GraphKey(const StepBatch& b,
                                                                 const Communicator& comm) const {
  // A step of one device, dense, every sequence decoding one token: its
  // calls repeat with the same shapes while the batch keeps its sequences
  // and their contexts stay within the same runs of 64 pages.
  if (comm.size() != 1 || config_.is_moe() || b.seqs.empty()) return std::nullopt;
  constexpr int kPageRun = 64;
  const int bs = kv_.block_size();
  uint64_t key = HashCombine(graph_epoch_, rope_rows_device_);
  key = HashCombine(key, HashCombine(b.num_tokens(), b.num_logits_rows));
  // How many of the step's tokens each held embedding segment gives.
  const int cs = plan_.shape.vocab_chunk_size;
  for (const auto& seg : embed_.segments()) {
    int rows = 0;
    for (int32_t t : b.tokens) rows += t / cs >= seg.first && t / cs < seg.first + seg.count;
    key = HashCombine(key, rows);
  }
  size_t bytes = 0;
  for (const StepSeq& s : b.seqs) {
    if (s.num_tokens != 1) return std::nullopt;
    const int pages = (s.start_pos + s.num_tokens + bs - 1) / bs;
    const int runs = (pages + kPageRun - 1) / kPageRun;
    key = HashCombine(key, HashCombine(HashCombine(s.token_offset, s.logits_row + s.logits_rows),
                                       HashCombine(runs, s.dp_rank == device_)));
    // Its page tables and attention problems, the largest arguments.
    bytes += KvSlots(s.dp_rank).size() * (static_cast<size_t>(runs) * kPageRun * 8 + 128);
  }
  return std::make_pair(key, bytes);
}

}  // namespace failsafe
