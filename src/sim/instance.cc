#include "sim/instance.h"

#include <algorithm>

namespace failsafe {

Result<std::unique_ptr<SimInstance>> SimInstance::Create(const InstanceConfig& config) {
  auto s = std::unique_ptr<SimInstance>(new SimInstance());
  s->config_ = config;
  std::vector<int> alive = config.alive;
  if (alive.empty()) {
    for (int d = 0; d < config.num_devices; ++d) alive.push_back(d);
  }
  FS_ASSIGN_OR_RETURN(s->plan_, MakePlan(config.model, config.policy, config.num_devices, alive));
  s->cost_ = std::make_unique<ClusterCostModel>(s->plan_, config.model, config.hw);
  auto capacity = config.kv_pages.empty()
                      ? s->cost_->KvCapacityPages(config.block_size, config.sched.max_batch_tokens)
                      : config.kv_pages;
  if (static_cast<int>(capacity.size()) < config.num_devices)
    return InvalidArgument("a KV pool for every device is needed");
  for (int d : s->plan_.active) {
    if (capacity[d] <= 0) {
      return ResourceExhausted("{} devices cannot hold {} (device {} needs {:.1f} GB for weights)",
                               s->plan_.active.size(), "the model", d,
                               s->cost_->WeightBytes(d) / 1e9);
    }
  }
  DeviceSpeed speed{config.hw.peak_flops * config.hw.gemm_efficiency,
                    config.hw.hbm_bytes_per_s * config.hw.bandwidth_efficiency};
  if (config.scheduler_speed) speed = *config.scheduler_speed;
  SchedulerConfig sched = config.sched;
  sched.kv_page_ids = false;  // no devices to tell where to write: pages are counted
  s->scheduler_ = std::make_unique<Scheduler>(sched, s->plan_, config.model, config.block_size,
                                              capacity, speed);
  return s;
}

int64_t SimInstance::KvTokenCapacity() const {
  int64_t best = INT64_MAX;
  for (int d : plan_.active) {
    const int64_t slots = plan_.num_tp_heads_total(d) +
                          plan_.num_dp_heads_total() / std::max<size_t>(1, plan_.active.size());
    if (slots > 0) best = std::min(best, scheduler_->kv().capacity(d) / slots * config_.block_size);
  }
  return best == INT64_MAX ? 0 : best;
}

Status SimInstance::Submit(const SimRequest& r) {
  auto seq = std::make_unique<Sequence>();
  seq->id = next_id_;
  seq->prompt_len = r.input;
  if (config_.sched.prefix_cache) {
    // Real tokens: the cache hits exactly where the trace shares blocks.
    WorkloadRequest w;
    w.input_len = r.input;
    w.hash_ids = r.hash_ids;
    w.block_tokens = r.block_tokens;
    seq->tokens = WorkloadPrompt(w, static_cast<int>(next_id_), config_.prompt_seed, 0,
                                 config_.model.vocab_size);
    if (r.migrated) seq->tokens.push_back(0);
  } else {
    seq->tokens.assign(r.input + (r.migrated ? 1 : 0), 0);
  }
  seq->max_new_tokens = r.output;
  seq->arrival = r.arrival;
  if (r.migrated) seq->num_computed = r.input;
  FS_RETURN_IF_ERROR(scheduler_->Add(std::move(seq)));
  SimRequestResult res;
  res.arrival = r.arrival;
  res.input = r.input;
  if (r.migrated) res.last_token = r.arrival;  // its first token arrives with it
  index_[next_id_] = static_cast<int>(results_.size());
  results_.push_back(res);
  ++next_id_;
  return Status::Ok();
}

void SimInstance::StepOnce() {
  StepPlan plan = scheduler_->Schedule();
  preemptions_ += static_cast<int64_t>(plan.preempted.size());
  if (plan.empty()) return;
  const double dt = cost_->StepSeconds(plan);
  clock_ += dt;
  busy_s_ += dt;
  last_step_end_ = clock_;
  ++steps_;
  if (!recompute_target_.empty() && !recoveries_.empty()) {
    int recomputed = 0;
    for (const ScheduledSeq& s : plan.seqs) {
      auto it = recompute_target_.find(s.seq_id);
      if (it == recompute_target_.end()) continue;
      recomputed += std::max(0, std::min(s.start + s.num_tokens, it->second) - s.start);
      if (s.start + s.num_tokens >= it->second) recompute_target_.erase(it);
    }
    recoveries_.back().recompute_s += dt * recomputed / std::max(1, plan.num_tokens());
  }
  std::vector<int32_t> sampled(plan.seqs.size(), 0);
  tokens_in_ += plan.prefill_tokens;
  scheduler_->Update(plan, sampled);
  for (const ScheduledSeq& s : plan.seqs) {
    if (!s.sample) continue;
    auto it = index_.find(s.seq_id);
    if (it == index_.end()) continue;
    SimRequestResult& r = results_[it->second];
    if (r.first_token < 0) r.first_token = clock_;
    if (r.last_token >= 0) {
      r.max_tbt = std::max(r.max_tbt, clock_ - r.last_token);
      if (config_.record_gaps) gaps_.push_back(static_cast<float>(clock_ - r.last_token));
    }
    r.last_token = clock_;
    r.tokens++;
    ++tokens_out_;
  }
  for (auto& f : scheduler_->TakeFinished()) {
    auto it = index_.find(f->id);
    if (it != index_.end()) {
      results_[it->second].finish = clock_;
      index_.erase(it);
    }
  }
}

void SimInstance::RunUntil(double t) {
  while (clock_ < t) {
    if (scheduler_->idle()) {
      clock_ = t;
      return;
    }
    const int64_t before = steps_;
    StepOnce();
    if (steps_ == before) {  // nothing could run (waiting for memory)
      clock_ = t;
      return;
    }
  }
}

void SimInstance::RunToCompletion(double limit) {
  while (!scheduler_->idle() && clock_ < limit) {
    const int64_t before = steps_;
    StepOnce();
    if (steps_ == before) break;
  }
}

Result<SimRecovery> SimInstance::Fail(int device) {
  std::vector<int> alive = plan_.alive;
  if (!std::count(alive.begin(), alive.end(), device))
    return InvalidArgument("device {} is not alive", device);
  std::erase(alive, device);
  return ChangePlan(alive, true);
}

Result<SimRecovery> SimInstance::Rejoin(int device) {
  std::vector<int> alive = plan_.alive;
  if (std::count(alive.begin(), alive.end(), device))
    return InvalidArgument("device {} is alive", device);
  alive.push_back(device);
  std::sort(alive.begin(), alive.end());
  return ChangePlan(alive, false);
}

// The same replanning as the engine, with its data movement priced: weights
// over PCIe (and, for new DP heads, pieces over NVLink), KV from the host
// backup over PCIe, and lost KV recomputed by the following steps.
Result<SimRecovery> SimInstance::ChangePlan(const std::vector<int>& alive, bool failure) {
  SimRecovery r;
  r.mode = config_.recovery;
  r.at = clock_;
  const bool minimal =
      config_.recovery == RecoveryMode::kFull || config_.recovery == RecoveryMode::kOracle;
  FS_ASSIGN_OR_RETURN(Plan next,
                      minimal ? Replan(plan_, config_.model, alive)
                              : MakePlan(config_.model, plan_.policy, plan_.num_devices, alive));
  auto next_cost = std::make_unique<ClusterCostModel>(next, config_.model, config_.hw);
  auto capacity = next_cost->KvCapacityPages(config_.block_size, config_.sched.max_batch_tokens);
  for (int d : next.active) {
    if (capacity[d] <= 0)
      return ResourceExhausted("{} devices cannot hold the model", next.active.size());
  }
  const HardwareProfile& hw = config_.hw;
  r.detect_s = failure ? hw.failure_detect_s : 0;
  r.replan_s = 1e-3;
  const PlanDiff diff = DiffPlans(plan_, next);
  const int n = static_cast<int>(next.active.size());
  // Weights.
  double weights_s = 0;
  for (int d : next.active) {
    double pcie = 0, nvlink = 0;
    if (config_.recovery == RecoveryMode::kRecompute || config_.recovery == RecoveryMode::kHost) {
      pcie = next_cost->WeightBytes(d);
    } else if (config_.recovery == RecoveryMode::kFull) {
      pcie += diff.gained_tp_queries[d].size() * next_cost->QueryBytes() +
              diff.gained_tp_heads[d].size() * next_cost->KvHeadBytes();
      pcie += diff.gained_shards[d].size() * next_cost->ShardBytes();
      pcie += diff.gained_chunks[d].size() * next_cost->ChunkBytes();
      // A head group new to the DP set: a distinct piece from the host each,
      // the rest from the other devices.
      for (const auto& item : diff.gained_dp_heads[d]) {
        const bool brand_new = !plan_.IsDpHead(item.layer, item.index);
        const bool held = plan_.IsActive(d) && plan_.HoldsTpHead(d, item.layer, item.index);
        if (held) continue;
        if (brand_new) {
          pcie += static_cast<double>(next_cost->HeadBytes()) / n;
          nvlink += static_cast<double>(next_cost->HeadBytes()) * (n - 1) / n;
        } else {
          pcie += next_cost->HeadBytes();
        }
      }
    }
    r.weight_pcie_bytes += static_cast<int64_t>(pcie);
    r.weight_nvlink_bytes += static_cast<int64_t>(nvlink);
    weights_s = std::max(weights_s, pcie / hw.pcie_bytes_per_s + nvlink / hw.nvlink_bytes_per_s);
  }
  r.weights_s = weights_s;
  // Sequences: re-routed, preempted to fit, and their KV restored or recomputed.
  std::unordered_map<int64_t, int> old_rank;
  for (const Sequence* s : scheduler_->Running()) old_rank[s->id] = s->dp_rank;
  std::vector<int64_t> rerouted;
  preemptions_ += static_cast<int64_t>(scheduler_->Reconfigure(next, capacity, &rerouted).size());
  std::vector<double> kv_bytes(next.num_devices, 0);
  const double slot_bytes = next_cost->KvBytesPerTokenSlot();
  for (const Sequence* s : scheduler_->Running()) {
    if (config_.recovery == RecoveryMode::kRecompute) {
      r.tokens_recomputed += s->num_computed;
      if (s->num_computed > 0) recompute_target_[s->id] = s->num_computed;
      scheduler_->RollBack(s->id, 0);
      continue;
    }
    if (config_.recovery == RecoveryMode::kOracle) continue;
    const int was_rank = old_rank.count(s->id) ? old_rank[s->id] : s->dp_rank;
    for (int l = 0; l < config_.model.num_layers; ++l) {
      for (int h = 0; h < config_.model.num_kv_heads; ++h) {
        // Devices caching the slot before and after (several for a
        // replicated head group); each that starts to cache it restores it.
        const std::vector<int> before =
            plan_.IsDpHead(l, h) ? std::vector<int>{was_rank} : plan_.TpHolders(l, h);
        const std::vector<int> after =
            next.IsDpHead(l, h) ? std::vector<int>{s->dp_rank} : next.TpHolders(l, h);
        for (int d : after) {
          const bool moves = !std::count(before.begin(), before.end(), d) ||
                             config_.recovery == RecoveryMode::kHost;
          if (moves) kv_bytes[d] += slot_bytes * s->num_computed;
        }
      }
    }
  }
  double kv_s = 0;
  for (int d : next.active) {
    kv_s = std::max(kv_s, kv_bytes[d] / hw.pcie_bytes_per_s);
    r.kv_bytes += static_cast<int64_t>(kv_bytes[d]);
  }
  r.kv_s = kv_s;
  plan_ = next;
  cost_ = std::move(next_cost);
  // The step in flight is lost (its tokens are recomputed by the next step);
  // serving stops for the recovery.
  clock_ += r.stall_s();
  recoveries_.push_back(r);
  return r;
}

}  // namespace failsafe
