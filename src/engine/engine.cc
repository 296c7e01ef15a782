#include "engine/engine.h"

namespace failsafe {

Engine::Engine(Executor* executor, const SchedulerConfig& config, const DeviceSpeed& speed)
    : executor_(executor),
      scheduler_(std::make_unique<Scheduler>(config, executor->plan(), executor->config(),
                                             executor->block_size(), executor->kv_capacity_pages(),
                                             speed)),
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

Status Engine::FreeFinished(std::vector<TokenEvent>* events) {
  for (auto& s : scheduler_->TakeFinished()) {
    to_free_.push_back(s->id);
    sampling_.erase(s->id);
    if (events && s->finish != FinishReason::kLength && s->finish != FinishReason::kStop) {
      events->push_back({s->id, -1, true, s->finish});
    }
  }
  return Status::Ok();
}

Result<StepOutcome> Engine::Step() {
  StepOutcome out;
  FS_RETURN_IF_ERROR(FreeFinished(&out.events));
  StepPlan plan = scheduler_->Schedule();
  to_free_.insert(to_free_.end(), plan.preempted.begin(), plan.preempted.end());
  if (!to_free_.empty()) {
    FS_RETURN_IF_ERROR(executor_->FreeSeqs(to_free_));
    to_free_.clear();
  }
  if (plan.empty()) return out;
  out.ran = true;
  StepBatch batch;
  for (const ScheduledSeq& ss : plan.seqs) {
    const Sequence* s = scheduler_->Find(ss.seq_id);
    StepSeq st;
    st.seq_id = ss.seq_id;
    st.start_pos = ss.start;
    st.num_tokens = ss.num_tokens;
    st.dp_rank = ss.dp_rank;
    st.token_offset = batch.num_tokens();
    st.logits_row = ss.sample ? batch.num_logits_rows++ : -1;
    batch.seqs.push_back(st);
    batch.tokens.insert(batch.tokens.end(), s->tokens.begin() + ss.start,
                        s->tokens.begin() + ss.start + ss.num_tokens);
  }
  FS_ASSIGN_OR_RETURN(const float* logits, executor_->Step(batch, &out.timing));
  const int vocab = executor_->config().vocab_size;
  std::vector<int32_t> sampled(plan.seqs.size(), -1);
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    if (batch.seqs[i].logits_row < 0) continue;
    const Sequence* s = scheduler_->Find(plan.seqs[i].seq_id);
    // The draw is keyed by the token's position: the same request samples the
    // same tokens however it is batched, preempted or recovered.
    sampled[i] = sampler_->Sample(logits + static_cast<int64_t>(batch.seqs[i].logits_row) * vocab,
                                  vocab, sampling_[s->id], static_cast<uint64_t>(s->len()));
  }
  scheduler_->Update(plan, sampled);
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    if (sampled[i] >= 0)
      out.events.push_back({plan.seqs[i].seq_id, sampled[i], false, FinishReason::kNone});
  }
  // Mark the events of sequences that finished in this step.
  for (auto& s : scheduler_->TakeFinished()) {
    for (auto& e : out.events) {
      if (e.id == s->id) {
        e.finished = true;
        e.reason = s->finish;
      }
    }
    to_free_.push_back(s->id);
    sampling_.erase(s->id);
  }
  out.plan = std::move(plan);
  return out;
}

}  // namespace failsafe
