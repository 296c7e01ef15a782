#include "core/scheduler.h"

#include <algorithm>
#include <limits>
#include <unordered_set>

#include "common/check.h"

namespace failsafe {

Result<RouterPolicy> ParseRouterPolicy(const std::string& name) {
  if (name == "round-robin") return RouterPolicy::kRoundRobin;
  if (name == "load-aware") return RouterPolicy::kLoadAware;
  return InvalidArgument("unknown router '{}' (known: round-robin, load-aware)", name);
}

Result<PrefillPolicy> ParsePrefillPolicy(const std::string& name) {
  if (name == "fifo") return PrefillPolicy::kFifo;
  if (name == "adaptive") return PrefillPolicy::kAdaptive;
  return InvalidArgument("unknown prefill policy '{}' (known: fifo, adaptive)", name);
}

const char* RouterPolicyName(RouterPolicy p) {
  return p == RouterPolicy::kRoundRobin ? "round-robin" : "load-aware";
}
const char* PrefillPolicyName(PrefillPolicy p) {
  return p == PrefillPolicy::kFifo ? "fifo" : "adaptive";
}

Scheduler::Scheduler(const SchedulerConfig& config, const Plan& plan, const ModelConfig& model,
                     int block_size, std::vector<int64_t> kv_capacity_pages,
                     const DeviceSpeed& speed)
    : config_(config),
      model_(model),
      plan_(plan),
      kv_(config.kv_page_ids
              ? std::make_unique<PagedKvBlockManager>(plan, block_size,
                                                      std::move(kv_capacity_pages))
              : std::make_unique<KvBlockManager>(plan, block_size, std::move(kv_capacity_pages))),
      cost_(plan, model, speed),
      speed_(speed),
      dp_load_(plan.num_devices, 0) {
  // The seed: the model configuration (what the KV of a token depends on
  // besides the tokens before it) and the caller's salt.
  if (config.prefix_cache)
    kv_->EnablePrefixCache(std::hash<std::string>()(model.ToJson()) ^ config.prefix_cache_seed);
}

Status Scheduler::Add(std::unique_ptr<Sequence> seq) {
  if (seqs_.count(seq->id)) return InvalidArgument("request id {} is already in use", seq->id);
  // A sequence arrives as a prompt (with the output tokens of a request
  // resumed from another node, computed again here), or (disaggregated
  // decode) with the prompt's KV already computed elsewhere and its first
  // token sampled.
  const bool migrated = seq->num_computed > 0;
  if (seq->prompt_len <= 0) return InvalidArgument("the prompt is empty");
  if (!migrated && seq->output_len() >= seq->max_new_tokens)
    return InvalidArgument("{} output tokens leave nothing to generate (max_tokens {})",
                           seq->output_len(), seq->max_new_tokens);
  if (migrated && (seq->num_computed != seq->prompt_len || seq->len() != seq->prompt_len + 1)) {
    return InvalidArgument("a migrated request has its prompt's KV and one sampled token");
  }
  if (seq->max_new_tokens < 1) return InvalidArgument("max_tokens must be at least 1");
  if (seq->prompt_len + seq->max_new_tokens > config_.max_model_len) {
    return OutOfRange("prompt ({} tokens) plus max_tokens ({}) exceeds the context length {}",
                      seq->prompt_len, seq->max_new_tokens, config_.max_model_len);
  }
  for (int32_t t : seq->tokens) {
    if (t < 0 || t >= model_.vocab_size)
      return InvalidArgument("token id {} is outside the vocabulary", t);
  }
  // A request that could never fit, even alone, is refused now rather than
  // waiting forever.
  // Any DP rank the router may pick must do.
  bool fits = true;
  for (int d : plan_.active) fits &= kv_->FitsAlone(d, seq->prompt_len + seq->max_new_tokens);
  if (!fits) {
    return ResourceExhausted("a request of {} tokens does not fit in the devices' KV memory",
                             seq->prompt_len + seq->max_new_tokens);
  }
  seq->state = SeqState::kWaiting;
  waiting_.push_back(seq.get());
  seqs_[seq->id] = std::move(seq);
  return Status::Ok();
}

const Sequence* Scheduler::Find(int64_t id) const {
  auto it = seqs_.find(id);
  return it == seqs_.end() ? nullptr : it->second.get();
}

std::vector<const Sequence*> Scheduler::Running() const {
  return std::vector<const Sequence*>(running_.begin(), running_.end());
}

std::vector<const Sequence*> Scheduler::Waiting() const {
  return std::vector<const Sequence*>(waiting_.begin(), waiting_.end());
}

std::vector<int64_t> Scheduler::DpLoad() const { return dp_load_; }

PrefixCacheStats Scheduler::prefix_cache_stats() const {
  PrefixCacheStats out = prefix_stats_;
  out.cached_blocks = kv_->cached_blocks();
  out.evicted_blocks = kv_->evicted_blocks();
  return out;
}

int Scheduler::RouteFor(const Sequence& s, std::span<const uint64_t> hashes) {
  if (hashes.empty() || plan_.num_dp_heads_total() == 0 ||
      config_.router != RouterPolicy::kLoadAware)
    return Route();
  const int least = Route();
  int best = least, best_hit = kv_->CachedPrefix(s.tokens, hashes, least);
  for (int d : plan_.active) {
    const int hit = kv_->CachedPrefix(s.tokens, hashes, d);
    if (hit > best_hit || (hit == best_hit && dp_load_[d] < dp_load_[best])) {
      best = d;
      best_hit = hit;
    }
  }
  // The hit's rank unless it is too far behind in work.
  if (dp_load_[best] - dp_load_[least] > config_.prefix_affinity_tokens) return least;
  return best;
}

std::optional<std::span<const uint64_t>> Scheduler::LookupHashes(Sequence* s) {
  if (!kv_->prefix_cache() || s->state != SeqState::kWaiting || s->num_computed != 0 ||
      s->kv_blocks != 0)
    return std::nullopt;
  // Never the whole sequence: its last token is computed for its logits.
  const int blocks = (s->len() - 1) / kv_->block_size();
  if (static_cast<int>(s->block_hashes.size()) < blocks)
    s->block_hashes = kv_->BlockHashes(s->tokens, blocks);
  return std::span<const uint64_t>(s->block_hashes).first(blocks);
}

void Scheduler::RouteCandidate(Sequence* s) {
  if (s->dp_rank >= 0) return;
  s->dp_rank = RouteFor(*s, LookupHashes(s).value_or(std::span<const uint64_t>()));
  dp_load_[s->dp_rank] += s->len();
}

void Scheduler::AttachCandidate(Sequence* s, const std::vector<int64_t>& pending,
                                const std::vector<int64_t>& keep) {
  // Prompt logprobs come from computing the prompt's positions.
  if (s->prompt_logits_from >= 0) return;
  const auto lookup = LookupHashes(s);
  if (!lookup) return;
  const std::span<const uint64_t> hashes = *lookup;
  Lookup l{s, static_cast<int>(hashes.size()), 0};
  const int hit = kv_->CachedPrefix(s->tokens, hashes, s->dp_rank);
  if (hit > 0) {
    l.hit = kv_->AttachPrefix(*s, hashes, hit, pending);
    s->num_computed = l.hit * kv_->block_size();
  }
  // The host tier: the blocks after the attached ones that the host holds
  // (its prefix from block 0 must reach past them) are copied into the
  // pages the sequence's first chunk gets, not computed. The budget counts
  // only computed tokens; the pages count them all (Fits).
  // As many of them as leave room for one computed token now: a copy never
  // keeps a request waiting that would be admitted without it.
  if (host_tier_ && config_.prefix_cache_host && l.hit < static_cast<int>(hashes.size())) {
    int host = std::max(0, host_tier_->HeldPrefix(hashes, s->tokens) - l.hit);
    while (host > 0 && !kv_->Fits(s->dp_rank, s->kv_blocks, (l.hit + host) * kv_->block_size() + 1,
                                  pending, keep))
      --host;
    l.host = host;
    s->num_computed += l.host * kv_->block_size();
  }
  lookups_.push_back(l);
}

bool Scheduler::DetachCandidate(Sequence* s) {
  for (Lookup& l : lookups_) {
    if (l.s != s || (l.hit == 0 && l.host == 0)) continue;
    if (l.hit > 0) kv_->Release(*s);
    s->num_computed = 0;
    l.hit = 0;
    l.host = 0;
    return true;
  }
  return false;
}

void Scheduler::DetachUnadmitted() {
  for (const Lookup& l : lookups_) {
    Sequence* s = l.s;
    if (s->state == SeqState::kRunning && s->num_preemptions > 0) {
      prefix_stats_.readmitted_hit_tokens +=
          static_cast<int64_t>(l.hit + l.host) * kv_->block_size();
    } else if (s->state == SeqState::kRunning) {
      prefix_stats_.lookup_blocks += l.looked_up;
      prefix_stats_.hit_blocks += l.hit;
      prefix_stats_.hit_tokens += static_cast<int64_t>(l.hit) * kv_->block_size();
      prefix_stats_.host_hit_blocks += l.host;
      prefix_stats_.host_hit_tokens += static_cast<int64_t>(l.host) * kv_->block_size();
    } else if (l.hit > 0 || l.host > 0) {
      if (l.hit > 0) kv_->Release(*s);
      s->num_computed = 0;
    }
  }
  lookups_.clear();
}

int Scheduler::Route() {
  const auto& act = plan_.active;
  if (config_.router == RouterPolicy::kRoundRobin) return act[rr_next_++ % act.size()];
  int best = act.front();
  for (int d : act) {
    if (dp_load_[d] < dp_load_[best]) best = d;
  }
  return best;
}

void Scheduler::ReleaseKv(Sequence* s) {
  auto it = counted_rank_.find(s->id);
  if (it == counted_rank_.end()) return kv_->Release(*s);
  const int routed = s->dp_rank;
  s->dp_rank = it->second;
  kv_->Release(*s);
  s->dp_rank = routed;
}

void Scheduler::Preempt(Sequence* s, StepPlan* plan) {
  preempted_last_ = s->id;
  ReleaseKv(s);
  s->num_computed = 0;
  s->state = SeqState::kWaiting;
  s->num_preemptions++;
  // Under DP heads its KV, gone now, lived on its rank alone: it comes back
  // routed afresh (by load and cached prefix), not to the rank whose memory
  // ran out, while other ranks' memory stands empty.
  if (plan_.num_dp_heads_total() > 0 && s->dp_rank >= 0) {
    if (plan_.IsActive(s->dp_rank)) dp_load_[s->dp_rank] -= s->len();
    s->dp_rank = -1;
  }
  std::erase(running_, s);
  waiting_.push_front(s);
  if (plan) plan->preempted.push_back(s->id);
}

void Scheduler::FinishSeq(Sequence* s, FinishReason why) {
  ReleaseKv(s);
  if (s->dp_rank >= 0) dp_load_[s->dp_rank] -= s->len();
  std::erase(running_, s);
  std::erase(waiting_, s);
  s->state = SeqState::kFinished;
  s->finish = why;
  auto it = seqs_.find(s->id);
  finished_.push_back(std::move(it->second));
  seqs_.erase(it);
}

void Scheduler::Abort(int64_t id, FinishReason why) {
  auto it = seqs_.find(id);
  if (it != seqs_.end()) FinishSeq(it->second.get(), why);
}

std::vector<std::unique_ptr<Sequence>> Scheduler::TakeFinished() { return std::move(finished_); }

bool Scheduler::CanAdmit(const Sequence& s, int tokens) const {
  return static_cast<int>(running_.size()) < config_.max_num_seqs && kv_->CanGrow(s, tokens);
}

std::vector<Sequence*> Scheduler::PrefillCandidates(int limit) {
  std::vector<Sequence*> out;
  for (Sequence* s : running_) {
    if (s->pending() > 1 && static_cast<int>(out.size()) < limit) out.push_back(s);
  }
  int room = config_.max_num_seqs - static_cast<int>(running_.size());
  for (Sequence* s : waiting_) {
    if (static_cast<int>(out.size()) >= limit || room <= 0) break;
    // A waiting sequence with computed KV (disaggregated decode) is admitted
    // whole by ScheduleOnce, never as a prefill; first come, first served.
    if (s->num_computed > 0) break;
    out.push_back(s);
    --room;
  }
  return out;
}

StepPlan Scheduler::Schedule() {
  StepPlan plan = ScheduleOnce();
  // Running sequences that all wait for memory (prefills that cannot grow):
  // make room by preempting the newest until one can move. The oldest alone
  // always fits (Add checked it).
  while (plan.empty() && !running_.empty()) {
    std::vector<int64_t> preempted = std::move(plan.preempted);
    Preempt(running_.back(), nullptr);
    preempted.push_back(preempted_last_);
    plan = ScheduleOnce();
    plan.preempted.insert(plan.preempted.begin(), preempted.begin(), preempted.end());
  }
  return plan;
}

StepPlan Scheduler::ScheduleOnce() {
  StepPlan plan;
  cost_.Reset();
  int budget = config_.max_batch_tokens;
  // 0) Sequences whose prompt KV arrives computed (disaggregated decode):
  //    admitted in order while their whole KV fits.
  while (!waiting_.empty() && waiting_.front()->num_computed > 0 &&
         static_cast<int>(running_.size()) < config_.max_num_seqs) {
    Sequence* s = waiting_.front();
    if (s->dp_rank < 0) {
      s->dp_rank = Route();
      dp_load_[s->dp_rank] += s->len();
    }
    std::vector<int64_t> none(plan_.num_devices, 0), keep(plan_.num_devices, 0);
    for (int d : plan_.active)
      keep[d] = static_cast<int64_t>(config_.admit_watermark * kv_->capacity(d));
    if (!kv_->Fits(s->dp_rank, s->kv_blocks, s->len(), none, keep)) break;
    kv_->Grow(*s, s->num_computed);
    waiting_.pop_front();
    s->state = SeqState::kRunning;
    running_.push_back(s);
  }
  // 1) One decode token for every running sequence past its prefill, oldest
  //    first; preempt the newest sequences when a block is missing.
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    Sequence* s = running_[i];
    if (s->pending() != 1 || s->num_computed == 0) continue;
    bool preempted_self = false;
    while (!kv_->CanGrow(*s, s->num_computed + 1)) {
      Sequence* victim = running_.back();
      Preempt(victim, &plan);
      if (victim == s) {
        preempted_self = true;
        break;
      }
    }
    if (preempted_self) break;
    kv_->Grow(*s, s->num_computed + 1);
    plan.seqs.push_back({s->id, s->num_computed, 1, s->dp_rank, true, 1});
    cost_.AddChunk(1, s->num_computed, s->dp_rank);
    plan.decode_tokens++;
    --budget;
  }
  // 2) Prefill chunks.
  spare_rows_ = config_.max_num_seqs - plan.decode_tokens;
  std::vector<Sequence*> chunks;
  std::vector<int> sizes;
  if (budget > 0) {
    if (config_.prefill == PrefillPolicy::kFifo) {
      SchedulePrefillFifo(budget, &plan, &chunks, &sizes);
    } else {
      SchedulePrefillAdaptive(budget, &plan, &chunks, &sizes);
    }
  }
  // The candidates with host-tier blocks (few, and none without the host
  // tier): not every lookup is searched for every admitted chunk.
  std::vector<const Lookup*> host_hits;
  for (const Lookup& l : lookups_) {
    if (l.host > 0) host_hits.push_back(&l);
  }
  for (size_t i = 0; i < chunks.size(); ++i) {
    Sequence* s = chunks[i];
    int host = 0;
    if (s->state == SeqState::kWaiting) {
      std::erase(waiting_, s);
      s->state = SeqState::kRunning;
      running_.push_back(s);
      for (const Lookup* l : host_hits) {
        if (l->s == s) host = l->host;
      }
    }
    kv_->Grow(*s, s->num_computed + sizes[i]);
    const bool sample = s->num_computed + sizes[i] == s->len();
    ScheduledSeq ss{s->id, s->num_computed, sizes[i], s->dp_rank, sample};
    ss.logits_rows = s->LogitsRows(s->num_computed, sizes[i]);
    ss.host_blocks = host;
    ss.host_first_block = s->num_computed / kv_->block_size() - host;
    plan.seqs.push_back(ss);
    plan.prefill_tokens += sizes[i];
  }
  DetachUnadmitted();
  // The estimate of the final batch.
  cost_.Reset();
  for (auto& ss : plan.seqs) cost_.AddChunk(ss.num_tokens, ss.start, ss.dp_rank);
  plan.estimated_time = cost_.StepTime();
  for (ScheduledSeq& ss : plan.seqs) ss.kv_first_block = kv_->TakeUnsent(ss.seq_id);
  return plan;
}

