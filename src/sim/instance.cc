#include "sim/instance.h"

#include <algorithm>
#include <cmath>
#include <unordered_set>

namespace failsafe {

namespace {

int64_t ToNanos(double seconds) { return std::llround(seconds * 1e9); }

SimRecovery FromReport(const RecoveryReport& r) {
  SimRecovery s;
  s.mode = r.mode;
  s.at = r.failed_ns * 1e-9;
  s.detect_s = r.detect_ms * 1e-3;
  s.replan_s = (r.abort_ms + r.replan_ms) * 1e-3;
  s.apply_s = r.apply_ms * 1e-3;
  s.weights_s = r.weights_ms * 1e-3;
  s.kv_s = r.kv_ms * 1e-3;
  s.weight_pcie_bytes = r.weight_host_bytes;
  s.weight_nvlink_bytes = r.weight_peer_bytes;
  s.kv_bytes = r.kv_restored_bytes;
  s.tokens_recomputed = r.tokens_recomputed;
  s.recompute_s = r.recompute_ms * 1e-3;
  return s;
}

}  // namespace

Result<std::unique_ptr<SimInstance>> SimInstance::Create(const InstanceConfig& config) {
  auto s = std::unique_ptr<SimInstance>(new SimInstance());
  s->config_ = config;
  s->clock_ = std::make_unique<FakeClock>();
  SimExecutorOptions eo;
  eo.model = config.model;
  eo.hw = config.hw;
  eo.policy = config.policy;
  eo.num_devices = config.num_devices;
  eo.alive = config.alive;
  eo.block_size = config.block_size;
  eo.max_batch_tokens = config.sched.max_batch_tokens;
  eo.kv_pages = config.kv_pages;
  // Recompute mode restores nothing: no backup to keep.
  eo.backup_bytes = config.recovery == RecoveryMode::kRecompute ? -1 : config.backup_bytes;
  eo.max_seqs = std::max(1024, 2 * config.sched.max_num_seqs);
  FS_ASSIGN_OR_RETURN(s->executor_, SimExecutor::Create(eo, s->clock_.get()));
  EngineOptions options;
  s->executor_->Configure(&options);
  options.recovery = config.recovery;
  options.rebalance_slow = config.rebalance_slow;
  options.policy_for = config.policy_for;
  options.speed = {config.hw.peak_flops * config.hw.gemm_efficiency,
                   config.hw.hbm_bytes_per_s * config.hw.bandwidth_efficiency};
  if (config.scheduler_speed) options.speed = *config.scheduler_speed;
  SchedulerConfig sched = config.sched;
  sched.kv_page_ids = false;  // no devices to tell where to write: pages are counted
  s->engine_ = std::make_unique<Engine>(s->executor_.get(), sched, options);
  return s;
}

int64_t SimInstance::KvTokenCapacity() const {
  const Plan& plan = executor_->plan();
  int64_t best = INT64_MAX;
  for (int d : plan.active) {
    const int64_t slots = plan.num_tp_heads_total(d) +
                          plan.num_dp_heads_total() / std::max<size_t>(1, plan.active.size());
    if (slots > 0)
      best = std::min(best, engine_->scheduler().kv().capacity(d) / slots * config_.block_size);
  }
  return best == INT64_MAX ? 0 : best;
}

Status SimInstance::Submit(const SimRequest& r) {
  if (r.migrated && r.output <= 1) {
    // Its one token arrives with it: the request is complete on arrival and
    // the engine has nothing to generate.
    if (r.output < 1) return InvalidArgument("a request needs at least one output token");
    SimRequestResult res;
    res.arrival = res.last_token = res.finish = r.arrival;
    res.input = r.input;
    res.output = r.output;
    results_.push_back(res);
    return Status::Ok();
  }
  RequestSpec spec;
  spec.prompt.reserve(r.input + 1);  // room for a prefilled token: no copy
  if (config_.sched.prefix_cache) {
    // Real tokens: the cache hits exactly where the trace shares blocks.
    WorkloadRequest w;
    w.input_len = r.input;
    w.hash_ids = r.hash_ids;
    w.block_tokens = r.block_tokens;
    spec.prompt = WorkloadPrompt(w, static_cast<int>(results_.size()) + 1, config_.prompt_seed, 0,
                                 config_.model.vocab_size);
  } else {
    spec.prompt.assign(r.input, 0);
  }
  spec.max_new_tokens = r.output;
  spec.arrival = r.arrival;
  // A decode instance receives the prompt's KV and its first token.
  if (r.migrated) spec.prefilled_output = {0};
  FS_ASSIGN_OR_RETURN(int64_t id, engine_->Submit(std::move(spec)));
  SimRequestResult res;
  res.arrival = r.arrival;
  res.input = r.input;
  res.output = r.output;
  if (r.migrated) res.last_token = r.arrival;  // its first token arrives with it
  index_[id] = static_cast<int>(results_.size());
  results_.push_back(res);
  return Status::Ok();
}

std::vector<int64_t> SimInstance::RunningIds() const {
  std::vector<int64_t> ids;
  for (const Sequence* s : engine_->scheduler().Running()) ids.push_back(s->id);
  return ids;
}

void SimInstance::CountPreempted(const std::vector<int64_t>& running) {
  std::unordered_set<int64_t> waiting;
  for (const Sequence* s : engine_->scheduler().Waiting()) waiting.insert(s->id);
  for (int64_t id : running) preemptions_ += waiting.count(id);
}

bool SimInstance::StepOnce() {
  const int64_t t0 = clock_->NowNanos();
  std::vector<int64_t> running;
  if (executor_->any_down()) running = RunningIds();  // the step will recover
  auto out = engine_->Step();
  if (!out.ok()) return false;  // degraded: waits for a device
  if (out->recovered) CountPreempted(running);
  preemptions_ += static_cast<int64_t>(out->plan.preempted.size());
  const double now = clock_->NowSeconds();
  if (out->ran) {
    busy_s_ += (clock_->NowNanos() - t0) * 1e-9;
    last_step_end_ = now;
    ++steps_;
    tokens_in_ += out->plan.prefill_tokens;
  }
  for (const TokenEvent& e : out->events) {
    auto it = index_.find(e.id);
    if (it == index_.end()) continue;
    SimRequestResult& r = results_[it->second];
    if (e.token >= 0) {
      if (r.first_token < 0) r.first_token = now;
      if (r.last_token >= 0) {
        r.max_tbt = std::max(r.max_tbt, now - r.last_token);
        if (config_.record_gaps) gaps_.push_back(static_cast<float>(now - r.last_token));
      }
      r.last_token = now;
      r.tokens++;
      ++tokens_out_;
    }
    if (e.finished) {
      r.finish = now;
      index_.erase(it);
    }
  }
  return out->ran || out->recovered || !out->events.empty();
}

void SimInstance::RunUntil(double t) {
  const int64_t target = ToNanos(t);
  while (clock_->NowNanos() < target) {
    if (engine_->idle() || !StepOnce()) {
      if (clock_->NowNanos() < target) clock_->Set(target);
      return;
    }
  }
}

void SimInstance::RunToCompletion(double limit) {
  const int64_t target = ToNanos(limit);
  while (!engine_->idle() && clock_->NowNanos() < target) {
    if (!StepOnce()) break;
  }
}

Result<SimRecovery> SimInstance::Fail(int device) { return Fail(std::vector<int>{device}); }

Result<SimRecovery> SimInstance::Fail(const std::vector<int>& devices) {
  if (devices.empty()) return InvalidArgument("no device to fail");
  const std::vector<int> alive = executor_->alive_devices();
  for (size_t i = 0; i < devices.size(); ++i) {
    if (!std::count(alive.begin(), alive.end(), devices[i]) ||
        std::count(devices.begin(), devices.begin() + i, devices[i]))
      return InvalidArgument("device {} is not alive", devices[i]);
  }
  const std::vector<int64_t> running = RunningIds();
  for (int d : devices) FS_RETURN_IF_ERROR(executor_->KillDevice(d));
  Status st = engine_->CheckHealth(0);
  CountPreempted(running);
  FS_RETURN_IF_ERROR(st);
  if (engine_->recoveries().empty())
    return Internal("device {} died without a recovery", devices.front());
  return FromReport(engine_->recoveries().back());
}

void SimInstance::AdvanceTo(double t) {
  const int64_t target = ToNanos(t);
  if (clock_->NowNanos() < target) clock_->Set(target);
}

std::vector<SimRequest> SimInstance::Unfinished() const {
  std::vector<int> order;
  for (const auto& [id, index] : index_) order.push_back(index);
  std::sort(order.begin(), order.end());
  std::vector<SimRequest> out;
  for (int i : order) {
    const SimRequestResult& r = results_[i];
    SimRequest q;
    q.arrival = r.arrival;
    q.input = r.input + r.tokens;
    q.output = r.output - r.tokens;
    out.push_back(q);
  }
  return out;
}

Result<SimRecovery> SimInstance::Rejoin(int device) {
  const std::vector<int> alive = executor_->alive_devices();
  if (std::count(alive.begin(), alive.end(), device))
    return InvalidArgument("device {} is alive", device);
  const std::vector<int64_t> running = RunningIds();
  Status st = engine_->Rejoin(device);
  CountPreempted(running);
  FS_RETURN_IF_ERROR(st);
  return FromReport(engine_->recoveries().back());
}

const std::vector<SimRecovery>& SimInstance::recoveries() const {
  const auto& reports = engine_->recoveries();
  recoveries_.resize(reports.size());
  for (size_t i = 0; i < reports.size(); ++i) recoveries_[i] = FromReport(reports[i]);
  return recoveries_;
}

}  // namespace failsafe
