#include "server/engine_service.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "common/clock.h"
#include "common/log.h"
#include "core/step_cost.h"
#include "engine/kv_backup.h"
#include "placement/plan_json.h"

namespace failsafe {

bool RequestHandle::Next(TokenEvent* event, int64_t timeout_ms) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return !events_.empty(); }))
    return false;
  *event = events_.front();
  events_.pop_front();
  return true;
}

void RequestHandle::TakeEvents(std::vector<TokenEvent>* out) {
  std::lock_guard<std::mutex> lock(mu_);
  out->insert(out->end(), events_.begin(), events_.end());
  events_.clear();
}

void RequestHandle::SetNotify(std::function<void()> notify) {
  std::lock_guard<std::mutex> lock(mu_);
  notify_ = std::move(notify);
}

void RequestHandle::Push(const TokenEvent& e, const Status& error) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(e);
    if (!error.ok()) {
      error_ = error;
    } else if (!e.error.ok()) {
      error_ = e.error;
    }
    if (notify_) notify_();
  }
  cv_.notify_all();
}

Status RequestHandle::error() {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

EngineService::EngineService(std::unique_ptr<Executor> executor, const SchedulerConfig& config,
                             const EngineOptions& options, const ServiceOptions& service)
    : executor_(std::move(executor)),
      engine_(executor_.get(), config, options),
      service_(service),
      config_(executor_->config()),
      max_model_len_(config.max_model_len),
      prefix_cache_(config.prefix_cache),
      max_num_seqs_(config.max_num_seqs),
      speed_(options.speed),
      respawn_(service.respawn, executor_->plan().num_devices) {
  std::vector<int> every(executor_->plan().num_devices);
  std::iota(every.begin(), every.end(), 0);
  auto fault_free =
      MakePlan(config_, executor_->plan().policy, executor_->plan().num_devices, every);
  fault_free_step_s_ = ReferenceStepTime(fault_free.ok() ? *fault_free : executor_->plan(), config_,
                                         speed_, max_num_seqs_, max_model_len_ / 2);
  UpdateGauges();
  free_slots_ = max_num_seqs_;
  thread_ = std::thread([this] { Loop(); });
}

EngineService::~EngineService() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

Result<std::shared_ptr<RequestHandle>> EngineService::Submit(RequestSpec spec) {
  auto h = std::make_shared<RequestHandle>();
  // Latencies are on the engine's clock (virtual over a simulated executor).
  h->arrival_ns_ = engine_.clock().NowNanos();
  h->prompt_tokens_ = static_cast<int>(spec.prompt.size());
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!healthy_) {
      // The engine cannot serve: say so at once rather than queue.
      TokenEvent e;
      e.finished = true;
      e.reason = FinishReason::kError;
      e.error = Unavailable("{}", unhealthy_reason_);
      h->Push(e);
      return h;
    }
    if (queued_ >= service_.max_queue + free_slots_) {
      return ResourceExhausted("the queue is full ({} requests waiting); try again later",
                               queued_ - free_slots_);
    }
    ++queued_;
    submissions_.emplace_back(std::move(spec), h);
  }
  cv_.notify_all();
  return h;
}

void EngineService::Cancel(const std::shared_ptr<RequestHandle>& handle, FinishReason why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancels_.emplace_back(handle, why);
  }
  cv_.notify_all();
}

void EngineService::RunOnEngine(Task task) {
  std::promise<void> done;
  auto fut = done.get_future();
  {
    std::lock_guard<std::mutex> lock(mu_);
    tasks_.push_back([&] {
      task();
      done.set_value();
    });
  }
  cv_.notify_all();
  fut.wait();
}

Status EngineService::FailDevice(int device) {
  Status st;
  RunOnEngine([&] {
    DeviceFaults* faults = FaultsOf(executor_.get());
    st = faults ? faults->KillDevice(device)
                : FailedPrecondition("this engine has no device processes");
    // Notice the death now rather than at the next step.
    if (st.ok()) (void)engine_.CheckHealth(service_.heartbeat_timeout_ms);
    UpdateGauges();
  });
  return st;
}

