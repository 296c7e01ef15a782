#include <algorithm>

#include "comm/communicator.h"
#include "common/clock.h"
#include "engine/executor.h"
#include "engine/kv_tables.h"
#include "engine/local_executor.h"
#include "engine/worker_group.h"
#include "placement/plan_stats.h"

namespace failsafe {

Result<std::unique_ptr<LocalExecutor>> LocalExecutor::Create(const std::string& model_dir,
                                                             const LocalExecutorOptions& options) {
  auto e = std::unique_ptr<LocalExecutor>(new LocalExecutor());
  FS_ASSIGN_OR_RETURN(e->config_, ModelConfig::Load(model_dir));
  FS_ASSIGN_OR_RETURN(e->host_, WeightStore::Open(model_dir, e->config_));
  FS_ASSIGN_OR_RETURN(Plan plan, MakePlan(e->config_, Policy::kNonUniform, 1, {0}));
  CpuBackendOptions bo;
  bo.threads = options.threads;
  bo.isa = options.isa;
  bo.dpbf16 = options.dpbf16;
  if (options.gpu >= 0) {
    CudaBackendOptions co;
    co.gpu = options.gpu;
    co.gemm = options.gpu_gemm;
    co.graphs = options.gpu_graphs;
    co.dependent_launch = options.gpu_dependent_launch;
    co.attention = options.gpu_attention;
    FS_ASSIGN_OR_RETURN(e->backend_, MakeCudaBackend(co));
  } else {
    e->backend_ = MakeCpuBackend(bo);
  }
  if (options.wrap_backend) e->backend_ = options.wrap_backend(std::move(e->backend_));
  DeviceOptions d;
  d.block_size = options.block_size;
  d.kv_dtype = options.kv_dtype.value_or(DefaultKvDtype(e->host_->MatrixDType()));
  const int64_t slots = static_cast<int64_t>(e->config_.num_layers) * e->config_.num_kv_heads;
  d.kv_pages = options.kv_pages > 0 ? options.kv_pages : slots * (65536 / options.block_size);
  if (options.kv_pages == 0 && options.device_memory_bytes > 0) {
    // As a device process's budget: what the weights and the step's
    // activations leave.
    FS_ASSIGN_OR_RETURN(
        std::vector<int64_t> pages,
        KvPagesWithinBudget(plan, e->config_, options.device_memory_bytes,
                            ActivationReserveBytes(e->config_, options.max_step_tokens),
                            KvPageBytes(e->config_, options.block_size, d.kv_dtype)));
    d.kv_pages = pages[0];
  }
  e->device_ = std::make_unique<DeviceModel>(e->config_, 0, e->backend_.get(), d);
  FS_RETURN_IF_ERROR(e->device_->LoadShare(plan, *e->host_));
  return e;
}

Result<StepOutput> LocalExecutor::Step(const StepBatch& batch, StepTiming* timing) {
  LocalCommunicator comm;
  ForwardStats stats;
  int64_t t0 = MonotonicNanos();
  const size_t need = static_cast<size_t>(batch.num_logits_rows) * config_.vocab_size;
  if (logits_.size() < need) logits_.resize(need);
  Status st = device_->Forward(batch, comm, logits_.data(), &stats);
  if (timing) {
    *timing = StepTiming();
    timing->wall_ns = MonotonicNanos() - t0;
    int64_t compute = 0;
    for (int64_t ns : stats.segment_wall_ns) compute += ns;
    timing->emulated_ns = compute;
    timing->devices = {0};
    timing->device_compute_ns = {compute};
    timing->device_compute_wall_ns = {compute};
    timing->device_attention_flops = {stats.attention_flops};
    timing->device_ffn_flops = {stats.ffn_flops};
    timing->device_kv_bytes = {stats.kv_bytes};
    timing->segment_max_ns = stats.segment_wall_ns;
  }
  FS_RETURN_IF_ERROR(st);
  return StepOutput{logits_.data(), nullptr};
}

Status LocalExecutor::FreeSeqs(const std::vector<int64_t>& seq_ids) {
  for (int64_t id : seq_ids) device_->FreeSeq(id);
  return Status::Ok();
}

Result<GenerateResult> GenerateOne(Executor& exec, Backend& sampler, const std::vector<int>& prompt,
                                   const GenerateOptions& o) {
  const ModelConfig& c = exec.config();
  if (prompt.empty()) return InvalidArgument("the prompt is empty");
  if (static_cast<int64_t>(prompt.size()) + o.max_tokens > c.max_position_embeddings) {
    return OutOfRange("prompt ({} tokens) plus max tokens ({}) exceed the model's context of {}",
                      prompt.size(), o.max_tokens, c.max_position_embeddings);
  }
  GenerateResult r;
  std::vector<int> seq = prompt;
  int done = 0;  // tokens whose KV is written
  Status st;
  // The sequence's KV pages, owned here as the scheduler owns them in the engine.
  DirectKvTables tables(exec.plan(), exec.block_size(), exec.kv_capacity_pages());
  while (static_cast<int>(r.output_ids.size()) < o.max_tokens) {
    const int remaining = static_cast<int>(seq.size()) - done;
    const int n = std::min(remaining, std::max(1, o.prefill_chunk));
    StepBatch b;
    StepSeq s;
    s.seq_id = o.seq_id;
    s.start_pos = done;
    s.num_tokens = n;
    s.dp_rank = exec.plan().active.front();
    s.token_offset = 0;
    const bool last = done + n == static_cast<int>(seq.size());
    const bool want_logits = last || o.record_logits;
    s.logits_row = want_logits ? 0 : -1;
    b.seqs.push_back(s);
    b.tokens.assign(seq.begin() + done, seq.begin() + done + n);
    b.num_logits_rows = want_logits ? 1 : 0;
    if (st = tables.Fill(&b); !st.ok()) break;
    auto logits = exec.Step(b, nullptr);
    if (!logits.ok()) {
      st = logits.status();
      break;
    }
    done += n;
    if (o.record_logits) {
      r.logits.emplace_back(logits->logits, logits->logits + c.vocab_size);
      r.logits_positions.push_back(done - 1);
    }
    if (!last) continue;
    int tok =
        sampler.Sample(logits->logits, c.vocab_size, o.sampling, static_cast<uint64_t>(seq.size()));
    r.output_ids.push_back(tok);
    seq.push_back(tok);
    if (std::find(o.stop_token_ids.begin(), o.stop_token_ids.end(), tok) != o.stop_token_ids.end())
      break;
  }
  Status freed = exec.FreeSeq(o.seq_id);
  FS_RETURN_IF_ERROR(st);
  FS_RETURN_IF_ERROR(freed);
  return r;
}

}  // namespace failsafe