int Scheduler::ChunkForRows(const Sequence& s, int extra) {
  if (s.prompt_logits_from < 0) return std::numeric_limits<int>::max();
  return std::max(s.num_computed, s.prompt_logits_from) - s.num_computed + extra + 1;
}

std::vector<int64_t> Scheduler::PrefillAdmitReserve() const {
  std::vector<int64_t> keep(plan_.num_devices, 0);
  if (running_.empty()) return keep;
  for (int d : plan_.active)
    keep[d] = static_cast<int64_t>(config_.admit_watermark * kv_->capacity(d));
  return keep;
}

void Scheduler::SchedulePrefillFifo(int budget, StepPlan* plan, std::vector<Sequence*>* chunks,
                                    std::vector<int>* sizes) {
  std::vector<int64_t> pending(plan_.num_devices, 0), none(plan_.num_devices, 0),
      keep = PrefillAdmitReserve();
  const std::vector<Sequence*> cands = PrefillCandidates(1 << 30);
  // Every candidate may sample (one row each); the rest are for prompt logprobs.
  int spare = spare_rows_ - static_cast<int>(cands.size());
  for (Sequence* s : cands) {
    if (budget <= 0) break;
    const bool admitting = s->state == SeqState::kWaiting;
    RouteCandidate(s);
    AttachCandidate(s, pending, keep);
    int n = std::min({s->pending(), budget, ChunkForRows(*s, std::max(0, spare))});
    // Shrink the chunk to what the devices can hold.
    while (n > 0 && !kv_->Fits(s->dp_rank, s->kv_blocks, s->num_computed + n, pending,
                               admitting ? keep : none)) {
      n = std::max(0,
                   (kv_->BlocksFor(s->num_computed + n) - 1) * kv_->block_size() - s->num_computed);
    }
    if (n <= 0) {
      if (admitting) break;  // first come, first served: do not admit past it
      continue;
    }
    kv_->AddPending(s->dp_rank, s->kv_blocks, s->num_computed + n, &pending);
    chunks->push_back(s);
    sizes->push_back(n);
    budget -= n;
    spare -= std::max(0, s->LogitsRows(s->num_computed, n) - 1);
  }
}