Status EngineService::RestoreDevice(int device) {
  Status st;
  RunOnEngine([&] {
    st = engine_.Rejoin(device);
    if (device >= 0 && device < executor_->plan().num_devices) {
      // By hand: a crash-looping device gets a clean slate.
      const int64_t now = MonotonicNanos();
      respawn_.Reset(device, st.ok(), now);
      // (A device on another host: no worker joined yet, or its link is
      // being measured or was refused; it is taken when one is fit.)
      const bool counts =
          st.code() != StatusCode::kNotFound && st.code() != StatusCode::kFailedPrecondition;
      if (!st.ok()) respawn_.StartFailed(device, st.message(), counts, now);
    }
    UpdateGauges();
  });
  return st;
}

void EngineService::Respawn() {
  if (!executor_->supports_recovery()) return;
  respawn_.Observe(executor_->alive_devices(), MonotonicNanos());
  for (int d : respawn_.Due(MonotonicNanos())) {
    const int64_t t0 = MonotonicNanos();
    // (Not waiting while a joined worker's link is measured: the engine
    // steps on meanwhile.)
    const Status st = engine_.Rejoin(d, /*wait=*/false);
    const int64_t now = MonotonicNanos();
    if (st.ok()) {
      respawn_.Started(d, now);
      FS_LOG_INFO("device {} started again ({} ms); respawn {} of the device", d,
                  (now - t0) / 1000000, respawn_.record(d).respawns);
      continue;
    }
    // A device on another host waits for a worker to join to be it and
    // for its link to be measured (NotFound), or for one over a link fit
    // for collectives (FailedPrecondition): neither is the device failing.
    const bool counts =
        st.code() != StatusCode::kNotFound && st.code() != StatusCode::kFailedPrecondition;
    if (st.code() != StatusCode::kNotFound)
      FS_LOG_WARN("device {} did not start again: {}", d, st.ToString());
    respawn_.StartFailed(d, st.message(), counts, now);
  }
}

ServiceStatus EngineService::GetStatus() {
  ServiceStatus s;
  RunOnEngine([&] {
    const Plan& plan = executor_->plan();
    s.plan_json = PlanToJson(plan);
    const auto alive = executor_->alive_devices();
    const EngineSnapshot snap = engine_.Snapshot();
    const std::vector<MeasuredSpeed> speeds = engine_.device_speeds();
    for (int d = 0; d < plan.num_devices; ++d) {
      DeviceStatus ds;
      ds.device = d;
      ds.pid = executor_->device_pid(d);
      ds.alive = std::count(alive.begin(), alive.end(), d) > 0;
      ds.active = plan.IsActive(d);
      ds.kv_used_pages = snap.kv_used_pages[d];
      ds.kv_capacity_pages = snap.kv_capacity_pages[d];
      ds.dp_load_tokens = snap.dp_load_tokens[d];
      if (d < static_cast<int>(speeds.size())) ds.speed = speeds[d];
      ds.respawn = respawn_.record(d);
      s.devices.push_back(ds);
    }
    s.running = snap.running;
    s.waiting = snap.waiting;
    s.degraded = engine_.degraded();
    s.degraded_reason = engine_.degraded_reason();
    s.recoveries = engine_.recoveries();
  });
  return s;
}

bool EngineService::Healthy(std::string* reason) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!healthy_ && reason) *reason = unhealthy_reason_;
  return healthy_;
}

void EngineService::UpdateGauges() { UpdateGauges(engine_.Snapshot()); }

