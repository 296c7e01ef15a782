// A device's share of the model: its weight slices, its KV cache, and the
// forward pass over its shard.
//
// In a step, a device computes its TP head groups for every token and its DP
// head groups only for tokens of sequences whose DP rank it is; both feed one
// o-projection partial sum, reduced by the single all-reduce that tensor
// parallelism already needs. A TP head group may be replicated: then the
// device computes its K/V and caches them like every other holder, but only
// its own part of the group's query heads, so each query head's o-projection
// term is added once. FFN shards and vocabulary chunks work the same way
// (partial sums; logits columns written in place).
//
// Thread-safety: one thread (the device's compute thread) calls everything.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "comm/communicator.h"
#include "common/status.h"
#include "model/config.h"
#include "model/weights.h"
#include "placement/plan.h"
#include "placement/replan.h"
#include "worker/backup_writer.h"
#include "worker/device_group_reducer.h"
#include "worker/item_matrix.h"
#include "worker/kv_cache.h"
#include "worker/peer_reducer.h"
#include "worker/step.h"

namespace failsafe {

// Reads items of a device's share from the host copy of the weights, in the
// device's layout.
class HostLoader {
 public:
  HostLoader(const ModelConfig& config, const PlanShape& shape, const WeightStore& host);
  // Query head q (head group q / G): q rows [head_dim, hidden].
  void Query(int layer, int q, float* dst) const;
  // Head group: k rows then v rows [2 * head_dim, hidden].
  void Kv(int layer, int head, float* dst) const;
  // Query head q: its o columns, transposed [head_dim, hidden].
  void O(int layer, int q, float* dst) const;
  // Rows [row_begin, row_end) of the head group flattened as q, k, v rows then o^T rows.
  void HeadRows(int layer, int head, int row_begin, int row_end, float* dst) const;
  void GateUp(int layer, int shard, float* dst) const;    // [2 * width, hidden]
  void Down(int layer, int shard, float* dst) const;      // [width, hidden]
  void Vocab(bool lm_head, int chunk, float* dst) const;  // [chunk_size, hidden], zero-padded
  // The same items' elements as the checkpoint stores them, where its
  // tensors are of type dt (false where not: ItemMatrix::RawSource): q, k/v,
  // gate/up and vocabulary items as their rows; o and down items as the
  // run of their columns in each of the tensor's rows (their transposes).
  bool CopyQuery(int layer, int q, DType dt, unsigned char* dst) const;
  bool CopyKv(int layer, int head, DType dt, unsigned char* dst) const;
  bool CopyO(int layer, int q, DType dt, unsigned char* dst) const;
  bool CopyGateUp(int layer, int shard, DType dt, unsigned char* dst) const;
  bool CopyDown(int layer, int shard, DType dt, unsigned char* dst) const;
  bool CopyVocab(bool lm_head, int chunk, DType dt, unsigned char* dst) const;

 private:
  // Rows [row, row + n) of a projection (its own tensor or a fused one's run).
  void Read(const tensor_names::Rows& rows, int64_t row, int64_t n, float* dst) const;
  bool Copy(const tensor_names::Rows& rows, int64_t row, int64_t n, DType dt,
            unsigned char* dst) const;
  // An FFN shard's expert (-1 in a dense model) and its first row (gate,
  // up) or column (down) in that expert's projections.
  int Expert(int shard) const;
  int64_t ShardOffset(int shard) const;

  const ModelConfig& c_;
  const PlanShape& shape_;
  const WeightStore& host_;
};

// Runs of consecutive ids in an ascending list, as (first, count); a run also
// breaks at multiples of `break_every` (> 0).
std::vector<std::pair<int, int>> ItemRuns(const std::vector<int>& ids, int break_every);

struct DeviceOptions {
  int block_size = 16;           // tokens per KV page
  int64_t kv_pages = 0;          // KV pool size in pages
  DType kv_dtype = DType::kF32;  // of the KV pages: f32 or bf16 (KvCache)
  // All-reduces from device memory: by the device library where every
  // member is on a device of its own (DeviceGroupReducer: NCCL between
  // GPUs), else reading the other members' device memory where every member
  // can map it (PeerReducer: CUDA's virtual memory API or IPC on one GPU);
  // else, and by default, device memory that is not host memory stages
  // through the host.
  bool peer_collectives = false;
};

// Attention weights of a set of head groups (or parts of them), held per
// item: a query head (q rows, o columns) or a head group (k and v rows). The
// o items are always the q items.
struct AttentionWeights {
  ItemMatrix q;   // per query head: [head_dim, hidden]
  ItemMatrix kv;  // per head group: k rows then v rows [2 * head_dim, hidden]
  ItemMatrix o;   // per query head: o^T rows [head_dim, hidden]
  int64_t bytes() const { return q.bytes() + kv.bytes() + o.bytes(); }
};

class DeviceModel {
 public:
  DeviceModel(const ModelConfig& config, int device_id, Backend* backend,
              const DeviceOptions& options);

