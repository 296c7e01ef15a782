// Engine recovery: a new plan for the alive devices, weights and KV moved to
// it, sequences rolled back to what could be restored.
#include <algorithm>
#include <unordered_map>

#include "common/clock.h"
#include "common/log.h"
#include "engine/engine.h"
#include "engine/kv_backup.h"
#include "engine/kv_tables.h"
#include "placement/replan.h"

namespace failsafe {

namespace {

// A plan change that fails this many times without a device lost leaves the
// engine degraded (it tries again at the next health check).
constexpr int kMaxPlanAttempts = 3;

// After a plan change that rolled a sequence back to `restore` positions:
// what the backup holds of it for each active device of `next`, as the least
// over the slots the device writes under `next` of what the slot's writer
// under `prev` copied, and never past `restore`. A slot that did not move
// keeps its writer, whose own progress may lag the KV the devices hold (its
// backup slot came late, or its blocks ran out): claiming `restore` for it
// would let a later recovery restore positions that were never copied.
std::vector<std::pair<int, int>> BackedUpAfter(const HostKvBackup& backup,
                                               const ModelConfig& config, const Plan& prev,
                                               const Plan& next, int64_t seq_id, int old_rank,
                                               int new_rank, int restore) {
  std::vector<int> backed(next.num_devices, restore);
  for (int l = 0; l < config.num_layers; ++l) {
    for (int h = 0; h < config.num_kv_heads; ++h) {
      const int will = next.KvWriter(l, h, new_rank);
      if (will < 0) continue;
      const int was = prev.KvWriter(l, h, old_rank);
      backed[will] = std::min(backed[will], was >= 0 ? backup.Restorable(seq_id, was) : 0);
    }
  }
  std::vector<std::pair<int, int>> out;
  for (int d : next.active) out.emplace_back(d, backed[d]);
  return out;
}

}  // namespace

Status Engine::CheckHealth(int64_t timeout_ms) {
  if (!executor_->supports_recovery()) return Status::Ok();
  FS_RETURN_IF_ERROR(executor_->CheckHealth(timeout_ms));
  const std::vector<int> alive = executor_->alive_devices();
  // Degraded for lack of devices and none came or went: nothing to try.
  if (degraded_ && !recovery_failed_ && alive == degraded_alive_) return Status::Ok();
  if (alive.size() < executor_->plan().alive.size() || recovery_failed_) return Recover({}, 0);
  return Status::Ok();
}

Status Engine::Rejoin(int device, bool wait) {
  if (!executor_->supports_recovery())
    return FailedPrecondition("this engine has no device processes");
  FS_RETURN_IF_ERROR(executor_->SpawnDevice(device, wait));
  slow_.DeviceReplaced(device);
  return Recover({device}, 0);
}

void Engine::SetDegraded(const std::string& why) {
  degraded_ = true;
  degraded_reason_ = why;
  degraded_alive_ = executor_->alive_devices();
  FS_LOG_ERROR("{}", why);
}

RecoveryReport* Engine::OpenReport(int64_t now_ns) {
  if (!report_open_ || recoveries_.empty()) {
    recoveries_.emplace_back();
    recoveries_.back().mode = options_.recovery;
    recoveries_.back().detected_ns = now_ns;
    recoveries_.back().failed_ns = now_ns;
    report_open_ = true;
  }
  return &recoveries_.back();
}

Status Engine::Recover(const std::vector<int>& joined, int64_t step_failed_ns) {
  RecoveryReport* r = OpenReport(clock_->NowNanos());
  r->joined_devices.insert(r->joined_devices.end(), joined.begin(), joined.end());
  // Survivors left the failed step when it returned.
  if (step_failed_ns > 0) {
    int64_t first_detected = 0;
    for (int d : executor_->plan().alive) {
      const DeviceLoss loss = executor_->device_loss(d);
      if (loss.detected_ns > 0 && (first_detected == 0 || loss.detected_ns < first_detected))
        first_detected = loss.detected_ns;
    }
    if (first_detected > 0 && step_failed_ns > first_detected)
      r->abort_ms += (step_failed_ns - first_detected) * 1e-6;
  }
  return RecoverOnce(r);
}

Result<Plan> Engine::NextPlan(const Plan& prev, const std::vector<int>& alive) const {
  const ModelConfig& config = executor_->config();
  const std::vector<double>* shares = slow_.uneven() ? &slow_.shares() : nullptr;
  const Policy policy =
      options_.policy_for ? options_.policy_for(static_cast<int>(alive.size())) : prev.policy;
  // The oracle (a simulated executor moves nothing) changes plans as `full` does.
  if (options_.recovery == RecoveryMode::kFull || options_.recovery == RecoveryMode::kOracle)
    return Replan(prev, config, alive, shares, policy);
  FS_ASSIGN_OR_RETURN(Plan fresh, MakePlan(config, policy, prev.num_devices, alive));
  if (!shares) return fresh;
  return Replan(fresh, config, alive, shares);
}

void Engine::WatchSpeeds(const StepTiming& timing) {
  slow_.Observe(timing, clock_->NowNanos());
  if (!options_.rebalance_slow || degraded_ || !executor_->supports_recovery()) return;
  std::vector<double> shares;
  std::string why;
  if (!slow_.ProposeShares(&shares, &why)) return;
  FS_LOG_WARN("rebalancing: {}", why);
  const std::vector<double> before = slow_.shares();
  slow_.PlanChanged(shares);
  RecoveryReport* r = OpenReport(clock_->NowNanos());
  r->rebalance = true;
  r->causes.push_back(why);
  r->shares = shares;
  if (Status st = RecoverOnce(r); !st.ok()) {
    FS_LOG_WARN("rebalancing failed: {}", st.ToString());
    slow_.PlanChanged(before);
  }
}

// Devices lost since the report opened (a cascade adds to the same report).
void Engine::NoteLosses(RecoveryReport* r) {
  const std::vector<int> alive = executor_->alive_devices();
  for (int d : executor_->plan().alive) {
    const DeviceLoss loss = executor_->device_loss(d);
    if (loss.detected_ns == 0 || std::count(alive.begin(), alive.end(), d) ||
        std::count(r->failed_devices.begin(), r->failed_devices.end(), d)) {
      continue;
    }
    r->failed_devices.push_back(d);
    r->causes.push_back(fmt::format("device {}: {}", d, loss.reason));
    const bool first = r->failed_devices.size() == 1 && r->joined_devices.empty();
    if (first || loss.detected_ns < r->detected_ns) r->detected_ns = loss.detected_ns;
    const int64_t failed = loss.failed_ns > 0 ? loss.failed_ns : loss.detected_ns;
    if (first || failed < r->failed_ns) r->failed_ns = failed;
    r->detect_ms = (r->detected_ns - r->failed_ns) * 1e-6;
  }
}

// Phase 1, the plan: the KV pages each device has under `next`, if it has
// room for every request the engine holds, each alone.
Result<std::vector<int64_t>> Engine::CapacityFor(const Plan& next) {
  Result<std::vector<int64_t>> capacity = executor_->KvCapacityFor(next);
  if (!capacity.ok()) return capacity;
  // Enough devices means room for every request we hold, each alone.
  KvBlockManager probe(next, executor_->block_size(), *capacity);
  int largest = 0;
  for (const Sequence* s : scheduler_->Running())
    largest = std::max(largest, s->prompt_len + s->max_new_tokens);
  for (const Sequence* s : scheduler_->Waiting())
    largest = std::max(largest, s->prompt_len + s->max_new_tokens);
  for (int d : next.active) {
    if (!probe.FitsAlone(d, largest)) {
      capacity =
          ResourceExhausted("a request of {} tokens does not fit in their KV memory", largest);
      break;
    }
  }
  return capacity;
}

// Phase 2, the restore: how far each running sequence's KV can be restored
// from the host backup under `next`.
std::unordered_map<int64_t, int> Engine::RestorableTokens(const Plan& next,
                                                          const std::vector<int>& alive,
                                                          bool conservative) const {
  const ModelConfig& config = executor_->config();
  const HostKvBackup* backup = executor_->backup();
  const Plan& prev = settled_->plan;
  const std::unordered_map<int64_t, int>& prev_rank = settled_->ranks;
  std::unordered_map<int64_t, int> restore_of;
  for (const Sequence* s : scheduler_->Running()) {
    int restore = s->num_computed;
    if (options_.recovery == RecoveryMode::kRecompute || !backup) {
      restore = 0;
    } else {
      const auto known = prev_rank.find(s->id);
      const int old_rank = known != prev_rank.end() ? known->second : s->dp_rank;
      // A slot's KV is in the backup as far as its old writer copied it.
      // It limits the restore when a device starts to cache the slot, or
      // when its writer changes (the new one continues from there).
      for (int l = 0; l < config.num_layers && restore > 0; ++l) {
        for (int h = 0; h < config.num_kv_heads; ++h) {
          const int was = prev.KvWriter(l, h, old_rank), will = next.KvWriter(l, h, s->dp_rank);
          const std::vector<int> before = prev.KvHolders(l, h, old_rank);
          bool moves = was != will || !std::count(alive.begin(), alive.end(), was) ||
                       options_.recovery == RecoveryMode::kHost || conservative;
          for (int d : next.KvHolders(l, h, s->dp_rank))
            moves |= !std::count(before.begin(), before.end(), d);
          if (moves) restore = std::min(restore, was >= 0 ? backup->Restorable(s->id, was) : 0);
        }
      }
    }
    restore_of[s->id] = restore;
  }
  return restore_of;
}

// The block tables the scheduler moved to the new plan, per device; a cached
// block is restored by the first sequence that names it, the others' tables
// name its pages (SeqRestore::restore_from). `seqs`: every sequence's.
DeviceRestores Engine::RestoreTables(const Plan& next,
                                     const std::unordered_map<int64_t, int>& restore_of,
                                     const Scheduler::KeptSharing& kept, bool conservative,
                                     std::vector<SeqRestore>* seqs) const {
  const HostKvBackup* backup = executor_->backup();
  DeviceRestores tables(next.num_devices);
  for (const Sequence* s : scheduler_->Running()) {
    SeqRestore sr;
    sr.seq_id = s->id;
    sr.dp_rank = s->dp_rank;
    sr.restore_tokens = restore_of.at(s->id);
    sr.shared_blocks = scheduler_->kv().SharedBlocks(s->id);
    if (auto from = kept.restore_from.find(s->id); from != kept.restore_from.end())
      sr.restore_from = from->second;
    if (backup) {
      const auto& blocks = backup->Blocks(s->id);
      sr.backup_blocks.assign(blocks.begin(), blocks.end());
    }
    // Devices that may hold a mix of plans, or rebuild everything, keep nothing in place.
    AddRestores(scheduler_->kv(), next, *s, sr,
                conservative || (options_.recovery != RecoveryMode::kFull &&
                                 options_.recovery != RecoveryMode::kOracle),
                &tables);
    seqs->push_back(std::move(sr));
  }
  return tables;
}

// Phase 3, the apply: what the devices report it cost.
void Engine::NoteApply(RecoveryReport* r, const ApplyReport& applied) {
  r->group_ms += applied.group_ns * 1e-6;
  double weights = 0, kv = 0;
  for (const ApplyStats& st : applied.stats) {
    weights = std::max(weights, st.weights_wall_ns * 1e-6);
    kv = std::max(kv, st.kv_wall_ns * 1e-6);
    r->weight_host_bytes += st.host_bytes;
    r->weight_peer_bytes += st.peer_bytes;
    r->kv_restored_bytes += st.kv_restored_bytes;
  }
  r->weights_ms += weights;
  r->kv_ms += kv;
}

// Phase 4, settling: requests rolled back to what was restored, the backup
// on the new plan, the engine serving again.
void Engine::Settle(RecoveryReport* r, const Plan& next, const std::vector<SeqRestore>& seqs) {
  const ModelConfig& config = executor_->config();
  HostKvBackup* backup = executor_->backup();
  const Plan& prev = settled_->plan;
  const std::unordered_map<int64_t, int>& prev_rank = settled_->ranks;
  for (const SeqRestore& sr : seqs) {
    const Sequence* s = scheduler_->Find(sr.seq_id);
    if (sr.restore_tokens < s->num_computed) {
      r->tokens_recomputed += s->num_computed - sr.restore_tokens;
      recompute_target_[s->id] = std::max(recompute_target_[s->id], s->num_computed);
    }
    scheduler_->RollBack(sr.seq_id, sr.restore_tokens);
    if (!backup) continue;
    const auto known = prev_rank.find(s->id);
    const int old_rank = known != prev_rank.end() ? known->second : s->dp_rank;
    // Its indexed blocks past the rollback point give way to private ones
    // (it writes them again).
    const int kept = backup->RolledBack(s->id, sr.restore_tokens);
    for (auto [device, tokens] :
         BackedUpAfter(*backup, config, prev, next, s->id, old_rank, s->dp_rank, kept)) {
      backup->SetProgress(s->id, device, tokens);
    }
  }
  if (backup) {
    backup->SetPlan(next);
    for (const SeqRestore& sr : seqs) backup->Rebase(sr.seq_id, sr.dp_rank);
  }
  // Preempted sequences were freed on the devices (not in `seqs`).
  if (backup) {
    for (int64_t id : settled_->preempted) backup->Release(id);
  }
  settled_.reset();
  r->finished = recompute_target_.empty();
  degraded_ = false;
  recovery_failed_ = false;
  degraded_reason_.clear();
  degraded_alive_.clear();
  r->recovered_ns = clock_->NowNanos();
  slow_.PlanChanged(slow_.shares());
  FS_LOG_INFO("recovered ({}): {} devices active, {} tokens to recompute",
              RecoveryModeName(r->mode), next.active.size(), r->tokens_recomputed);
}

// A recovery in phases: the plan (NextPlan, CapacityFor), the scheduler
// moved to it, the restore (RestorableTokens, RestoreTables), the apply on
// the devices (NoteApply) and settling (Settle); a device lost on the way,
// or a failed apply, starts over with the devices left.
Status Engine::RecoverOnce(RecoveryReport* r) {
  bool conservative = degraded_;  // devices may hold a mix of plans
  if (!settled_) {
    settled_.emplace();
    settled_->plan = executor_->plan();
    for (const Sequence* s : scheduler_->Running()) settled_->ranks[s->id] = s->dp_rank;
  }
  int plan_failures = 0;
  for (;;) {
    r->attempts++;
    NoteLosses(r);
    const int64_t t0 = clock_->NowNanos();
    const std::vector<int> alive = executor_->alive_devices();
    Result<Plan> next = NextPlan(executor_->plan(), alive);
    if (next.ok() && options_.on_planned) options_.on_planned(*next, scheduler_->num_running());
    Result<std::vector<int64_t>> capacity = next.ok() ? CapacityFor(*next) : next.status();
    if (!capacity.ok()) {
      r->replan_ms += MsSince(t0);
      const StatusCode code = capacity.status().code();
      if (code == StatusCode::kResourceExhausted || code == StatusCode::kInvalidArgument) {
        // Too few devices (or too little memory): wait for a device to come back.
        recovery_failed_ = false;
        SetDegraded(fmt::format("{} device(s) alive cannot serve the model: {}", alive.size(),
                                capacity.status().message()));
      } else {
        recovery_failed_ = true;
        SetDegraded("no plan for the alive devices: " + capacity.status().ToString());
      }
      return Unavailable("{}", degraded_reason_);
    }
    std::vector<int64_t> rerouted;
    for (int64_t id : scheduler_->Reconfigure(*next, *capacity, &rerouted))
      settled_->preempted.push_back(id);
    if (Status drained = executor_->DrainBackup(); !drained.ok()) {
      if (executor_->alive_devices() != alive) {
        conservative = true;
        r->replan_ms += MsSince(t0);
        continue;
      }
      // What the devices published stays valid (it only lags): restore from it.
      FS_LOG_WARN("draining the KV backup failed: {}; restoring what it holds", drained.ToString());
    }
    const std::unordered_map<int64_t, int> restore_of =
        RestorableTokens(*next, alive, conservative);
    // Cached blocks stay shared where a sharer restores them; a sequence that
    // would write one again that others read is preempted.
    const Scheduler::KeptSharing kept = scheduler_->KeepRestorableSharing(restore_of);
    settled_->preempted.insert(settled_->preempted.end(), kept.preempted.begin(),
                               kept.preempted.end());
    std::vector<SeqRestore> seqs;
    const DeviceRestores tables = RestoreTables(*next, restore_of, kept, conservative, &seqs);
    r->replan_ms += MsSince(t0);
    if (options_.before_apply) options_.before_apply(r->attempts);
    const int64_t a0 = clock_->NowNanos();
    auto applied = executor_->ApplyPlan(*next, options_.recovery, tables);
    r->apply_ms += MsSince(a0);
    if (!applied.ok()) {
      conservative = true;  // some devices may have moved to `next` already
      if (executor_->alive_devices() != alive) {
        FS_LOG_WARN("recovery attempt {} failed: {}; retrying", r->attempts,
                    applied.status().ToString());
        continue;
      }
      if (++plan_failures < kMaxPlanAttempts) {
        FS_LOG_WARN("applying the plan failed: {}; retrying", applied.status().ToString());
        continue;
      }
      recovery_failed_ = true;
      SetDegraded("the devices could not change to a new plan: " + applied.status().ToString());
      return Unavailable("{}", degraded_reason_);
    }
    NoteApply(r, *applied);
    Settle(r, *next, seqs);
    return Status::Ok();
  }
}

}  // namespace failsafe