void EngineService::UpdateGauges(const EngineSnapshot& snap) {
  EngineGauges g;
  g.running = snap.running;
  g.waiting = snap.waiting;
  const Plan& plan = executor_->plan();
  const auto alive = executor_->alive_devices();
  g.devices_alive = static_cast<int>(alive.size());
  g.devices_total = plan.num_devices;
  g.min_devices = service_.min_devices;
  if (!(plan == capacity_plan_)) {
    capacity_plan_ = plan;
    const double t = ReferenceStepTime(plan, config_, speed_, max_num_seqs_, max_model_len_ / 2);
    capacity_ = t > 0 && fault_free_step_s_ > 0 ? std::min(1.0, fault_free_step_s_ / t) : 0;
  }
  // A node that cannot serve now has no capacity, whatever its last plan
  // would give: a router weighting by the gauge sends it nothing.
  g.capacity = engine_.degraded() || alive.empty() ? 0 : capacity_;
  g.prefix_cache = snap.prefix_cache;
  g.prefix = snap.prefix;
  int64_t kv_used = 0, kv_capacity = 0;
  const std::vector<MeasuredSpeed> speeds = engine_.device_speeds();
  for (int d = 0; d < plan.num_devices; ++d) {
    DeviceGauge dg;
    dg.device = d;
    dg.alive = std::count(alive.begin(), alive.end(), d) > 0;
    const int64_t cap = snap.kv_capacity_pages[d];
    const int64_t used = cap > 0 ? snap.kv_used_pages[d] : 0;
    dg.kv_usage = cap > 0 ? static_cast<double>(used) / cap : 0;
    kv_used += used;
    kv_capacity += cap;
    if (d < static_cast<int>(speeds.size())) {
      const MeasuredSpeed& s = speeds[d];
      dg.speed_measured = s.measured || s.gflops_per_s > 0;
      dg.relative_speed = s.relative_speed;
      dg.slow = s.slow;
      dg.share = s.share;
      dg.work_fraction = s.work_fraction;
    }
    dg.respawns = respawn_.record(d).respawns;
    dg.crash_looping = respawn_.record(d).crash_looping;
    g.devices.push_back(dg);
  }
  g.kv_usage = kv_capacity > 0 ? static_cast<double>(kv_used) / kv_capacity : 0;
  const int alive_count = g.devices_alive;
  metrics_.SetGauges(std::move(g));
  std::lock_guard<std::mutex> lock(mu_);
  healthy_ = !engine_.degraded() && alive_count >= service_.min_devices;
  unhealthy_reason_ = engine_.degraded()
                          ? engine_.degraded_reason()
                          : fmt::format("{} of {} devices alive, fewer than the {} required",
                                        alive_count, plan.num_devices, service_.min_devices);
}

void EngineService::Dispatch(const std::vector<TokenEvent>& events) {
  const int64_t now = engine_.clock().NowNanos();
  for (const TokenEvent& e : events) {
    auto it = live_.find(e.id);
    if (it == live_.end()) continue;
    RequestHandle& h = *it->second;
    if (e.token >= 0) {
      if (h.generated_ == 0) {
        metrics_.ttft_s.Observe((now - h.arrival_ns_) * 1e-9);
      } else {
        metrics_.itl_s.Observe((now - h.last_token_ns_) * 1e-9);
      }
      h.last_token_ns_ = now;
      h.generated_++;
    }
    // A finished request is counted before its handler hears of it, so a
    // client that has its answer sees it in /metrics.
    if (e.finished) {
      metrics_.e2e_s.Observe((now - h.arrival_ns_) * 1e-9);
      metrics_.AddTokens(h.prompt_tokens_, h.generated_);
      metrics_.AddRequest(FinishReasonName(e.reason));
    }
    h.Push(e);
    if (e.finished) live_.erase(it);
  }
}

void EngineService::DuringOutage() {
  const int64_t now = engine_.clock().NowNanos();
  if (outage_since_ns_ == 0) outage_since_ns_ = now;
  if (now - outage_since_ns_ < service_.outage_timeout_ms * 1000000 || engine_.idle()) return;
  Dispatch(
      engine_.FailAll(Unavailable("the engine could not serve for {:.1f} s: {}",
                                  (now - outage_since_ns_) * 1e-9, engine_.degraded_reason())));
}