  int device_id() const { return device_; }
  const ModelConfig& config() const { return config_; }
  const Plan& plan() const { return plan_; }
  KvCache& kv() { return kv_; }
  // Whether the last group's all-reduces go from device memory
  // (DeviceOptions::peer_collectives, where every member could take part).
  bool peer_collectives_ready() const {
    return (group_ && group_->ready()) || (peer_ && peer_->ready());
  }
  const KvCache& kv() const { return kv_; }
  int64_t weight_bytes() const;

  // Loads the device's share of `plan` from the host weights, replacing
  // whatever it held.
  Status LoadShare(const Plan& plan, const WeightStore& host);

  // Sets up what the device's collectives need once per group (the device
  // library's group, DeviceOptions::peer_collectives): every member of
  // `comm` calls it as it joins, before the group's first step.
  Status PrepareCollectives(Communicator& comm);

  // Runs one step. Every active device of the plan must call it with the same
  // batch. Writes logits [batch.num_logits_rows, vocab_size] for the
  // vocabulary chunks this device holds (other columns untouched).
  Status Forward(const StepBatch& batch, Communicator& comm, float* logits, ForwardStats* stats);

  void FreeSeq(int64_t seq) { kv_.FreeSeq(seq); }

  // Runs this device at `speed` (0, 1] of its speed, as a throttled or
  // down-clocked accelerator would: each compute segment of a step (never a
  // wait in a collective) is stretched to 1/speed of its wall time by
  // sleeping at its end. 1: full speed. Fault injection for slow-device
  // benchmarks and tests.
  void SetComputeSpeed(double speed) { speed_ = speed; }

  // Backs up the KV of every step into the host region (base, layout) through
  // `writer` (owned by the caller, outliving this device).
  void SetBackup(BackupWriter* writer, const BackupLayout& layout, void* base);
  // Waits until the backup has caught up with every finished step.
  void DrainBackup();

  // Moves from `prev` to `next` (both global plans): keeps what the device
  // holds and still needs, drops the rest, loads what it gains (from the host,
  // or for new DP heads in pieces exchanged through `comm`), and restores the
  // KV of gained slots from the host backup. `seqs` lists every live sequence
  // with its new block table on this device; the device forgets any other.
  // A slot kept in place must already hold the blocks up to restore_tokens in
  // the pages its new table names (else the tables are out of step: an
  // error; with kFull the weights have moved meanwhile). With kFull the KV
  // is restored from a second thread while the weights move (the new plan's
  // KV slots are known before any weight is; on a GPU the restore's copies
  // go on a stream of their own). With
  // `mode` other than kFull it reloads its whole share, then rebuilds all its
  // KV (restore_tokens may be 0: recompute).
  Status ApplyPlan(const Plan& prev, const Plan& next, RecoveryMode mode, const WeightStore& host,
                   Communicator& comm, const std::vector<SeqRestore>& seqs, ApplyStats* stats);

 private:
  // Sleeps so that a compute segment that ran from `start_ns` takes 1/speed_
  // of its time (no-op at full speed); owes sub-tick remainders to later
  // segments.
  void Stretch(int64_t start_ns);

  double speed_ = 1.0;           // SetComputeSpeed
  int64_t stretch_debt_ns_ = 0;  // sleep owed, not yet slept
  // Weights and activations are in the backend's device memory.
  struct LayerWeights {
    DeviceArray<float> attn_norm, ffn_norm;  // [hidden]
    AttentionWeights tp;             // TP head groups (or this device's part of replicated ones)
    AttentionWeights dp;             // DP head groups, every query head
    ItemMatrix ffn_gate_up;          // per shard: gate rows then up rows [2 * width, hidden]
    ItemMatrix ffn_down;             // per shard: down^T rows [width, hidden]
    DeviceArray<float> router;       // MoE: [experts, hidden]
    DeviceArray<float> shared_gate;  // Qwen2-MoE's shared expert gate: [1, hidden]
    // Replicated on every device (a few head widths): Qwen2's biases, by
    // query head [heads][hd] and by head group [kv heads][k hd, v hd] as the
    // kv items lie; Qwen3's query and key norms [hd].
    DeviceArray<float> q_bias, kv_bias, q_norm, k_norm;
    DeviceArray<float> attn_out_norm, ffn_out_norm;  // Gemma's sandwich norms [hidden]
  };