void Scheduler::SchedulePrefillAdaptive(int budget, StepPlan* plan, std::vector<Sequence*>* chunks,
                                        std::vector<int>* sizes) {
  struct Cand {
    Sequence* s;
    int chunk = 0;
    bool admitting;
    bool blocked = false;  // out of KV
    int extra_rows = 0;    // logits rows past one (prompt logprobs)
  };
  std::vector<Cand> cands;
  std::vector<int64_t> pending(plan_.num_devices, 0), none(plan_.num_devices, 0),
      keep = PrefillAdmitReserve();
  for (Sequence* s : PrefillCandidates(config_.adaptive_candidates)) {
    RouteCandidate(s);
    AttachCandidate(s, pending, keep);
    cands.push_back({s, 0, s->state == SeqState::kWaiting});
  }
  if (cands.empty()) return;
  int spare = spare_rows_ - static_cast<int>(cands.size());
  const double decode_tokens = plan->decode_tokens;
  std::vector<int> history;  // candidate index per greedy step
  std::vector<int> deltas;
  double best_score = 0;
  size_t best_len = 0;
  int tokens = 0;
  while (tokens < budget) {
    // The least-loaded DP rank that has a request with tokens left ...
    int pick = -1;
    for (size_t i = 0; i < cands.size(); ++i) {
      const Cand& c = cands[i];
      if (c.blocked || c.chunk >= c.s->pending() ||
          c.chunk >= ChunkForRows(*c.s, std::max(0, spare) + c.extra_rows))
        continue;
      if (pick < 0 || cost_.DeviceTime(c.s->dp_rank) < cost_.DeviceTime(cands[pick].s->dp_rank))
        pick = static_cast<int>(i);
    }
    if (pick < 0) break;
    // ... gets one more unit for its earliest request.
    Cand& c = cands[pick];
    const int delta = std::min({config_.adaptive_unit, c.s->pending() - c.chunk, budget - tokens,
                                ChunkForRows(*c.s, std::max(0, spare) + c.extra_rows) - c.chunk});
    const int new_end = c.s->num_computed + c.chunk + delta;
    // Blocks already counted for this request: its own plus this step's growth so far.
    const int held = c.chunk > 0
                         ? std::max(c.s->kv_blocks, kv_->BlocksFor(c.s->num_computed + c.chunk))
                         : c.s->kv_blocks;
    if (!kv_->Fits(c.s->dp_rank, held, new_end, pending, c.admitting ? keep : none)) {
      // The requests queued behind hold their cached prefixes (attached up
      // front, so that this step's chunks do not evict them). Before the
      // queue's head waits for pages they pin, they let go of them for this
      // step; else the head may never fit, and first come, first served
      // would admit nothing, step after step.
      // So do the admissions already blocked, wherever they are queued (the
      // least-loaded rank's request is tried first, not the queue's head):
      // they get no chunk this step, and a pinned prefix of theirs may be
      // what keeps an earlier request out.
      if (c.admitting && c.chunk == 0) {
        bool released = false;
        for (size_t i = 0; i < cands.size(); ++i) {
          Cand& o = cands[i];
          if (i == static_cast<size_t>(pick) || !o.admitting || o.chunk > 0) continue;
          if (i < static_cast<size_t>(pick) && !o.blocked) continue;
          released |= DetachCandidate(o.s);
          o.blocked = true;  // they would wait behind the head anyway
        }
        if (released) continue;
      }
      c.blocked = true;
      // First come, first served among new admissions: nothing after a blocked one.
      if (c.admitting) {
        for (size_t i = pick + 1; i < cands.size(); ++i) {
          if (cands[i].admitting && cands[i].chunk == 0) cands[i].blocked = true;
        }
      }
      continue;
    }
    kv_->AddPending(c.s->dp_rank, held, new_end, &pending);
    cost_.GrowChunk(c.chunk, delta, c.s->num_computed, c.s->dp_rank);
    c.chunk += delta;
    const int extra = std::max(0, c.s->LogitsRows(c.s->num_computed, c.chunk) - 1);
    spare -= extra - c.extra_rows;
    c.extra_rows = extra;
    tokens += delta;
    history.push_back(pick);
    deltas.push_back(delta);
    const double score = (decode_tokens + tokens) / cost_.StepTime();
    if (score >= best_score) {
      best_score = score;
      best_len = history.size();
    }
  }
  // Keep the best prefix of the greedy sequence.
  std::vector<int> size(cands.size(), 0);
  for (size_t k = 0; k < best_len; ++k) size[history[k]] += deltas[k];
  for (size_t i = 0; i < cands.size(); ++i) {
    if (size[i] > 0) {
      chunks->push_back(cands[i].s);
      sizes->push_back(size[i]);
    }
  }
}

