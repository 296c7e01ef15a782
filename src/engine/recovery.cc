// Engine recovery: a new plan for the alive devices, weights and KV moved to
// it, sequences rolled back to what could be restored.
#include <algorithm>

#include "common/clock.h"
#include "common/log.h"
#include "engine/engine.h"
#include "engine/kv_backup.h"
#include "placement/replan.h"

namespace failsafe {

namespace {

// The devices that cache the KV of (layer, head) for a sequence with DP rank
// `dp_rank` under `plan`: its DP rank, or every holder of a TP head group
// (several if it is replicated).
std::vector<int> KvHolders(const Plan& plan, int layer, int head, int dp_rank) {
  if (plan.IsDpHead(layer, head)) return {dp_rank};
  return plan.TpHolders(layer, head);
}

}  // namespace

Status Engine::CheckHealth(int64_t timeout_ms) {
  if (!executor_->supports_recovery() || degraded_) return Status::Ok();
  FS_RETURN_IF_ERROR(executor_->CheckHealth(timeout_ms));
  if (executor_->alive_devices().size() < executor_->plan().alive.size()) {
    return Recover(executor_->plan().alive, {}, MonotonicNanos());
  }
  return Status::Ok();
}

Status Engine::Rejoin(int device) {
  if (!executor_->supports_recovery())
    return FailedPrecondition("this engine has no device processes");
  FS_RETURN_IF_ERROR(executor_->SpawnDevice(device));
  return Recover(executor_->plan().alive, {device}, MonotonicNanos());
}

Status Engine::Recover(const std::vector<int>& /*unused*/, const std::vector<int>& joined,
                       int64_t step_failed_ns) {
  RecoveryReport r;
  r.mode = options_.recovery;
  r.joined_devices = joined;
  const ModelConfig& config = executor_->config();
  HostKvBackup* backup = executor_->backup();
  // Detection and abort, for the devices found dead.
  int64_t last_detect = 0;
  const std::vector<int> now_alive = executor_->alive_devices();
  for (int d : executor_->plan().alive) {
    if (std::count(now_alive.begin(), now_alive.end(), d)) continue;
    r.failed_devices.push_back(d);
    const int64_t detected = executor_->death_detected_ns(d), killed = executor_->killed_ns(d);
    last_detect = std::max(last_detect, detected);
    if (killed > 0 && detected >= killed)
      r.detect_ms = std::max(r.detect_ms, (detected - killed) * 1e-6);
  }
  if (last_detect > 0 && step_failed_ns > last_detect)
    r.abort_ms = (step_failed_ns - last_detect) * 1e-6;

  bool conservative = degraded_;  // devices may hold a mix of plans
  // Sequences' DP ranks before any rerouting.
  std::unordered_map<int64_t, int> prev_rank;
  for (const Sequence* s : scheduler_->Running()) prev_rank[s->id] = s->dp_rank;
  for (int attempt = 1;; ++attempt) {
    r.attempts = attempt;
    const int64_t t0 = MonotonicNanos();
    const Plan prev = executor_->plan();
    const std::vector<int> alive = executor_->alive_devices();
    Result<Plan> next = options_.recovery == RecoveryMode::kFull
                            ? Replan(prev, config, alive)
                            : MakePlan(config, prev.policy, prev.num_devices, alive);
    Result<std::vector<int64_t>> capacity =
        next.ok() ? executor_->KvCapacityFor(*next) : next.status();
    if (capacity.ok()) {
      // Enough devices means room for every request we hold, each alone.
      KvAccounting probe(*next, executor_->block_size(), *capacity);
      int largest = 0;
      for (const Sequence* s : scheduler_->Running())
        largest = std::max(largest, s->prompt_len + s->max_new_tokens);
      for (const Sequence* s : scheduler_->Waiting())
        largest = std::max(largest, s->prompt_len + s->max_new_tokens);
      for (int d : next->active) {
        if (!probe.FitsAlone(d, largest)) {
          capacity =
              ResourceExhausted("a request of {} tokens does not fit in their KV memory", largest);
          break;
        }
      }
    }
    if (!capacity.ok()) {
      degraded_ = true;
      degraded_reason_ = fmt::format("{} device(s) alive cannot serve the model: {}", alive.size(),
                                     capacity.status().message());
      FS_LOG_ERROR("{}", degraded_reason_);
      recoveries_.push_back(r);
      return Unavailable("{}", degraded_reason_);
    }
    std::vector<int64_t> rerouted;
    std::vector<int64_t> preempted = scheduler_->Reconfigure(*next, *capacity, &rerouted);
    Status drained = executor_->DrainBackup();
    if (!drained.ok()) {
      if (drained.code() != StatusCode::kUnavailable || executor_->alive_devices() == alive)
        return drained;
      conservative = true;
      continue;
    }
    // How far each sequence's KV can be restored.
    std::vector<SeqRestore> seqs;
    for (const Sequence* s : scheduler_->Running()) {
      SeqRestore sr;
      sr.seq_id = s->id;
      sr.dp_rank = s->dp_rank;
      int restore = s->num_computed;
      if (options_.recovery == RecoveryMode::kRecompute || !backup) {
        restore = 0;
      } else {
        const int old_rank = prev_rank.count(s->id) ? prev_rank[s->id] : s->dp_rank;
        // A slot's KV is in the backup as far as its old writer copied it.
        // It limits the restore when a device starts to cache the slot, or
        // when its writer changes (the new one continues from there).
        for (int l = 0; l < config.num_layers && restore > 0; ++l) {
          for (int h = 0; h < config.num_kv_heads; ++h) {
            const int was = prev.KvWriter(l, h, old_rank), will = next->KvWriter(l, h, s->dp_rank);
            const std::vector<int> before = KvHolders(prev, l, h, old_rank);
            bool moves = was != will || !std::count(alive.begin(), alive.end(), was) ||
                         options_.recovery == RecoveryMode::kHost || conservative;
            for (int d : KvHolders(*next, l, h, s->dp_rank))
              moves |= !std::count(before.begin(), before.end(), d);
            if (moves) restore = std::min(restore, was >= 0 ? backup->Restorable(s->id, was) : 0);
          }
        }
      }
      sr.restore_tokens = restore;
      if (backup) {
        const auto& blocks = backup->Blocks(s->id);
        sr.backup_blocks.assign(blocks.begin(), blocks.end());
      }
      seqs.push_back(std::move(sr));
    }
    r.replan_ms += (MonotonicNanos() - t0) * 1e-6;
    if (options_.before_apply) options_.before_apply(attempt);
    auto applied = executor_->ApplyPlan(*next, options_.recovery, seqs);
    if (!applied.ok()) {
      // Retry only if devices died meanwhile (otherwise it would fail again).
      if (applied.status().code() != StatusCode::kUnavailable ||
          executor_->alive_devices() == alive) {
        return applied.status();
      }
      FS_LOG_WARN("recovery attempt {} failed: {}; retrying", attempt, applied.status().ToString());
      conservative = true;  // some devices may have moved to `next` already
      continue;
    }
    r.group_ms = applied->group_ns * 1e-6;
    for (const ApplyStats& st : applied->stats) {
      r.weights_ms = std::max(r.weights_ms, st.weights_ns * 1e-6);
      r.kv_ms = std::max(r.kv_ms, st.kv_ns * 1e-6);
      r.weight_host_bytes += st.host_bytes;
      r.weight_peer_bytes += st.peer_bytes;
      r.kv_restored_bytes += st.kv_restored_bytes;
    }
    for (const SeqRestore& sr : seqs) {
      const Sequence* s = scheduler_->Find(sr.seq_id);
      if (sr.restore_tokens < s->num_computed) {
        r.tokens_recomputed += s->num_computed - sr.restore_tokens;
        recompute_target_[s->id] = std::max(recompute_target_[s->id], s->num_computed);
      }
      scheduler_->RollBack(sr.seq_id, sr.restore_tokens);
      if (backup) backup->SetProgress(sr.seq_id, next->active, sr.restore_tokens);
    }
    // Preempted sequences were freed on the devices (not in `seqs`).
    if (backup) {
      for (int64_t id : preempted) backup->Release(id);
    }
    r.finished = recompute_target_.empty();
    degraded_ = false;
    degraded_reason_.clear();
    FS_LOG_INFO("recovered ({}): {} devices active, {} tokens to recompute",
                RecoveryModeName(r.mode), next->active.size(), r.tokens_recomputed);
    recoveries_.push_back(r);
    return Status::Ok();
  }
}

}  // namespace failsafe