void EngineService::Loop() {
  // Heartbeats are paced in real time, as the waits for work below are.
  int64_t last_health = MonotonicNanos();
  while (true) {
    std::deque<std::pair<RequestSpec, std::shared_ptr<RequestHandle>>> subs;
    std::vector<std::pair<std::shared_ptr<RequestHandle>, FinishReason>> cancels;
    std::deque<Task> tasks;
    {
      std::unique_lock<std::mutex> lock(mu_);
      const bool nothing = submissions_.empty() && cancels_.empty() && tasks_.empty() && !stop_;
      if (nothing && (engine_.idle() || engine_.degraded())) {
        // Idle, or waiting for devices: wake for requests, tasks, the next
        // heartbeat or the next device due to be started again.
        int64_t wait_ms = service_.heartbeat_ms;
        if (const int64_t due = respawn_.NextDueNs(); due >= 0) {
          wait_ms = std::clamp<int64_t>((due - MonotonicNanos()) / 1000000 + 1, 0, wait_ms);
        }
        cv_.wait_for(lock, std::chrono::milliseconds(wait_ms));
      }
      if (stop_) break;
      subs.swap(submissions_);
      cancels.swap(cancels_);
      tasks.swap(tasks_);
    }
    for (auto& task : tasks) task();
    Respawn();
    for (auto& [spec, h] : subs) {
      Result<int64_t> id = engine_.degraded()
                               ? Result<int64_t>(Unavailable("{}", engine_.degraded_reason()))
                               : engine_.Submit(std::move(spec));
      if (!id.ok()) {
        TokenEvent e;
        e.finished = true;
        e.reason = FinishReason::kError;
        e.error = id.status();
        h->Push(e);
        FS_LOG_INFO("request refused: {}", id.status().ToString());
        continue;
      }
      h->engine_id_ = *id;
      live_[*id] = h;
    }
    for (auto& [h, why] : cancels) {
      if (h->engine_id_ >= 0 && live_.count(h->engine_id_)) engine_.Abort(h->engine_id_, why);
    }
    if (engine_.idle() || engine_.degraded()) {
      if (MonotonicNanos() - last_health > service_.heartbeat_ms * 1000000) {
        Status st = engine_.CheckHealth(service_.heartbeat_timeout_ms);
        if (!st.ok()) FS_LOG_WARN("health check: {}", st.ToString());
        last_health = MonotonicNanos();
      }
    }
    // A step also hands over requests finished by cancellation (and frees them).
    if (!engine_.idle()) {
      auto out = engine_.Step();
      if (out.ok()) {
        Dispatch(out->events);
      } else if (!engine_.degraded()) {
        // Step fails only while the engine cannot serve; anything else is a
        // bug, and no request may wait on it.
        FS_LOG_ERROR("engine step failed: {}", out.status().ToString());
        Dispatch(engine_.FailAll(out.status()));
      }
    }
    if (engine_.degraded()) {
      DuringOutage();
    } else {
      outage_since_ns_ = 0;
    }
    // A recovery is reported once its first step has run (what clients saw).
    while (recoveries_seen_ < engine_.recoveries().size() &&
           engine_.recoveries()[recoveries_seen_].resumed()) {
      metrics_.AddRecovery(engine_.recoveries()[recoveries_seen_++]);
    }
    const EngineSnapshot snap = engine_.Snapshot();
    {
      std::lock_guard<std::mutex> lock(mu_);
      queued_ = snap.waiting + static_cast<int>(submissions_.size());
      free_slots_ = std::max(0, max_num_seqs_ - snap.running);
    }
    UpdateGauges(snap);
  }
}

}  // namespace failsafe