void Scheduler::Update(const StepPlan& plan, const std::vector<int32_t>& sampled) {
  FS_CHECK(sampled.size() == plan.seqs.size());
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const ScheduledSeq& ss = plan.seqs[i];
    auto it = seqs_.find(ss.seq_id);
    if (it == seqs_.end()) continue;  // aborted while the step ran
    Sequence* s = it->second.get();
    if (s->state != SeqState::kRunning || s->num_computed != ss.start)
      continue;  // preempted meanwhile
    s->num_computed += ss.num_tokens;
    kv_->CacheComputed(*s);
    if (s->prompt_logits_from >= 0 && ss.logits_rows > 0) {
      // The step's rows gave the prompt logprobs up to its end.
      const int end = ss.start + ss.num_tokens;
      s->prompt_logits_from = end >= s->prompt_len - 1 ? -1 : std::max(s->prompt_logits_from, end);
    }
    if (!ss.sample) continue;
    const int32_t tok = sampled[i];
    s->tokens.push_back(tok);
    dp_load_[s->dp_rank]++;
    if (std::find(s->stop_token_ids.begin(), s->stop_token_ids.end(), tok) !=
        s->stop_token_ids.end()) {
      FinishSeq(s, FinishReason::kStop);
    } else if (s->output_len() >= s->max_new_tokens || s->len() >= config_.max_model_len) {
      FinishSeq(s, FinishReason::kLength);
    }
  }
}

