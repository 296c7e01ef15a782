#include "sim/sim_executor.h"

#include <algorithm>
#include <cmath>

#include "common/rng.h"
#include "placement/replan.h"

namespace failsafe {

namespace {

int64_t ToNanos(double seconds) { return std::llround(seconds * 1e9); }

}  // namespace

Result<std::unique_ptr<SimExecutor>> SimExecutor::Create(const SimExecutorOptions& o,
                                                         FakeClock* clock) {
  if (clock == nullptr) return InvalidArgument("a simulated executor needs a virtual clock");
  auto e = std::unique_ptr<SimExecutor>(new SimExecutor());
  e->options_ = o;
  e->clock_ = clock;
  std::vector<int> alive = o.alive;
  if (alive.empty()) {
    for (int d = 0; d < o.num_devices; ++d) alive.push_back(d);
  }
  FS_ASSIGN_OR_RETURN(e->plan_, MakePlan(o.model, o.policy, o.num_devices, alive));
  e->cost_ = std::make_unique<ClusterCostModel>(e->plan_, o.model, o.hw);
  FS_ASSIGN_OR_RETURN(e->capacity_, e->KvCapacityFor(e->plan_));
  for (int d : e->plan_.active) {
    if (e->capacity_[d] <= 0) {
      return ResourceExhausted(
          "{} devices cannot hold the model (device {} needs {:.1f} GB for "
          "weights)",
          e->plan_.active.size(), d, e->cost_->WeightBytes(d) / 1e9);
    }
  }
  if (o.backup_bytes >= 0) {
    int64_t budget = o.backup_bytes;
    if (budget == 0) {
      // Every block of every sequence the pools can hold: a block takes a
      // page for each KV slot (layer, head group) on some device at least.
      int64_t pages = 0;
      for (int64_t p : e->capacity_) pages += p;
      const int64_t blocks =
          o.max_seqs + pages / std::max(1, o.model.num_layers * o.model.num_kv_heads);
      const int64_t block_bytes = int64_t{2} * o.model.num_layers * o.model.num_kv_heads *
                                  o.block_size * o.model.head_dim * 4;
      budget = blocks * block_bytes;
    }
    // The region is sparse: only what the backup's books touch is backed
    // by memory.
    FS_ASSIGN_OR_RETURN(
        e->backup_, HostKvBackup::Create(o.model, o.block_size, budget, o.max_seqs, o.num_devices));
  }
  e->loss_.assign(o.num_devices, DeviceLoss{});
  e->down_.assign(o.num_devices, false);
  e->speed_.assign(o.num_devices, 1.0);
  e->kv_slot_tokens_.assign(o.num_devices, 0);
  e->deadline_ = StepDeadline(o.deadline);
  for (int d = 0; d < o.num_devices; ++d) {
    if (!std::count(alive.begin(), alive.end(), d)) {
      e->loss_[d] = {clock->NowNanos(), clock->NowNanos(), "not started"};
      e->down_[d] = true;
    }
  }
  e->CacheSlots();
  return e;
}

void SimExecutor::CacheSlots() {
  const int n = plan_.num_devices;
  slots_.assign(n, std::vector<std::vector<int>>(n));
  writers_.assign(n, {});
  for (int d : plan_.active) {
    for (int rank : plan_.active) slots_[d][rank] = plan_.KvSlots(d, rank);
  }
  for (int rank : plan_.active) writers_[rank] = plan_.KvWriters(rank);
}

int32_t SimExecutor::SyntheticToken(int64_t seq_id, int position) const {
  const uint64_t h = HashCombine(static_cast<uint64_t>(seq_id), static_cast<uint64_t>(position));
  return static_cast<int32_t>(h % static_cast<uint64_t>(options_.model.vocab_size));
}

Status SimExecutor::FailIfDown(const std::vector<int>& active) {
  // The call fails when the first of its lost devices is found (a hang
  // found later does not delay a kill found sooner).
  int first = -1;
  for (int d : active) {
    if (!Up(d) && (first < 0 || loss_[d].detected_ns < loss_[first].detected_ns)) first = d;
  }
  if (first < 0) return Status::Ok();
  const DeviceLoss& loss = loss_[first];
  if (clock_->NowNanos() < loss.detected_ns) clock_->Set(loss.detected_ns);
  return Unavailable("device {} was lost: {}", first, loss.reason);
}

Result<StepOutput> SimExecutor::Step(const StepBatch& batch, StepTiming* timing) {
  FS_RETURN_IF_ERROR(FailIfDown(plan_.active));
  StepPlan& step = step_;  // reused: its vector keeps its capacity
  step.seqs.clear();
  tokens_.assign(batch.num_logits_rows, -1);
  for (const StepSeq& s : batch.seqs) {
    // A DP rank names a device of the plan (it indexes the backup writers),
    // and an active one when the plan has DP heads.
    if (s.dp_rank < 0 || s.dp_rank >= plan_.num_devices)
      return InvalidArgument("sequence {}: DP rank {} is not a device of the plan (0-{})", s.seq_id,
                             s.dp_rank, plan_.num_devices - 1);
    if (!plan_.IsActive(s.dp_rank) && plan_.num_dp_heads_total() > 0)
      return InvalidArgument("sequence {}: DP rank {} is not active", s.seq_id, s.dp_rank);
    ScheduledSeq ss;
    ss.seq_id = s.seq_id;
    ss.start = s.start_pos;
    ss.num_tokens = s.num_tokens;
    ss.dp_rank = s.dp_rank;
    ss.sample = s.logits_row >= 0;
    step.seqs.push_back(ss);
    const int end = s.start_pos + s.num_tokens;
    if (s.start_pos < 0 || s.num_tokens <= 0 || s.logits_row >= batch.num_logits_rows)
      return InvalidArgument("sequence {}: a malformed step entry", s.seq_id);
    // Its devices give sampled tokens, not logits: no prompt logprobs.
    if (s.logits_row >= 0 && s.logits_rows != 1)
      return InvalidArgument("sequence {}: modelled devices give no prompt logprobs", s.seq_id);
    // KV the devices did not compute arrived with the request (a decode
    // instance's prefilled prompt): it is copied to the backup as it arrives.
    const auto [held, arrived] = held_.try_emplace(s.seq_id, s.dp_rank);
    held->second = s.dp_rank;
    // KV in use: the sequence's positions up to the step's end (a step
    // starting before its end rewrites what follows).
    int& len = kv_len_[s.seq_id];
    if (len != end) {
      for (int d : plan_.active) {
        kv_slot_tokens_[d] += static_cast<int64_t>(end - len) * slots_[d][s.dp_rank].size();
      }
      len = end;
    }
    if (s.logits_row >= 0) tokens_[s.logits_row] = SyntheticToken(s.seq_id, end);
    if (backup_ && s.backup_slot >= 0) {
      backup_->CopiedByStep(s.seq_id, writers_[s.dp_rank], arrived ? 0 : s.BackupStart(), end);
    }
  }
  // Host-tier prefix hits: each device copies the blocks' slots it caches
  // from the host before computing, at the host-to-device bandwidth; the
  // slowest device's copy delays the step.
  std::vector<const StepSeq*> copies;
  for (const StepSeq& s : batch.seqs) {
    if (s.host_blocks <= 0) continue;
    if (s.host_offset + static_cast<int64_t>(s.host_blocks) >
        static_cast<int64_t>(batch.backup_blocks.size()))
      return InvalidArgument("sequence {}: a malformed host-tier hit", s.seq_id);
    copies.push_back(&s);
  }
  double copy_s = 0;
  const double slot_bytes = static_cast<double>(cost_->KvBytesPerTokenSlot());
  for (int d : plan_.active) {
    if (copies.empty()) break;
    double bytes = 0;
    for (const StepSeq* s : copies) {
      const int rank = plan_.IsActive(s->dp_rank) ? s->dp_rank : d;
      bytes += slot_bytes * static_cast<double>(slots_[d][rank].size()) * s->host_blocks *
               options_.block_size;
    }
    copy_s = std::max(copy_s, bytes / options_.hw.pcie_bytes_per_s);
  }
  // Every device at its speed; the step waits for the slowest at each
  // all-reduce.
  ClusterStepCost& cost = step_cost_;
  cost_->Cost(step, speed_, &cost);
  // A device that goes longer than the deadline without reaching a
  // collective is hung (the hang watch declares it lost, and the group is
  // aborted): the step fails when the deadline passes.
  const int64_t deadline_ms =
      deadline_.DeadlineMs(batch.estimated_s, 1 + 2 * options_.model.num_layers);
  const int64_t now = clock_->NowNanos();
  for (int d : plan_.active) {
    if (cost.longest_segment_s[d] * 1e3 <= static_cast<double>(deadline_ms)) continue;
    loss_[d] = {now, now + deadline_ms * 1000000,
                fmt::format("no progress for {} ms (running at {:.3g}x)", deadline_ms, speed_[d])};
    down_[d] = true;
  }
  FS_RETURN_IF_ERROR(FailIfDown(plan_.active));
  const int64_t ns = ToNanos(cost.seconds + copy_s);
  clock_->Advance(ns);
  deadline_.Observe(batch.estimated_s, ns);
  if (timing != nullptr) {
    // What each device measures of its own part, as the workers report it.
    *timing = StepTiming{};
    timing->wall_ns = ns;
    timing->emulated_ns = ns;
    for (int d : plan_.active) {
      const int64_t compute = ToNanos(cost.compute_s[d]);
      timing->devices.push_back(d);
      timing->device_compute_ns.push_back(compute);
      timing->device_compute_wall_ns.push_back(compute);
      timing->device_attention_flops.push_back(cost.attention_flops[d]);
      timing->device_ffn_flops.push_back(cost.ffn_flops[d]);
      timing->device_kv_bytes.push_back(kv_slot_tokens_[d] * cost_->KvBytesPerTokenSlot());
    }
  }
  return StepOutput{nullptr, tokens_.data()};
}

Status SimExecutor::FreeSeqs(const std::vector<int64_t>& seq_ids) {
  FS_RETURN_IF_ERROR(FailIfDown(plan_.active));
  for (int64_t id : seq_ids) {
    auto it = held_.find(id);
    if (it == held_.end()) continue;
    const auto len = kv_len_.find(id);
    if (len != kv_len_.end()) {
      for (int d : plan_.active)
        kv_slot_tokens_[d] -= static_cast<int64_t>(len->second) * slots_[d][it->second].size();
      kv_len_.erase(len);
    }
    held_.erase(it);
  }
  return Status::Ok();
}

std::vector<int> SimExecutor::alive_devices() const {
  std::vector<int> out;
  const int64_t now = clock_->NowNanos();
  for (int d = 0; d < options_.num_devices; ++d) {
    if (Up(d) || loss_[d].detected_ns > now) out.push_back(d);
  }
  return out;
}

bool SimExecutor::any_down() const {
  for (int d : plan_.alive) {
    if (!Up(d)) return true;
  }
  return false;
}

DeviceLoss SimExecutor::device_loss(int device) const {
  if (device < 0 || device >= options_.num_devices || Up(device)) return {};
  if (loss_[device].detected_ns > clock_->NowNanos()) return {};
  return loss_[device];
}

Status SimExecutor::CheckHealth(int64_t timeout_ms) {
  // A heartbeat finds every device that is down by its detection instant.
  int64_t found = 0;
  for (int d : plan_.alive) {
    if (!Up(d)) found = std::max(found, loss_[d].detected_ns);
  }
  if (found > clock_->NowNanos()) clock_->Set(found);
  return Status::Ok();
}

Result<std::vector<int64_t>> SimExecutor::KvCapacityFor(const Plan& plan) const {
  if (!options_.kv_pages.empty()) {
    if (static_cast<int>(options_.kv_pages.size()) < plan.num_devices)
      return InvalidArgument("a KV pool for every device is needed");
    return options_.kv_pages;
  }
  ClusterCostModel cost(plan, options_.model, options_.hw);
  return cost.KvCapacityPages(options_.block_size, options_.max_batch_tokens);
}

Result<ApplyReport> SimExecutor::ApplyPlan(const Plan& next, RecoveryMode mode,
                                           const DeviceRestores& seqs) {
  FS_RETURN_IF_ERROR(FailIfDown(next.active));
  const int64_t start = clock_->NowNanos();
  auto next_cost = std::make_unique<ClusterCostModel>(next, options_.model, options_.hw);
  FS_ASSIGN_OR_RETURN(std::vector<int64_t> capacity, KvCapacityFor(next));
  const HardwareProfile& hw = options_.hw;
  const PlanDiff diff = DiffPlans(plan_, next);
  const int n = static_cast<int>(next.active.size());
  for (const std::vector<SeqRestore>& list : seqs) {
    for (const SeqRestore& sr : list) {
      if (sr.dp_rank < 0 || sr.dp_rank >= next.num_devices)
        return InvalidArgument("sequence {}: DP rank {} is not a device of the plan (0-{})",
                               sr.seq_id, sr.dp_rank, next.num_devices - 1);
    }
  }
  const double slot_bytes = static_cast<double>(next_cost->KvBytesPerTokenSlot());
  ApplyReport report;
  double weights_s = 0, kv_s = 0;
  std::unordered_map<int64_t, int> held;
  for (int d : next.active) {
    // Weights: everything again (a fresh plan), or what the device gains.
    double pcie = 0, nvlink = 0;
    if (mode == RecoveryMode::kRecompute || mode == RecoveryMode::kHost) {
      pcie = static_cast<double>(next_cost->WeightBytes(d));
    } else if (mode == RecoveryMode::kFull) {
      // A DP head group becoming a TP head keeps the rows the device held
      // as a DP head (an active device holds every DP group): nothing moves.
      const int g = next.shape.group_size;
      auto was_dp = [&](int layer, int group) {
        return plan_.IsActive(d) && plan_.IsDpHead(layer, group);
      };
      int64_t queries = 0, kv_heads = 0;
      for (const auto& item : diff.gained_tp_queries[d])
        queries += !was_dp(item.layer, item.index / g);
      for (const auto& item : diff.gained_tp_heads[d]) kv_heads += !was_dp(item.layer, item.index);
      pcie += static_cast<double>(queries * next_cost->QueryBytes() +
                                  kv_heads * next_cost->KvHeadBytes() +
                                  diff.gained_shards[d].size() * next_cost->ShardBytes() +
                                  diff.gained_chunks[d].size() * next_cost->ChunkBytes());
      // A head group new to the DP set: a distinct piece from the host each,
      // the rest from the other devices.
      for (const auto& item : diff.gained_dp_heads[d]) {
        if (plan_.IsActive(d) && plan_.HoldsTpHead(d, item.layer, item.index)) continue;
        const double head = static_cast<double>(next_cost->HeadBytes());
        if (!plan_.IsDpHead(item.layer, item.index)) {
          pcie += head / n;
          nvlink += head * (n - 1) / n;
        } else {
          pcie += head;
        }
      }
    }
    // KV: the slots the device restores (the block manager's gained slots,
    // counted as the devices' tables are), for the positions the engine
    // restores.
    double kv_bytes = 0;
    if (mode != RecoveryMode::kOracle && static_cast<size_t>(d) < seqs.size()) {
      for (const SeqRestore& sr : seqs[d]) {
        held[sr.seq_id] = sr.dp_rank;
        if (sr.restore_tokens <= 0) continue;
        kv_bytes += slot_bytes * static_cast<double>(sr.restore_slots.size()) *
                    std::max(0, sr.restore_tokens - sr.restore_from);
      }
    } else if (static_cast<size_t>(d) < seqs.size()) {
      for (const SeqRestore& sr : seqs[d]) held[sr.seq_id] = sr.dp_rank;
    }
    ApplyStats st;
    st.host_bytes = static_cast<int64_t>(pcie);
    st.peer_bytes = static_cast<int64_t>(nvlink);
    st.kv_restored_bytes = static_cast<int64_t>(kv_bytes);
    double w = 0, k = 0;
    if (mode == RecoveryMode::kFull) {
      // Weights and KV move at once (the device restores KV while its
      // weights move): the host link carries its host weights and its KV
      // in fair shares (the smaller finishes at twice its own time, the
      // other when the link has carried both); the weights' peer part (new
      // DP head groups gathered over NVLink) follows their host part, as
      // the device gathers them last.
      const double host_w = pcie / hw.pcie_bytes_per_s, kv = kv_bytes / hw.pcie_bytes_per_s;
      w = (host_w <= kv ? 2 * host_w : host_w + kv) + nvlink / hw.nvlink_bytes_per_s;
      k = kv <= host_w ? 2 * kv : host_w + kv;
      weights_s = std::max({weights_s, w, k});
    } else {
      // The whole share, then the KV: every device's phase waits for the
      // slowest.
      w = pcie / hw.pcie_bytes_per_s + nvlink / hw.nvlink_bytes_per_s;
      k = kv_bytes / hw.pcie_bytes_per_s;
      weights_s = std::max(weights_s, w);
      kv_s = std::max(kv_s, k);
    }
    st.weights_ns = st.weights_wall_ns = ToNanos(w);
    st.kv_ns = st.kv_wall_ns = ToNanos(k);
    report.devices.push_back(d);
    report.stats.push_back(st);
  }
  // The devices form a group, then move weights and KV (full: at once,
  // weights_s is each device's both; otherwise weights, then KV); serving
  // waits for the slowest device.
  report.group_ns = ToNanos(options_.group_s);
  clock_->Advance(report.group_ns + ToNanos(weights_s) + ToNanos(kv_s));
  report.wall_ns = clock_->NowNanos() - start;
  plan_ = next;
  cost_ = std::move(next_cost);
  capacity_ = std::move(capacity);
  held_ = std::move(held);  // a plan change drops every sequence it does not list
  CacheSlots();
  // KV in use: what each listed sequence keeps (restored or in place).
  std::unordered_map<int64_t, int> kv_len;
  std::fill(kv_slot_tokens_.begin(), kv_slot_tokens_.end(), 0);
  for (const std::vector<SeqRestore>& list : seqs) {
    for (const SeqRestore& sr : list) {
      if (kv_len.count(sr.seq_id) || !held_.count(sr.seq_id)) continue;
      const auto was = kv_len_.find(sr.seq_id);
      const int len = std::min(sr.restore_tokens, was != kv_len_.end() ? was->second : 0);
      kv_len[sr.seq_id] = std::max(0, len);
      for (int d : plan_.active) {
        kv_slot_tokens_[d] +=
            static_cast<int64_t>(std::max(0, len)) * slots_[d][held_[sr.seq_id]].size();
      }
    }
  }
  kv_len_ = std::move(kv_len);
  return report;
}

Status SimExecutor::KillDevice(int device) {
  if (device < 0 || device >= options_.num_devices) return InvalidArgument("no device {}", device);
  if (!Up(device)) return FailedPrecondition("device {} is not alive", device);
  const int64_t now = clock_->NowNanos();
  loss_[device] = {now, now + ToNanos(options_.hw.failure_detect_s), "its process exited"};
  down_[device] = true;
  return Status::Ok();
}

Status SimExecutor::SetDeviceSpeed(int device, double speed) {
  if (device < 0 || device >= options_.num_devices) return InvalidArgument("no device {}", device);
  if (!(speed > 0 && speed <= 1))
    return InvalidArgument("a device's speed is in (0, 1], not {}", speed);
  if (!Up(device)) return FailedPrecondition("device {} is not alive", device);
  speed_[device] = speed;
  return Status::Ok();
}

void SimExecutor::ChargePlanning(const Plan& next, int64_t sequences) {
  clock_->Advance(ToNanos(ReplanSeconds(options_.hw, next.shape, sequences)));
}

void SimExecutor::Configure(EngineOptions* options) {
  options->clock = clock_;
  options->on_planned = [this](const Plan& next, int64_t sequences) {
    ChargePlanning(next, sequences);
  };
  options->accept_prefilled = true;
}

Status SimExecutor::HangDevice(int device, double detect_s) {
  if (device < 0 || device >= options_.num_devices) return InvalidArgument("no device {}", device);
  if (!Up(device)) return FailedPrecondition("device {} is not alive", device);
  const int64_t now = clock_->NowNanos();
  loss_[device] = {now, now + ToNanos(detect_s),
                   fmt::format("no progress for {:.0f} ms", detect_s * 1e3)};
  down_[device] = true;
  return Status::Ok();
}

Status SimExecutor::SpawnDevice(int device, bool wait) {
  if (device < 0 || device >= options_.num_devices) return InvalidArgument("no device {}", device);
  if (Up(device)) return FailedPrecondition("device {} is alive", device);
  // The engine must have seen it go before a new one takes its place.
  if (loss_[device].detected_ns > clock_->NowNanos()) clock_->Set(loss_[device].detected_ns);
  loss_[device] = {};
  down_[device] = false;
  speed_[device] = 1.0;
  return Status::Ok();
}

}  // namespace failsafe
