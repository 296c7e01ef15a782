#include "engine/engine.h"

#include "common/check.h"
#include "common/clock.h"
#include "common/log.h"
#include "engine/kv_backup.h"
#include "engine/kv_tables.h"

namespace failsafe {

namespace {

// A step that fails this many times in a row without a device lost fails
// its requests (each retry runs on a fresh collective group).
constexpr int kMaxStepAttempts = 3;

const Clock* RealClockInstance() {
  static const RealClock real;
  return &real;
}

}  // namespace

Engine::Engine(Executor* executor, const SchedulerConfig& config, const EngineOptions& options)
    : executor_(executor),
      options_(options),
      clock_(options.clock ? options.clock : RealClockInstance()),
      scheduler_(std::make_unique<Scheduler>(config, executor->plan(), executor->config(),
                                             executor->block_size(), executor->kv_capacity_pages(),
                                             options.speed)),
      sampler_(MakeCpuBackend(1)),
      slow_(executor->plan().num_devices, options.slow) {
  if (HostKvBackup* b = executor_->backup()) {
    b->SetPlan(executor_->plan());
    // The backup is the prefix cache's host tier: it is indexed by the same
    // chained hashes.
    if (config.prefix_cache && config.prefix_cache_host) scheduler_->SetHostTier(b);
  }
}

Result<int64_t> Engine::Submit(RequestSpec spec) {
  const int vocab = executor_->config().vocab_size;
  auto check_ids = [&](const std::vector<int32_t>& ids) -> Status {
    for (int32_t t : ids) {
      if (t < 0 || t >= vocab)
        return InvalidArgument("token id {} is outside the vocabulary [0, {})", t, vocab);
    }
    return Status::Ok();
  };
  FS_RETURN_IF_ERROR(check_ids(spec.prompt));
  // Output tokens the request comes with count towards max_new_tokens: with
  // as many or more, nothing is left to generate (a step would sample one
  // too many).
  auto check_output = [&](const std::vector<int32_t>& out, const char* what) -> Status {
    if (spec.prompt.empty()) return InvalidArgument("a {} request needs its prompt", what);
    if (static_cast<int64_t>(out.size()) >= spec.max_new_tokens)
      return InvalidArgument("{} {} output tokens leave nothing to generate (max_tokens {})",
                             out.size(), what, spec.max_new_tokens);
    return check_ids(out);
  };
  if (!spec.prefilled_output.empty()) {
    if (!options_.accept_prefilled)
      return InvalidArgument("a prefilled request needs devices that hold its KV already");
    if (!spec.resumed_output.empty())
      return InvalidArgument("a request is either prefilled or resumed");
    if (spec.prompt_logprobs >= 0)
      return InvalidArgument("a prefilled request has no prompt logprobs");
    FS_RETURN_IF_ERROR(check_output(spec.prefilled_output, "prefilled"));
  }
  if (!spec.resumed_output.empty()) {
    FS_RETURN_IF_ERROR(check_output(spec.resumed_output, "resumed"));
    if (spec.prompt_logprobs >= 0)
      return InvalidArgument("a resumed request has no prompt logprobs (they went out before)");
  }
  for (int top : {spec.logprobs, spec.prompt_logprobs}) {
    if (top > kMaxLogprobs)
      return InvalidArgument("at most {} log-probabilities per position", kMaxLogprobs);
  }
  auto seq = std::make_unique<Sequence>();
  const int64_t id = next_id_;
  seq->id = id;
  seq->prompt_len = static_cast<int>(spec.prompt.size());
  seq->tokens = std::move(spec.prompt);
  if (!spec.prefilled_output.empty()) {
    seq->tokens.insert(seq->tokens.end(), spec.prefilled_output.begin(),
                       spec.prefilled_output.end());
    seq->num_computed = static_cast<int>(seq->tokens.size()) - 1;
  }
  // A resumed request computes its output again (its KV stayed elsewhere)
  // and goes on from there: positions, the draw's counter, penalties,
  // min_tokens and max_new_tokens count as for the original.
  seq->tokens.insert(seq->tokens.end(), spec.resumed_output.begin(), spec.resumed_output.end());
  if (spec.prompt_logprobs >= 0 && seq->prompt_len > 1) seq->prompt_logits_from = 0;
  seq->max_new_tokens = spec.max_new_tokens;
  seq->stop_token_ids = std::move(spec.stop_token_ids);
  seq->arrival = spec.arrival;
  FS_RETURN_IF_ERROR(scheduler_->Add(std::move(seq)));
  samplers_.insert_or_assign(id, RequestSampler(spec.sampling, std::move(spec.controls),
                                                spec.logprobs, std::move(spec.constraint)));
  if (spec.prompt_logprobs >= 0) prompt_logprobs_[id].top = spec.prompt_logprobs;
  ++next_id_;
  return id;
}

void Engine::Abort(int64_t id, FinishReason why) { scheduler_->Abort(id, why); }

EngineSnapshot Engine::Snapshot() const {
  EngineSnapshot s;
  s.running = scheduler_->num_running();
  s.waiting = scheduler_->num_waiting();
  const Plan& plan = executor_->plan();
  s.dp_load_tokens = scheduler_->DpLoad();
  s.dp_load_tokens.resize(plan.num_devices, 0);
  for (int d = 0; d < plan.num_devices; ++d) {
    const bool active = plan.IsActive(d);
    const KvBlockManager& kv = scheduler_->kv();
    s.kv_capacity_pages.push_back(active ? kv.capacity(d) : 0);
    s.kv_used_pages.push_back(active ? kv.used(d) - kv.evictable(d) : 0);
  }
  s.prefix_cache = scheduler_->config().prefix_cache;
  s.prefix = scheduler_->prefix_cache_stats();
  return s;
}

void Engine::Fail(const std::vector<int64_t>& ids, const Status& why) {
  for (int64_t id : ids) {
    if (!scheduler_->Find(id)) continue;
    errors_[id] = why;
    scheduler_->Abort(id, FinishReason::kError);
  }
}

std::vector<TokenEvent> Engine::FailAll(const Status& why) {
  std::vector<int64_t> ids;
  for (const Sequence* s : scheduler_->Running()) ids.push_back(s->id);
  for (const Sequence* s : scheduler_->Waiting()) ids.push_back(s->id);
  Fail(ids, why);
  std::vector<TokenEvent> events;
  CollectFinished(&events, true);
  if (!ids.empty()) FS_LOG_ERROR("failing {} requests: {}", ids.size(), why.ToString());
  return events;
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
  HostKvBackup* backup = executor_->backup();
  const KvBlockManager& kv = scheduler_->kv();
  for (auto& s : scheduler_->TakeFinished()) {
    to_free_.push_back(s->id);
    // The hashes of its last full blocks (its tables are gone): its backup
    // indexes them when released.
    if (backup && kv.prefix_cache()) {
      backup->Settle(
          s->id, kv.BlockHashes(s->tokens, std::min(s->num_computed, s->len()) / kv.block_size()),
          s->tokens);
    }
    samplers_.erase(s->id);
    prompt_logprobs_.erase(s->id);
    Status error;
    if (s->finish == FinishReason::kError) {
      auto it = errors_.find(s->id);
      if (it != errors_.end()) {
        error = it->second;
      } else {
        // The scheduler's own verdict: the request cannot fit any more.
        error = Status(StatusCode::kResourceExhausted,
                       s->error.empty() ? "the request could not be served" : s->error);
      }
    }
    errors_.erase(s->id);
    bool marked = false;
    for (auto& e : *events) {
      if (e.id == s->id) {
        e.finished = true;
        e.reason = s->finish;
        e.error = error;
        marked = true;
      }
    }
    if (!marked && (!only_abnormal ||
                    (s->finish != FinishReason::kLength && s->finish != FinishReason::kStop))) {
      events->push_back({s->id, -1, true, s->finish, error});
    }
  }
}

StepBatch Engine::BuildBatch(const StepPlan& plan, bool shared_backup) {
  HostKvBackup* backup = executor_->backup();
  StepBatch batch;
  batch.estimated_s = plan.estimated_time;
  // Every new sequence names the backup blocks of its prefix hits before any
  // block of the step is allocated (which may evict an unnamed one): those of
  // its host-tier hit are copied into its pages by this step.
  std::vector<int32_t> host_from(plan.seqs.size(), 0);
  if (shared_backup) {
    const int bs = scheduler_->kv().block_size();
    for (size_t i = 0; i < plan.seqs.size(); ++i) {
      const ScheduledSeq& ss = plan.seqs[i];
      const Sequence* s = scheduler_->Find(ss.seq_id);
      const std::span<const uint64_t> hashes(s->block_hashes);
      const int named =
          backup->Name(ss.seq_id, hashes.first(std::min<size_t>(hashes.size(), ss.start / bs)),
                       s->tokens, ss.start);
      if (ss.host_blocks == 0) continue;
      FS_CHECK_MSG(named >= ss.host_first_block + ss.host_blocks,
                   "sequence {}: {} blocks of its host-tier hit named, {} needed", ss.seq_id, named,
                   ss.host_first_block + ss.host_blocks);
      const std::vector<int32_t>& blocks = backup->Blocks(ss.seq_id);
      host_from[i] = static_cast<int32_t>(batch.backup_blocks.size());
      batch.backup_blocks.insert(batch.backup_blocks.end(), blocks.begin() + ss.host_first_block,
                                 blocks.begin() + ss.host_first_block + ss.host_blocks);
    }
  }
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const ScheduledSeq& ss = plan.seqs[i];
    const Sequence* s = scheduler_->Find(ss.seq_id);
    StepSeq st;
    st.seq_id = ss.seq_id;
    st.start_pos = ss.start;
    st.num_tokens = ss.num_tokens;
    st.dp_rank = ss.dp_rank;
    st.token_offset = batch.num_tokens();
    if (ss.logits_rows > 0) {
      st.logits_row = batch.num_logits_rows;
      st.logits_rows = ss.logits_rows;
      batch.num_logits_rows += ss.logits_rows;
    }
    if (backup) {
      backup->Prepare(ss.seq_id, ss.start, ss.start + ss.num_tokens, &st, &batch.backup_blocks);
      st.host_first_block = ss.host_first_block;
      st.host_blocks = ss.host_blocks;
      st.host_offset = host_from[i];
    }
    batch.seqs.push_back(st);
    AddKvTables(scheduler_->kv(), executor_->plan(), *s, ss.kv_first_block, &batch);
    batch.tokens.insert(batch.tokens.end(), s->tokens.begin() + ss.start,
                        s->tokens.begin() + ss.start + ss.num_tokens);
  }
  return batch;
}