std::vector<int64_t> Scheduler::Reconfigure(const Plan& plan, std::vector<int64_t> capacity,
                                            std::vector<int64_t>* rerouted) {
  // The cached blocks running sequences name survive the plan change (the
  // block manager moves their pages once); the others are dropped.
  std::vector<int64_t> preempted;
  plan_ = plan;
  cost_ = StepCost(plan, model_, speed_);
  dp_load_.assign(plan.num_devices, 0);
  std::vector<Sequence*> all(running_.begin(), running_.end());
  all.insert(all.end(), waiting_.begin(), waiting_.end());
  // Sequences sharing cached blocks (directly or through others) form a
  // group; with DP heads a group's blocks live on one DP rank, so the group
  // goes to one: its first sequence's if that rank is still active, else the
  // router's choice.
  const std::vector<Sequence*> groups_in_order(running_.begin(), running_.end());
  std::vector<int> group(groups_in_order.size());
  for (size_t i = 0; i < group.size(); ++i) group[i] = static_cast<int>(i);
  auto root = [&](int i) {
    while (group[i] != i) i = group[i] = group[group[i]];
    return i;
  };
  std::unordered_map<int32_t, int> first_sharer;  // cached block -> a sequence naming it
  for (size_t i = 0; i < groups_in_order.size(); ++i) {
    for (int32_t id : kv_->CachedIds(groups_in_order[i]->id)) {
      if (id < 0) continue;
      auto [it, fresh] = first_sharer.emplace(id, static_cast<int>(i));
      if (!fresh) group[root(static_cast<int>(i))] = root(it->second);
    }
  }
  const bool dp_heads = plan.num_dp_heads_total() > 0;
  std::unordered_map<int, int> group_rank;
  for (Sequence* s : all) {
    if (s->dp_rank >= 0 && plan.IsActive(s->dp_rank)) dp_load_[s->dp_rank] += s->len();
  }
  auto move_to = [&](Sequence* s, int rank) {
    if (s->kv_blocks > 0 && !counted_rank_.count(s->id)) counted_rank_[s->id] = s->dp_rank;
    if (s->dp_rank >= 0 && plan.IsActive(s->dp_rank)) dp_load_[s->dp_rank] -= s->len();
    s->dp_rank = rank;
    dp_load_[s->dp_rank] += s->len();
    if (rerouted) rerouted->push_back(s->id);
  };
  for (size_t i = 0; i < groups_in_order.size(); ++i) {
    Sequence* s = groups_in_order[i];
    if (s->dp_rank < 0) continue;
    const int g = root(static_cast<int>(i));
    auto known = group_rank.find(g);
    if (known == group_rank.end()) {
      if (!plan.IsActive(s->dp_rank)) move_to(s, Route());
      group_rank[g] = s->dp_rank;
    } else if (s->dp_rank != known->second && (dp_heads || !plan.IsActive(s->dp_rank))) {
      // As the router weighs a hit against load: a group stays together
      // while its rank's work is within prefix_affinity_tokens of the
      // least-loaded rank's. Past that, the sequence stops sharing: it is
      // preempted and comes back as a prefill routed by load (a plan that
      // gains DP heads would otherwise put every sharer of a common prefix
      // on one rank).
      int least = known->second;
      for (int d : plan.active) least = dp_load_[d] < dp_load_[least] ? d : least;
      if (dp_heads &&
          dp_load_[known->second] + s->len() - dp_load_[least] > config_.prefix_affinity_tokens) {
        preempted.push_back(s->id);
        Preempt(s, nullptr);  // (under DP heads: its rank's load dropped, routed afresh)
        continue;
      }
      move_to(s, known->second);
    }
  }
  for (Sequence* s : waiting_) {
    if (s->dp_rank >= 0 && !plan.IsActive(s->dp_rank)) move_to(s, Route());
  }
  // Requests that no longer fit the devices' memory even alone would wait forever.
  const KvBlockManager probe(plan, kv_->block_size(), capacity);
  for (Sequence* s : all) {
    bool fits = true;
    for (int d : plan.active) fits &= probe.FitsAlone(d, s->prompt_len + s->max_new_tokens);
    if (!fits) {
      s->error = "the request no longer fits in the remaining devices' KV memory";
      FinishSeq(s, FinishReason::kError);
    }
  }
  // The newest running sequences give way until the rest fit.
  for (;;) {
    std::vector<const Sequence*> live(running_.begin(), running_.end());
    const std::vector<int64_t> need = kv_->PagesUnder(plan, live);
    bool over = false;
    for (int d : plan.active)
      over |= need[d] > (d < static_cast<int>(capacity.size()) ? capacity[d] : 0);
    if (!over || running_.empty()) {
      kv_->Reconfigure(plan, std::move(capacity), live);
      counted_rank_.clear();
      break;
    }
    preempted.push_back(running_.back()->id);
    Preempt(running_.back(), nullptr);
  }
  return preempted;
}