  // Rows of one attention computation: all tokens (TP heads) or the tokens of
  // the sequences whose DP rank this device is (DP heads).
  struct HeadRows {
    const float* in = nullptr;  // device: [rows, hidden], normalised
    int rows = 0;
    const int32_t* positions = nullptr;     // device: [rows]
    std::vector<std::pair<int, int>> seqs;  // (index in the batch, first row)
  };

  // Forward pieces; each ends before its collective.
  void Embed(const StepBatch& b);
  void AttentionPartial(int layer, const StepBatch& b, ForwardStats* stats);
  void FfnPartial(int layer, int num_tokens, ForwardStats* stats);
  // The logits of the held vocabulary chunks into lm_out_ (device), then
  // their columns into the host's rows [num_logits_rows, vocab_size].
  void LmHead(const StepBatch& b, ForwardStats* stats);
  void CopyLogits(const StepBatch& b, float* logits);
  // The key a step runs as a graph under (Backend::BeginGraph) and the bytes
  // of arguments it uploads, or none where the step cannot be a graph.
  std::optional<std::pair<uint64_t, size_t>> GraphKey(const StepBatch& b,
                                                      const Communicator& comm) const;
  // Projections, RoPE, KV writes and attention of the held heads of `w`:
  // q [rows, queries * head_dim], kv [rows, groups * 2 * head_dim] and attn
  // [rows, queries * head_dim] (the o-projection's input).
  void RunHeads(const AttentionWeights& w, int layer, const StepBatch& b, const HeadRows& hr,
                float* q, float* kv, float* attn, ForwardStats* stats);
  // attn [rows, queries * head_dim] times the held o columns, added into out
  // [rows, hidden] as exact fixed-point partial sums (one per query head).
  void OProjection(const AttentionWeights& w, const float* attn, int rows, int64_t* out,
                   ForwardStats* stats);
  // out[rows, hidden] = FFN of `in` over the held shards of expert slots
  // [first, end) (a dense FFN is slot 0), as exact fixed-point partial sums
  // (one per shard); each row's activations scaled by row_scale[row] (host;
  // nullptr: 1); out_clear: out is zero already.
  void FfnOnRows(const LayerWeights& lw, int first, int end, const float* in, int rows,
                 const float* row_scale, int64_t* out, bool out_clear, ForwardStats* stats);
  // Takes this device's new block-table entries and checks that every
  // sequence of the step has pages for the positions it writes; then copies
  // the step's host-tier hits into their pages (CopyHostHits).
  Status ApplyKvTables(const StepBatch& b);
  // Checks every host-tier hit of the step, then copies them.
  Status CopyHostHits(const StepBatch& b);
  // Adds to `batch` the copies of positions [0, rows) of (layer, head) of
  // one backup block into the sequence's page of `slot` at `block` (its K
  // rows, then its V rows). Returns the bytes they copy.
  int64_t CopyFromBackup(int64_t seq_id, int slot, int block, int32_t backup_block, int rows,
                         std::vector<DeviceMemory::HostCopy>& batch);
  // Makes a batch of CopyFromBackup's copies at once, complete on return:
  // a GPU waits once for them all, not once a page (a copy from the
  // backup's page-locked memory waits for the device). From the compute
  // thread, after its earlier work (a page may have been another
  // sequence's); else from a restore's own thread, into pages no kernel
  // touches meanwhile.
  void CopyBackupIn(const std::vector<DeviceMemory::HostCopy>& batch, bool compute_thread);
  // Plan::KvSlots of this device for a sequence with DP rank `dp_rank`.
  const std::vector<int>& KvSlots(int dp_rank) const {
    return dp_rank == device_ ? kv_slots_rank_ : kv_slots_tp_;
  }
  // A host vector into device memory.
  void Upload(const std::vector<float>& host, DeviceArray<float>* dst);
  // x += the step's summed partial_ (a layer's attention or FFN output);
  // Gemma: normalised by `out_norm` first. With `next_norm` (the norm that
  // reads x next, where it is not Gemma's), in one backend call with that
  // norm into h_, and partial_ cleared (residual_normed_).
  void AddToResidual(const DeviceArray<float>& out_norm, int num_tokens,
                     const DeviceArray<float>* next_norm);
  // Sums `n` elements of device memory over the group: from the members'
  // device memory where they map one another's (peer_), in place where
  // device memory is host memory, else through host staging; nothing to do
  // alone on a GPU.
  template <typename T>
  Status AllReduce(Communicator& comm, T* data, size_t n, std::vector<T>* staging);
  // Waits for the device library's all-reduces started this step (group_:
  // started, not waited for); their failure, if any.
  Status SettleCollectives(Communicator& comm);
  // Norms, routers and empty item matrices: a device holding nothing yet.
  void InitLayers(const Plan& plan, const WeightStore& host);
  void EnqueueBackup(const StepBatch& b);
  // Adds query heads (q and o) and head groups (k and v) from the host.
  void AddAttention(AttentionWeights* w, int layer, const std::vector<int>& queries,
                    const std::vector<int>& groups, const HostLoader& load);
  // Every query head of the given head groups.
  std::vector<int> QueriesOfGroups(const std::vector<int>& groups) const;
  // Which (layer, head group) slots of TP heads this device copies to the host
  // backup (a replicated group is copied by one holder only); from plan_.
  void UpdateBackupSlots();
  void AddShards(LayerWeights* lw, int layer, const std::vector<int>& shards,
                 const HostLoader& load);
  void AddChunks(const std::vector<int>& chunks, const HostLoader& load);
  Status GatherNewDpHeads(const Plan& prev, const Plan& next, const HostLoader& load,
                          Communicator& comm, ApplyStats* stats);
  // kFull's weights: keeps what the device holds and still needs under
  // `next` (heads changing role keep their rows), drops the rest, loads what
  // it gains.
  Status MoveWeights(const Plan& prev, const Plan& next, const WeightStore& host,
                     Communicator& comm, ApplyStats* stats);
  // Replaces every block table with the new plan's and restores the gained
  // slots (all of them unless `keep`) from the host backup; `background`: on
  // a thread other than the compute thread.
  Status RestoreKv(const std::vector<SeqRestore>& seqs, bool keep, ApplyStats* stats,
                   bool background = false);