std::vector<int32_t> Engine::Sample(const StepPlan& plan, const StepBatch& batch,
                                    const StepOutput& out,
                                    std::vector<std::optional<PositionLogprobs>>* lps) {
  const int vocab = executor_->config().vocab_size;
  std::vector<int32_t> sampled(plan.seqs.size(), -1);
  lps->assign(plan.seqs.size(), std::nullopt);
  const float* logits = out.logits;
  // Modelled devices compute no logits: they give the tokens.
  const int32_t* given = logits ? nullptr : out.tokens;
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const StepSeq& st = batch.seqs[i];
    if (st.logits_row < 0) continue;
    const ScheduledSeq& ss = plan.seqs[i];
    // The row of its last position: the one sampled.
    const int last = st.logits_row + st.logits_rows - 1;
    if (given) {
      if (ss.sample) sampled[i] = given[last];
      continue;
    }
    const Sequence* s = scheduler_->Find(ss.seq_id);
    const float* rows = logits + static_cast<int64_t>(st.logits_row) * vocab;
    if (s->prompt_logits_from >= 0)
      TakePromptLogprobs(s, ss, rows, st.logits_rows - (ss.sample ? 1 : 0));
    if (!ss.sample) continue;
    // The draw is keyed by the token's position: the same request samples the
    // same tokens however it is batched, preempted or recovered.
    RequestSampler& sampler = samplers_.at(s->id);
    PositionLogprobs lp;
    sampled[i] = sampler.Draw(logits + static_cast<int64_t>(last) * vocab, vocab, s->tokens,
                              s->prompt_len, s->stop_token_ids, sampler_.get(), &lp);
    if (sampler.logprobs() >= 0) (*lps)[i] = std::move(lp);
  }
  return sampled;
}