Scheduler::KeptSharing Scheduler::KeepRestorableSharing(
    const std::unordered_map<int64_t, int>& restore) {
  KeptSharing out;
  if (!kv_->prefix_cache()) return out;
  const int bs = kv_->block_size();
  auto restored = [&](const Sequence* s) {
    auto it = restore.find(s->id);
    return it == restore.end() ? s->num_computed : it->second;
  };
  // The sequence's cached blocks (ids, -1: its own) that its restore writes whole.
  auto restored_ids = [&](const Sequence* s) {
    const std::span<const int32_t> ids = kv_->CachedIds(s->id);
    return ids.first(std::min<size_t>(ids.size(), restored(s) / bs));
  };
  // Cached blocks some sharer restores whole.
  std::unordered_set<int32_t> can_restore;
  for (const Sequence* s : running_) {
    for (int32_t id : restored_ids(s))
      if (id >= 0) can_restore.insert(id);
  }
  std::unordered_map<int32_t, int64_t> keeper;  // a block no sharer restores -> who writes it
  const std::vector<Sequence*> run(running_.begin(), running_.end());
  for (Sequence* s : run) {
    const int from = restored(s) / bs;  // the first block it writes again
    const std::span<const int32_t> ids = kv_->CachedIds(s->id);
    bool conflict = false;
    std::vector<int32_t> keeps;
    for (size_t b = from; b < ids.size(); ++b) {
      const int32_t id = ids[b];
      if (id < 0 || kv_->CachedBlockRefs(id) == 1) continue;
      auto k = keeper.find(id);
      if (can_restore.count(id) || (k != keeper.end() && k->second != s->id)) {
        conflict = true;
        break;
      }
      keeps.push_back(id);
    }
    if (conflict) {
      out.preempted.push_back(s->id);
      Preempt(s, nullptr);
      continue;
    }
    for (int32_t id : keeps) keeper[id] = s->id;
  }
  for (const Sequence* s : running_) kv_->OwnFrom(s->id, restored(s) / bs);
  kv_->DropUnreferencedCache();
  // Each cached block is restored by the first sequence that names it: the
  // others' restores start past the leading blocks already restored.
  std::unordered_set<int32_t> restored_blocks;
  for (const Sequence* s : running_) {
    const std::span<const int32_t> ids = restored_ids(s);
    size_t from = 0;
    while (from < ids.size() && ids[from] >= 0 && restored_blocks.count(ids[from])) ++from;
    if (from > 0) out.restore_from[s->id] = static_cast<int>(from) * bs;
    for (int32_t id : ids)
      if (id >= 0) restored_blocks.insert(id);
  }
  return out;
}

void Scheduler::ResendKvTables(const std::vector<int64_t>& ids) {
  for (int64_t id : ids) kv_->MarkUnsent(id);
}

void Scheduler::RollBack(int64_t id, int num_computed) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return;
  Sequence* s = it->second.get();
  s->num_computed = std::min(s->num_computed, std::max(0, num_computed));
}

}  // namespace failsafe