  const ModelConfig config_;
  const int device_;
  Backend* const backend_;
  const DeviceOptions options_;
  const std::vector<float> inv_freq_;
  std::vector<float> rope_table_;         // host: ExtendRopeTable's, for every position seen
  DeviceArray<float> rope_table_device_;  // its copy the kernels read
  size_t rope_rows_device_ = 0;           // rows of rope_table_ in rope_table_device_
  // Sliding layers' own RoPE base (ModelConfig::LocalRope), as the above.
  const std::vector<float> inv_freq_local_;
  std::vector<float> rope_table_local_;
  DeviceArray<float> rope_table_local_device_;
  float embed_scale_ = 0;     // Gemma: sqrt(hidden) in the weights' type; 0: none
  uint64_t graph_epoch_ = 0;  // changes with the weights held: graphs of other epochs are stale
  Plan plan_;
  std::vector<LayerWeights> layers_;
  ItemMatrix embed_,
      lm_head_;  // per vocabulary chunk [chunk_size, hidden]; lm_head_ shares embed_ when tied
  DeviceArray<float> final_norm_;
  KvCache kv_;
  BackupWriter* backup_ = nullptr;
  BackupLayout backup_layout_;
  void* backup_base_ = nullptr;
  std::vector<char> backup_tp_slot_;  // [slot] -> this device writes the TP slot to the backup
  std::vector<int> kv_slots_tp_, kv_slots_rank_;  // from plan_ (UpdateBackupSlots)

  // Step scratch in device memory, [tokens, ...] unless noted.
  DeviceArray<float> x_, h_, q_, kv_proj_, attn_, dp_in_, dp_q_, dp_kv_proj_, dp_attn_;
  DeviceArray<float> out_;  // Gemma: a layer's attention or FFN output, normalised
  DeviceArray<float> gu_, act_, expert_in_, router_logits_, shared_logits_, gate_w_, lm_in_,
      lm_out_;
  // Fixed-point partial sums (common/fixed_point.h), [tokens, hidden].
  DeviceArray<int64_t> partial_, dp_out_, expert_out_;
  // Within a step: h_ holds the next norm of x_ and partial_ is zero, as
  // AddToResidual left them (the next attention or FFN takes them as they
  // are, once).
  bool residual_normed_ = false;
  DeviceArray<int32_t> positions_, gate_ids_, dp_positions_;
  // Host scratch: positions, index lists, a MoE step's routing, staging for
  // collectives when device memory is not host memory.
  std::vector<int32_t> host_positions_, host_dp_positions_, host_rows_, host_dst_rows_;
  std::vector<int32_t> host_gate_ids_;
  std::vector<float> host_gate_w_, host_row_scale_, host_stage_f32_;
  std::vector<int64_t> host_stage_fixed_;
  std::vector<AttentionArgs> problems_;
  std::unique_ptr<PeerReducer> peer_;  // DeviceOptions::peer_collectives
  // The same, first, by the device library (destroyed first: it aborts).
  std::unique_ptr<DeviceGroupReducer> group_;
};

}  // namespace failsafe