void Engine::TakePromptLogprobs(const Sequence* s, const ScheduledSeq& ss, const float* logits,
                                int rows) {
  auto it = prompt_logprobs_.find(s->id);
  if (it == prompt_logprobs_.end() || s->num_computed != ss.start) return;
  const int vocab = executor_->config().vocab_size;
  // The rows are the chunk's last positions; position p gives prompt token
  // p + 1, from where the last step stopped.
  const int first_row_pos = ss.start + ss.num_tokens - (rows + (ss.sample ? 1 : 0));
  for (int k = 0; k < rows; ++k) {
    const int p = first_row_pos + k;
    if (p < s->prompt_logits_from || p >= s->prompt_len - 1) continue;
    PositionLogprobs lp;
    ComputeLogprobs(logits + static_cast<int64_t>(k) * vocab, vocab, s->tokens[p + 1],
                    it->second.top, &lp);
    it->second.positions.push_back(std::move(lp));
  }
}

Result<StepOutcome> Engine::Step() {
  StepOutcome out;
  CollectFinished(&out.events, true);
  if (degraded_) {
    if (!out.events.empty()) return out;  // requests failed while degraded
    return Unavailable("{}", degraded_reason_);
  }
  HostKvBackup* backup = executor_->backup();
  // The backup is indexed by the prefix cache's hashes: without the cache
  // it is only the recovery copy.
  const bool shared_backup = backup && scheduler_->kv().prefix_cache();
  if (shared_backup) {
    // Blocks the devices have copied since become complete: a prefix hit
    // admitted now finds them in the backup.
    for (const Sequence* s : scheduler_->Running())
      backup->Settle(s->id, scheduler_->kv().Hashes(s->id), s->tokens);
  }
  StepPlan plan = scheduler_->Schedule();
  std::vector<int64_t> ids;
  for (const ScheduledSeq& ss : plan.seqs) ids.push_back(ss.seq_id);
  // Whatever happens to the step, report what it finished and failed.
  auto failed = [&](const Status& error) -> Result<StepOutcome> {
    // The devices may have missed the step's new block-table entries, and
    // the copies of its host-tier hits: those blocks are computed (or
    // restored) again.
    scheduler_->ResendKvTables(ids);
    for (const ScheduledSeq& ss : plan.seqs) {
      if (ss.host_blocks > 0)
        scheduler_->RollBack(ss.seq_id, ss.host_first_block * scheduler_->kv().block_size());
    }
    Status st = HandleStepError(error, ids, clock_->NowNanos());
    if (!st.ok()) FS_LOG_WARN("after a failed step: {}", st.ToString());
    out.recovered = true;
    CollectFinished(&out.events, true);
    if (degraded_ && out.events.empty()) return Unavailable("{}", degraded_reason_);
    return out;
  };
  to_free_.insert(to_free_.end(), plan.preempted.begin(), plan.preempted.end());
  std::vector<int64_t> frees = std::move(to_free_);
  to_free_.clear();
  // A sequence the devices could not free is dropped by the recovery that
  // follows (applying a plan drops every sequence it does not list); it is
  // freed again at the next step, which returns its backup slot and blocks
  // (dropping them here leaked both: once the slots ran out, new requests
  // went without a backup).
  if (Status freed = FreeSeqs(frees); !freed.ok()) {
    to_free_.insert(to_free_.end(), frees.begin(), frees.end());
    return failed(freed);
  }
  if (plan.empty()) return out;
  const StepBatch batch = BuildBatch(plan, shared_backup);
  const int64_t started = clock_->NowNanos();
  auto produced = executor_->Step(batch, &out.timing);
  if (!produced.ok()) return failed(produced.status());
  step_failures_ = 0;
  out.ran = true;
  std::vector<std::optional<PositionLogprobs>> lps;
  const std::vector<int32_t> sampled = Sample(plan, batch, *produced, &lps);
  AfterStep(plan, started);
  scheduler_->Update(plan, sampled);
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    if (sampled[i] < 0) continue;
    TokenEvent e{plan.seqs[i].seq_id, sampled[i], false, FinishReason::kNone, {}};
    e.logprobs = std::move(lps[i]);
    // The prompt's log-probabilities go out with the first token.
    if (auto it = prompt_logprobs_.find(e.id); it != prompt_logprobs_.end()) {
      e.prompt_logprobs = std::move(it->second.positions);
      prompt_logprobs_.erase(it);
    }
    out.events.push_back(std::move(e));
  }
  CollectFinished(&out.events, false);
  // A rebalance re-plans between steps, as a rejoin does: after the
  // scheduler has taken this step's tokens, so that the sequences it rolls
  // back are rolled back from where they are (before Update, the step's
  // tokens landed on rolled-back sequences: other tokens, and more of them).
  WatchSpeeds(out.timing);
  out.plan = std::move(plan);
  return out;
}

