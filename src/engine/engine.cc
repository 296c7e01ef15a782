#include "engine/engine.h"

#include "common/clock.h"
#include "common/log.h"
#include "engine/kv_backup.h"

namespace failsafe {

Engine::Engine(Executor* executor, const SchedulerConfig& config, const EngineOptions& options)
    : executor_(executor),
      options_(options),
      scheduler_(std::make_unique<Scheduler>(config, executor->plan(), executor->config(),
                                             executor->block_size(), executor->kv_capacity_pages(),
                                             options.speed)),
      sampler_(MakeCpuBackend(1)) {}

Result<int64_t> Engine::Submit(RequestSpec spec) {
  auto seq = std::make_unique<Sequence>();
  const int64_t id = next_id_;
  seq->id = id;
  seq->prompt_len = static_cast<int>(spec.prompt.size());
  seq->tokens = std::move(spec.prompt);
  seq->max_new_tokens = spec.max_new_tokens;
  seq->stop_token_ids = std::move(spec.stop_token_ids);
  seq->arrival = spec.arrival;
  FS_RETURN_IF_ERROR(scheduler_->Add(std::move(seq)));
  sampling_[id] = spec.sampling;
  ++next_id_;
  return id;
}

void Engine::Abort(int64_t id) { scheduler_->Abort(id, FinishReason::kAborted); }

void Engine::FailAll(const std::string& why) {
  std::vector<int64_t> ids;
  for (const Sequence* s : scheduler_->Running()) ids.push_back(s->id);
  for (int64_t id = 1; id < next_id_; ++id) {
    if (scheduler_->Find(id)) ids.push_back(id);
  }
  for (int64_t id : ids) scheduler_->Abort(id, FinishReason::kError);
  FS_LOG_ERROR("failing every request: {}", why);
}

// Frees sequences on the devices, then their backup blocks (a device's backup
// writer must not copy into a block that was handed to another sequence).
Status Engine::FreeSeqs(std::vector<int64_t> ids) {
  if (ids.empty()) return Status::Ok();
  FS_RETURN_IF_ERROR(executor_->FreeSeqs(ids));
  if (HostKvBackup* b = executor_->backup()) {
    for (int64_t id : ids) b->Release(id);
  }
  for (int64_t id : ids) recompute_target_.erase(id);
  return Status::Ok();
}

void Engine::CollectFinished(std::vector<TokenEvent>* events, bool only_abnormal) {
  for (auto& s : scheduler_->TakeFinished()) {
    to_free_.push_back(s->id);
    sampling_.erase(s->id);
    bool marked = false;
    for (auto& e : *events) {
      if (e.id == s->id) {
        e.finished = true;
        e.reason = s->finish;
        marked = true;
      }
    }
    if (!marked && (!only_abnormal ||
                    (s->finish != FinishReason::kLength && s->finish != FinishReason::kStop))) {
      events->push_back({s->id, -1, true, s->finish});
    }
  }
}

Result<StepOutcome> Engine::Step() {
  StepOutcome out;
  CollectFinished(&out.events, true);
  if (degraded_) {
    if (!out.events.empty()) return out;  // requests failed while degraded
    return Unavailable("{}", degraded_reason_);
  }
  StepPlan plan = scheduler_->Schedule();
  to_free_.insert(to_free_.end(), plan.preempted.begin(), plan.preempted.end());
  Status freed = FreeSeqs(std::move(to_free_));
  to_free_.clear();
  if (!freed.ok()) {
    if (freed.code() != StatusCode::kUnavailable || !executor_->supports_recovery()) return freed;
    // A device died while freeing: recover; the plan runs later.
    FS_RETURN_IF_ERROR(Recover(executor_->plan().alive, {}, MonotonicNanos()));
    out.recovered = true;
    return out;
  }
  if (plan.empty()) return out;
  StepBatch batch;
  HostKvBackup* backup = executor_->backup();
  for (const ScheduledSeq& ss : plan.seqs) {
    const Sequence* s = scheduler_->Find(ss.seq_id);
    StepSeq st;
    st.seq_id = ss.seq_id;
    st.start_pos = ss.start;
    st.num_tokens = ss.num_tokens;
    st.dp_rank = ss.dp_rank;
    st.token_offset = batch.num_tokens();
    st.logits_row = ss.sample ? batch.num_logits_rows++ : -1;
    if (backup)
      backup->Prepare(ss.seq_id, ss.start, ss.start + ss.num_tokens, &st, &batch.backup_blocks);
    batch.seqs.push_back(st);
    batch.tokens.insert(batch.tokens.end(), s->tokens.begin() + ss.start,
                        s->tokens.begin() + ss.start + ss.num_tokens);
  }
  auto logits = executor_->Step(batch, &out.timing);
  if (!logits.ok()) {
    if (logits.status().code() != StatusCode::kUnavailable || !executor_->supports_recovery())
      return logits.status();
    FS_LOG_WARN("step failed: {}; recovering", logits.status().ToString());
    FS_RETURN_IF_ERROR(Recover(executor_->plan().alive, {}, MonotonicNanos()));
    out.recovered = true;
    return out;
  }
  out.ran = true;
  const int vocab = executor_->config().vocab_size;
  std::vector<int32_t> sampled(plan.seqs.size(), -1);
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    if (batch.seqs[i].logits_row < 0) continue;
    const Sequence* s = scheduler_->Find(plan.seqs[i].seq_id);
    // The draw is keyed by the token's position: the same request samples the
    // same tokens however it is batched, preempted or recovered.
    sampled[i] = sampler_->Sample(*logits + static_cast<int64_t>(batch.seqs[i].logits_row) * vocab,
                                  vocab, sampling_[s->id], static_cast<uint64_t>(s->len()));
  }
  ChargeRecompute(plan, out.timing);
  scheduler_->Update(plan, sampled);
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    if (sampled[i] >= 0)
      out.events.push_back({plan.seqs[i].seq_id, sampled[i], false, FinishReason::kNone});
  }
  CollectFinished(&out.events, false);
  out.plan = std::move(plan);
  return out;
}

// Steps after a recovery that recompute lost KV are charged to it, in
// proportion to their recomputed tokens.
void Engine::ChargeRecompute(const StepPlan& plan, const StepTiming& timing) {
  if (recompute_target_.empty() || recoveries_.empty()) return;
  int recomputed = 0;
  for (const ScheduledSeq& ss : plan.seqs) {
    auto it = recompute_target_.find(ss.seq_id);
    if (it == recompute_target_.end()) continue;
    recomputed += std::max(0, std::min(ss.start + ss.num_tokens, it->second) - ss.start);
    if (ss.start + ss.num_tokens >= it->second) recompute_target_.erase(it);
  }
  RecoveryReport& r = recoveries_.back();
  if (plan.num_tokens() > 0)
    r.recompute_ms += timing.emulated_ns * 1e-6 * recomputed / plan.num_tokens();
  if (recompute_target_.empty()) r.finished = true;
}

}  // namespace failsafe