Status Engine::HandleStepError(const Status& error, const std::vector<int64_t>& ids,
                               int64_t failed_ns) {
  const bool lost = executor_->supports_recovery() &&
                    executor_->alive_devices().size() < executor_->plan().alive.size();
  if (lost) {
    FS_LOG_WARN("step failed: {}; recovering", error.ToString());
    step_failures_ = 0;
  } else if (++step_failures_ >= kMaxStepAttempts) {
    // No device was lost, so the same work may fail again: after a few
    // attempts its requests end with the error rather than wait forever.
    FS_LOG_ERROR("a step failed {} times ({}); failing its {} requests", step_failures_,
                 error.ToString(), ids.size());
    step_failures_ = 0;
    Fail(ids, error);
  } else {
    FS_LOG_WARN("step failed: {}; retrying on a fresh group", error.ToString());
  }
  if (!executor_->supports_recovery()) return Status::Ok();
  // A lost device: a plan for the survivors. None lost: the devices may be
  // out of step (one failed before a collective the others wait in): a fresh
  // group and the same plan bring them back in step, and free anything they
  // hold that the scheduler does not know.
  return Recover({}, failed_ns);
}

// Steps after a recovery: the first one closes its report; those that
// recompute lost KV are charged to it, in proportion to their recomputed
// tokens.
void Engine::AfterStep(const StepPlan& plan, int64_t started_ns) {
  if (recoveries_.empty()) return;
  RecoveryReport& r = recoveries_.back();
  const int64_t now = clock_->NowNanos();
  if (report_open_ && r.recovered_ns > 0) {
    r.resumed_ns = now;
    r.first_step_ms = (now - started_ns) * 1e-6;
    report_open_ = false;
  }
  if (recompute_target_.empty()) return;
  int recomputed = 0;
  for (const ScheduledSeq& ss : plan.seqs) {
    auto it = recompute_target_.find(ss.seq_id);
    if (it == recompute_target_.end()) continue;
    recomputed += std::max(0, std::min(ss.start + ss.num_tokens, it->second) - ss.start);
    if (ss.start + ss.num_tokens >= it->second) recompute_target_.erase(it);
  }
  if (plan.num_tokens() > 0)
    r.recompute_ms += (now - started_ns) * 1e-6 * recomputed / plan.num_tokens();
  if (recompute_target_.empty()) r.finished = true;
}

}  // namespace failsafe
