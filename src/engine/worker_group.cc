#include "engine/worker_group.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <thread>

#include "common/clock.h"
#include "common/log.h"
#include "core/step_cost.h"
#include "engine/host_cpus.h"
#include "engine/step_timing.h"
#include "placement/plan_json.h"
#include "placement/plan_stats.h"

namespace failsafe {

namespace {

// Starting a process and mapping the model.
constexpr int64_t kStartTimeoutMs = 60000;
// How long after its kill a fenced process is waited for, at most, before a
// device rejoins (AwaitKilled).
constexpr int64_t kKilledExitMs = 10000;
// Loading a device's whole share from the host copy.
constexpr int64_t kLoadTimeoutMs = 600000;

// How long devices get to answer once their group is aborted.
int64_t GraceMs(int64_t deadline_ms) { return std::clamp<int64_t>(deadline_ms / 2, 250, 5000); }

}  // namespace

int64_t ActivationReserveBytes(const ModelConfig& c, int max_step_tokens) {
  // Step scratch: about eight hidden-sized rows and the FFN activations per token.
  return static_cast<int64_t>(max_step_tokens) * (8LL * c.hidden_size + 3LL * c.intermediate_size) *
         4;
}

std::vector<std::string> WorkerEnvironment(int local_devices, int threads_per_device, int host_cpus,
                                           bool wait_policy_set) {
  if (wait_policy_set || threads_per_device <= 1) return {};
  if (static_cast<int64_t>(local_devices) * threads_per_device <= host_cpus) return {};
  return {"OMP_WAIT_POLICY=passive"};
}

Result<std::unique_ptr<WorkerGroup>> WorkerGroup::Start(const WorkerGroupOptions& options) {
  std::signal(SIGPIPE, SIG_IGN);
  if (options.step_timeout_ms < 0 || options.step_timeout_floor_ms <= 0 ||
      options.collective_timeout_ms <= 0) {
    return InvalidArgument("timeouts must be positive (step timeout: 0 derives it)");
  }
  if (!options.gpus.empty() && options.gpus.size() != 1 &&
      static_cast<int>(options.gpus.size()) != options.num_devices) {
    return InvalidArgument("{} GPUs for {} devices: give one GPU per device, or one for all",
                           options.gpus.size(), options.num_devices);
  }
  for (int gpu : options.gpus) {
    if (gpu < 0) return InvalidArgument("GPU {} is not a CUDA device ordinal", gpu);
  }
  if (options.remote_devices < 0 || options.remote_devices > options.num_devices) {
    return InvalidArgument("{} remote devices of {}", options.remote_devices, options.num_devices);
  }
  if (options.remote_devices > 0 && !options.listener) {
    return InvalidArgument("remote devices need a listener (--listen HOST:PORT)");
  }
  if (options.kv_dtype && *options.kv_dtype != DType::kF32 && *options.kv_dtype != DType::kBF16) {
    return InvalidArgument("the KV cache holds f32 or bf16, not {}", DTypeName(*options.kv_dtype));
  }
  auto g = std::unique_ptr<WorkerGroup>(new WorkerGroup());
  g->options_ = options;
  if (options.remote_devices > 0) {
    // Shared memory does not cross hosts: collectives go over gloo, every
    // member dialled at an address the others reach.
    g->options_.comm = CommKind::kGloo;
    g->options_.gloo_hostname = options.listener->host();
  }
  const int local = options.num_devices - options.remote_devices, cpus = HostCpus();
  g->worker_env_ = WorkerEnvironment(
      local, options.threads_per_device, cpus,
      std::getenv("OMP_WAIT_POLICY") != nullptr || std::getenv("GOMP_SPINCOUNT") != nullptr);
  for (const std::string& v : g->worker_env_) {
    FS_LOG_INFO("{} devices of {} threads on {} CPUs: the workers run with {}", local,
                options.threads_per_device, cpus, v);
  }
  DeadlineOptions d;
  d.step_timeout_ms = options.step_timeout_ms;
  d.floor_ms = options.step_timeout_floor_ms;
  g->deadline_ = StepDeadline(d);
  FS_ASSIGN_OR_RETURN(g->config_, ModelConfig::Load(options.model_dir));
  std::vector<int> alive = options.alive;
  if (alive.empty()) {
    for (int dev = 0; dev < options.num_devices; ++dev) alive.push_back(dev);
  }
  FS_ASSIGN_OR_RETURN(g->plan_, MakePlan(g->config_, options.policy, options.num_devices, alive));
  // Check the weights and the memory budget here, so that bad input fails
  // before any process starts.
  FS_ASSIGN_OR_RETURN(auto host, WeightStore::Open(options.model_dir, g->config_));
  if (g->config_.vision_language) {
    FS_LOG_INFO(
        "{}: a vision-language checkpoint served as text: its language model only ({} tensors "
        "of the vision tower and projector, {:.1f} MB, not loaded; image inputs are refused)",
        options.model_dir, host->skipped_tensors(), host->skipped_bytes() / 1e6);
  }
  g->kv_dtype_ = options.kv_dtype.value_or(DefaultKvDtype(host->MatrixDType()));
  host.reset();
  const int64_t slots = static_cast<int64_t>(g->config_.num_layers) * g->config_.num_kv_heads;
  const int64_t page_bytes = g->kv_page_bytes();
  if (options.kv_pages > 0) {
    g->pool_pages_ = options.kv_pages;
  } else if (options.device_memory_bytes > 0) {
    g->pool_pages_ = options.device_memory_bytes / page_bytes;  // virtual: committed as used
  } else {
    g->pool_pages_ = slots * (65536 / options.block_size);
  }
  FS_ASSIGN_OR_RETURN(std::vector<int64_t> capacity, g->KvCapacityFor(g->plan_));
  if (options.backup_bytes > 0) {
    FS_ASSIGN_OR_RETURN(g->backup_,
                        HostKvBackup::Create(g->config_, options.block_size, options.backup_bytes,
                                             options.max_seqs, options.num_devices, g->kv_dtype_));
  }
  const size_t logits_bytes =
      static_cast<size_t>(options.max_logits_rows) * g->config_.vocab_size * sizeof(float);
  FS_ASSIGN_OR_RETURN(g->logits_, ShmRegion::Create("failsafe-logits", logits_bytes));
  FS_ASSIGN_OR_RETURN(g->progress_, DeviceProgressRegion::Create(options.num_devices));
  if (g->options_.comm == CommKind::kGloo) {
    FS_ASSIGN_OR_RETURN(g->store_, KvStoreServer::Start(g->options_.gloo_hostname, 0));
  }
  g->devices_.resize(options.num_devices);
  Sent started;
  started.at_ns = MonotonicNanos();
  for (int dev : g->plan_.alive) {
    // A joined worker whose link is refused (a round trip slow once, as on
    // a loaded machine, or a link that is bad) joins again after its own
    // backoff: taken then if its link measures well, within the join wait.
    const int64_t join_until = MonotonicNanos() + options.join_timeout_ms * 1000000;
    for (;;) {
      const int64_t left_ms = (join_until - MonotonicNanos()) / 1000000;
      Status joined = g->Spawn(dev, std::max<int64_t>(left_ms, 0));
      if (joined.ok()) break;
      if (!g->remote(dev) || joined.code() != StatusCode::kFailedPrecondition || left_ms <= 0) {
        return joined;
      }
      FS_LOG_WARN("{}; waiting for it to join again", joined.message());
    }
    g->devices_[dev].kv_pages = capacity[dev];
    started.devices.push_back(dev);
    started.before.emplace_back();  // a new process has done nothing yet
  }
  for (const DeviceReply& r : g->Collect(started, kStartTimeoutMs)) {
    if (!r.status.ok()) return r.status.WithContext("device " + std::to_string(r.device));
  }
  FS_RETURN_IF_ERROR(g->DeadAmong(g->plan_.alive, "while starting"));
  const Sent load = g->SendAll(g->plan_.active, WorkerOp::kLoadPlan, PlanToJson(g->plan_));
  for (const DeviceReply& r : g->Collect(load, kLoadTimeoutMs)) {
    if (!r.status.ok()) return r.status.WithContext("device " + std::to_string(r.device));
    WireReader w(r.body);
    g->devices_[r.device].weight_bytes = w.Get<int64_t>();
  }
  FS_RETURN_IF_ERROR(g->DeadAmong(g->plan_.active, "while loading its weights"));
  FS_RETURN_IF_ERROR(g->FormGroup(g->plan_.active));
  return g;
}

WorkerGroup::~WorkerGroup() {
  const Sent sent = SendAll(alive_devices(), WorkerOp::kShutdown, "");
  HangWatch watch(&progress_, sent.devices, sent.before, sent.at_ns, 2000, 250, nullptr);
  std::vector<std::pair<int, DeviceProcess*>> procs;
  for (int d : sent.devices) {
    if (alive(d)) procs.emplace_back(d, devices_[d].process.get());
  }
  CollectReplies(procs, watch, [](const Verdict&) {});
  // Each process is killed (if still there) and reaped as it goes.
  for (auto& d : devices_) {
    d.process.reset();
    d.probing.reset();
  }
  killed_.clear();
}

Status WorkerGroup::Spawn(int device, int64_t join_wait_ms, bool wait_link) {
  Device& d = devices_[device];
  // A new process in the device's place, its record and progress afresh.
  auto take = [&](std::unique_ptr<DeviceProcess> p) {
    progress_.Reset(device);
    d.process = std::move(p);
    d.killed_ns = 0;
    d.loss = DeviceLoss();
  };
  if (remote(device) && !d.probing) {
    FS_ASSIGN_OR_RETURN(auto link, options_.listener->Take(device, join_wait_ms));
    take(DeviceProcess::Attach(std::move(link)));
    Status init = InitDevice(device);
    d.probing = std::move(d.process);
    if (!init.ok()) {
      d.probing.reset();
      return init;
    }
    d.probe_until_ns = MonotonicNanos() + LinkProbeNs(d);
  }
  if (remote(device)) {
    for (;;) {
      Status link = CheckLink(device);
      if (link.code() != StatusCode::kNotFound || !wait_link) return link;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  FS_ASSIGN_OR_RETURN(
      auto p, DeviceProcess::Spawn(options_.worker_binary, options_.log_level, worker_env_));
  take(std::move(p));
  FS_LOG_INFO("device {}: worker process {}", device, d.process->pid());
  return InitDevice(device);
}

// A worker is taken only over a link fit for collectives: five round trips
// measured (heartbeats, 200 ms apart) and the worst of them, heartbeats'
// lateness counted, under this. Over a link that is slow or loses frames
// every step would stall until the link is blamed again; refused, the
// worker joins again later (its own backoff) and the device's respawn backs
// off too. A link found degraded before is on probation: three times as many
// round trips (a link losing a third of its frames gets five clean round
// trips in a row about one time in forty, fifteen one in fifty thousand).
// The engine steps on while a link is measured.
constexpr int64_t kJoinRttLimitNs = 150 * 1000000LL;
constexpr int64_t kJoinProbeNs = 3000 * 1000000LL;
constexpr uint64_t kJoinRttSamples = 5;
constexpr uint64_t kProbationRttSamples = 15;

uint64_t WorkerGroup::LinkSamplesNeeded(const Device& d) {
  return d.link_strikes > 0 ? kProbationRttSamples : kJoinRttSamples;
}

int64_t WorkerGroup::LinkProbeNs(const Device& d) {
  return kJoinProbeNs * static_cast<int64_t>(LinkSamplesNeeded(d) / kJoinRttSamples);
}

Status WorkerGroup::CheckLink(int device) {
  Device& d = devices_[device];
  const uint64_t needed = LinkSamplesNeeded(d);
  const DeviceProgress p = progress_.Read(device);
  // (FailedPrecondition: the link, not the device, failed; no crash counts.
  // A degraded link shows in its first round trips: refused as soon as seen.)
  if (p.link_rtt_ns >= kJoinRttLimitNs) {
    d.probing.reset();  // the link closes; the worker joins again later
    ++d.link_strikes;
    return FailedPrecondition("device {}: the joined worker's link is degraded (round trip {} ms)",
                              device, p.link_rtt_ns / 1000000);
  }
  if (p.link_rtt_samples < needed) {
    if (d.probing->Exited() || MonotonicNanos() >= d.probe_until_ns) {
      d.probing.reset();
      return FailedPrecondition(
          "device {}: the joined worker's link measured {} round trips in {} ms", device,
          p.link_rtt_samples, LinkProbeNs(d) / 1000000);
    }
    return NotFound("device {}: measuring the joined worker's link ({} of {} round trips)", device,
                    p.link_rtt_samples, needed);
  }
  d.link_strikes = 0;
  d.process = std::move(d.probing);
  return Status::Ok();
}

void WorkerGroup::DropDegradedLinks(const std::vector<int>& devices) {
  // The hosts whose link is bad: every device there goes (they share it).
  std::vector<std::pair<uint64_t, int>> bad_hosts;  // host, a device behind it
  for (int d : devices) {
    if (!alive(d) || !devices_[d].process->remote()) continue;
    const DeviceProgress p = progress_.Read(d);
    if (p.link_rtt_ns < kJoinRttLimitNs) continue;
    if (p.host != 0) bad_hosts.emplace_back(p.host, d);
    MarkDead({d,
              fmt::format("its link is degraded (round trip {} ms): a plan change over it would "
                          "stall",
                          p.link_rtt_ns / 1000000),
              MonotonicNanos(), /*link=*/true});
  }
  for (int d : devices) {
    if (!alive(d) || !devices_[d].process->remote()) continue;
    const uint64_t host = progress_.Read(d).host;
    for (const auto& [bad, via] : bad_hosts) {
      if (host != bad) continue;
      MarkDead({d,
                fmt::format("its host's link is degraded (device {}): a plan change over it "
                            "would stall",
                            via),
                MonotonicNanos(), /*link=*/true});
      break;
    }
  }
}

Status WorkerGroup::InitDevice(int device) {
  WorkerInit init;
  init.model_dir = options_.model_dir;
  init.threads = options_.threads_per_device;
  init.block_size = options_.block_size;
  init.logits_rows = options_.max_logits_rows;
  init.device_id = device;
  init.kv_pages = pool_pages_;
  init.kv_dtype = static_cast<int32_t>(kv_dtype_);
  init.peer_collectives = options_.peer_collectives ? 1 : 0;
  if (!options_.gpus.empty()) {
    init.gpu = options_.gpus.size() == 1 ? options_.gpus[0] : options_.gpus[device];
    init.gpu_gemm = static_cast<int32_t>(options_.gpu_gemm);
    init.gpu_graphs = options_.gpu_graphs ? 1 : 0;
    init.gpu_dependent_launch = options_.gpu_dependent_launch ? 1 : 0;
    init.gpu_attention = static_cast<int32_t>(options_.gpu_attention);
  }
  WireWriter w;
  init.Encode(&w);
  std::vector<int> fds = {logits_.fd(), progress_.fd()};
  if (backup_) fds.push_back(backup_->region().fd());
  return devices_[device].process->Send(WorkerOp::kInit, w.data(), fds);
}

Result<std::vector<int64_t>> WorkerGroup::KvCapacityFor(const Plan& plan) const {
  std::vector<int64_t> cap(plan.num_devices, 0);
  if (options_.kv_pages == 0 && options_.device_memory_bytes > 0) {
    const int64_t page_bytes = kv_page_bytes();
    FS_ASSIGN_OR_RETURN(
        cap, KvPagesWithinBudget(plan, config_, options_.device_memory_bytes,
                                 ActivationReserveBytes(config_, options_.max_step_tokens) +
                                     (options_.peer_collectives ? PeerReducer::kMemoryBytes : 0),
                                 page_bytes));
  } else {
    for (int d : plan.active) cap[d] = pool_pages_;
  }
  for (auto& c : cap) c = std::min(c, pool_pages_);
  return cap;
}

WorkerGroup::Sent WorkerGroup::SendAll(const std::vector<int>& devices, WorkerOp op,
                                       const std::string& payload,
                                       const std::vector<std::vector<int>>& fds) {
  return SendEach(
      devices, op, [&](int) { return payload; }, fds);
}

WorkerGroup::Sent WorkerGroup::SendEach(const std::vector<int>& devices, WorkerOp op,
                                        const std::function<std::string(int device)>& payload,
                                        const std::vector<std::vector<int>>& fds) {
  Sent sent;
  for (int d : devices) {
    if (!alive(d)) continue;
    sent.devices.push_back(d);
    sent.before.push_back(progress_.Read(d));
  }
  sent.at_ns = MonotonicNanos();
  for (size_t i = 0; i < devices.size(); ++i) {
    const int d = devices[i];
    if (!alive(d)) continue;
    Status st =
        devices_[d].process->Send(op, payload(d), fds.empty() ? std::vector<int>{} : fds[i]);
    if (!st.ok()) MarkDead({d, "its channel is closed", 0});
  }
  return sent;
}

std::vector<DeviceReply> WorkerGroup::Collect(const Sent& sent, int64_t deadline_ms,
                                              int64_t expected_move_ns) {
  std::vector<std::pair<int, DeviceProcess*>> procs;
  for (int d : sent.devices) {
    if (alive(d)) procs.emplace_back(d, devices_[d].process.get());
  }
  HangWatch watch(&progress_, sent.devices, sent.before, sent.at_ns, deadline_ms,
                  GraceMs(deadline_ms), [this] { group_.Abort(); });
  watch.set_expected_move_ns(expected_move_ns);
  watch.set_stopped([this](int d) {
    return !alive(d) || !devices_[d].process || ProcessStopped(devices_[d].process->pid());
  });
  return CollectReplies(procs, watch, [this](const Verdict& v) { MarkDead(v); });
}

void WorkerGroup::MarkDead(const Verdict& v) {
  Device& d = devices_[v.device];
  if (!d.process) return;
  const int64_t now = MonotonicNanos();
  d.loss.detected_ns = now;
  d.loss.reason = v.reason;
  // The failure began at the kill, if it was one, else at its last sign of life.
  d.loss.failed_ns = d.killed_ns > 0 ? d.killed_ns : v.failed_ns;
  if (v.link) ++d.link_strikes;
  FS_LOG_WARN("device {} is dead: {}", v.device, v.reason);
  // No survivor may wait for it in a collective.
  group_.Abort();
  // The fence: the process is killed and its channel closed, so nothing it
  // still holds (a reply, a write) can reach the coordinator.
  d.process->Kill();
  if (!d.process->Reap()) killed_.push_back(std::move(d.process));
  d.process.reset();
  std::erase_if(killed_, [](const auto& p) { return p->Reap(); });
}

void WorkerGroup::AwaitKilled(int64_t timeout_ms) {
  for (const auto& p : killed_) {
    const int64_t t0 = MonotonicNanos();
    const int64_t left_ms = (p->killed_ns() + timeout_ms * 1000000 - t0) / 1000000;
    if (left_ms <= 0) continue;  // given up on before
    if (!p->WaitExit(left_ms)) {
      FS_LOG_WARN(
          "process {}, fenced, has not exited {} ms after its kill; starting the device "
          "regardless",
          p->pid(), timeout_ms);
      continue;
    }
    const int64_t waited_ms = (MonotonicNanos() - t0) / 1000000;
    if (waited_ms > 0)
      FS_LOG_INFO("waited {} ms for process {}, fenced, to exit", waited_ms, p->pid());
  }
  std::erase_if(killed_, [](const auto& p) { return p->Reap(); });
}

Status WorkerGroup::DeadAmong(const std::vector<int>& devices, const char* during) const {
  std::string list;
  for (int d : devices) {
    if (!alive(d)) list += (list.empty() ? "" : ", ") + std::to_string(d);
  }
  if (list.empty()) return Status::Ok();
  return Unavailable("device(s) {} died {}", list, during);
}

Status WorkerGroup::FormGroup(const std::vector<int>& members) {
  ++epoch_;
  CollectiveGroupOptions o;
  o.kind = options_.comm;
  o.timeout_ms = options_.collective_timeout_ms;
  o.slot_bytes = std::min<size_t>(
      static_cast<size_t>(options_.max_step_tokens) * config_.hidden_size * sizeof(float),
      16u << 20);
  o.gloo_hostname = options_.gloo_hostname;
  o.store = store_.get();
  FS_ASSIGN_OR_RETURN(group_, CollectiveGroup::Create(o, epoch_, static_cast<int>(members.size())));
  // Each member needs its own rank: send one by one, then collect.
  Sent all;
  for (size_t i = 0; i < members.size(); ++i) {
    WireWriter w;
    group_.SpecFor(static_cast<int>(i)).Encode(&w);
    Sent one =
        SendAll({members[i]}, WorkerOp::kJoinGroup, w.data(), {group_.FdsFor(static_cast<int>(i))});
    if (all.at_ns == 0) all.at_ns = one.at_ns;
    all.devices.insert(all.devices.end(), one.devices.begin(), one.devices.end());
    all.before.insert(all.before.end(), one.before.begin(), one.before.end());
  }
  for (const DeviceReply& r : Collect(all, options_.collective_timeout_ms)) {
    if (!r.status.ok()) return r.status.WithContext("device " + std::to_string(r.device));
  }
  return DeadAmong(members, "while joining the group");
}

double WorkerGroup::EstimateSeconds(const StepBatch& batch) const {
  if (batch.estimated_s > 0) return batch.estimated_s;
  // A batch built without the scheduler (tests, benchmarks): the same cost
  // model, as the engine's scheduler configures it.
  StepCost cost(plan_, config_, DeviceSpeed());
  for (const StepSeq& s : batch.seqs) cost.AddChunk(s.num_tokens, s.start_pos, s.dp_rank);
  return cost.StepTime();
}

Result<StepOutput> WorkerGroup::Step(const StepBatch& batch, StepTiming* timing) {
  if (batch.num_logits_rows > options_.max_logits_rows) {
    return InvalidArgument("step needs {} logits rows; the group was started with {}",
                           batch.num_logits_rows, options_.max_logits_rows);
  }
  FS_RETURN_IF_ERROR(DeadAmong(plan_.active, "before the step"));
  const double estimate = EstimateSeconds(batch);
  // A device moves at the embedding's all-reduce and twice per layer.
  const int moves = 1 + 2 * config_.num_layers;
  const int64_t deadline_ms = deadline_.DeadlineMs(estimate, moves);
  const auto expected_move_ns =
      static_cast<int64_t>(deadline_.ExpectedSeconds(estimate) / moves * 1e9);
  const int64_t t0 = MonotonicNanos();
  // Each device gets the step with its own block-table entries.
  const Sent sent = SendEach(plan_.active, WorkerOp::kStep, [&](int d) {
    WireWriter w;
    EncodeBatch(batch, d, &w);
    return w.Take();
  });
  std::vector<DeviceReply> replies = Collect(sent, deadline_ms, expected_move_ns);
  FS_RETURN_IF_ERROR(DeadAmong(plan_.active, "during the step"));
  for (const DeviceReply& r : replies) {
    if (!r.status.ok()) return r.status.WithContext("device " + std::to_string(r.device));
  }
  const int64_t wall = MonotonicNanos() - t0;
  deadline_.Observe(estimate, wall);
  if (timing) FS_RETURN_IF_ERROR(BuildStepTiming(replies, wall, timing));
  return StepOutput{static_cast<const float*>(logits_.data()), nullptr};
}

std::vector<int64_t> WorkerGroup::kv_capacity_pages() const {
  std::vector<int64_t> out(devices_.size(), 0);
  for (size_t d = 0; d < devices_.size(); ++d) out[d] = devices_[d].kv_pages;
  return out;
}

Status WorkerGroup::FreeSeqs(const std::vector<int64_t>& seq_ids) {
  if (seq_ids.empty()) return Status::Ok();
  WireWriter w;
  w.PutVector(seq_ids);
  const std::vector<int> running = alive_devices();
  const Sent sent = SendAll(running, WorkerOp::kFreeSeqs, w.data());
  // A device drains its backup before freeing; its backup writer shows it moving.
  for (const DeviceReply& r : Collect(sent, deadline_.floor_ms())) FS_RETURN_IF_ERROR(r.status);
  return DeadAmong(running, "while freeing sequences");
}

std::vector<int> WorkerGroup::dead_devices() const {
  std::vector<int> out;
  for (int d : plan_.alive) {
    if (!alive(d)) out.push_back(d);
  }
  return out;
}

Status WorkerGroup::KillDevice(int device) {
  if (device < 0 || device >= static_cast<int>(devices_.size()) || !alive(device)) {
    return InvalidArgument("device {} is not alive", device);
  }
  if (devices_[device].process->remote()) {
    devices_[device].killed_ns = MonotonicNanos();
    return devices_[device].process->KillRemote();
  }
  const pid_t pid = devices_[device].process->pid();
  // kill(0 or -1) would signal the process group or every process.
  if (pid <= 0) return Internal("device {} has no process id", device);
  devices_[device].killed_ns = MonotonicNanos();
  ::kill(pid, SIGKILL);
  return Status::Ok();
}

Status WorkerGroup::SetDeviceSpeed(int device, double speed) {
  if (device < 0 || device >= static_cast<int>(devices_.size()) || !alive(device))
    return InvalidArgument("device {} is not alive", device);
  if (!(speed > 0 && speed <= 1)) return InvalidArgument("a compute speed must be in (0, 1]");
  WireWriter w;
  w.Put<double>(speed);
  const Sent sent = SendAll({device}, WorkerOp::kSetSpeed, w.data());
  for (const DeviceReply& r : Collect(sent, deadline_.floor_ms())) FS_RETURN_IF_ERROR(r.status);
  return DeadAmong({device}, "while its speed was set");
}

std::vector<int> WorkerGroup::alive_devices() const {
  std::vector<int> out;
  for (size_t d = 0; d < devices_.size(); ++d) {
    if (alive(static_cast<int>(d))) out.push_back(static_cast<int>(d));
  }
  return out;
}

Status WorkerGroup::CheckHealth(int64_t timeout_ms) {
  for (int d : alive_devices()) {
    if (devices_[d].process->Exited()) MarkDead({d, "its process exited", 0});
  }
  std::erase_if(killed_, [](const auto& p) { return p->Reap(); });
  const std::vector<int> running = alive_devices();
  const Sent sent = SendAll(running, WorkerOp::kPing, "");
  // A device that misses the heartbeat is declared dead.
  Collect(sent, timeout_ms > 0 ? timeout_ms : deadline_.floor_ms());
  return Status::Ok();
}

Status WorkerGroup::DrainBackup() {
  std::vector<int> running;
  for (int d : plan_.active) {
    if (alive(d)) running.push_back(d);
  }
  const Sent sent = SendAll(running, WorkerOp::kDrainBackup, "");
  for (const DeviceReply& r : Collect(sent, options_.collective_timeout_ms))
    FS_RETURN_IF_ERROR(r.status);
  return DeadAmong(running, "while draining its KV backup");
}

Status WorkerGroup::SpawnDevice(int device, bool wait) {
  if (device < 0 || device >= options_.num_devices) {
    return OutOfRange("device id {} is out of range [0, {})", device, options_.num_devices);
  }
  if (alive(device)) return InvalidArgument("device {} is alive: it cannot rejoin", device);
  AwaitKilled(kKilledExitMs);
  const int64_t t0 = MonotonicNanos();
  FS_RETURN_IF_ERROR(Spawn(device, 0, wait));
  for (const DeviceReply& r : Collect({{device}, {DeviceProgress()}, t0}, kStartTimeoutMs))
    FS_RETURN_IF_ERROR(r.status);
  return DeadAmong({device}, "while starting");
}

Result<ApplyReport> WorkerGroup::ApplyPlan(const Plan& next, RecoveryMode mode,
                                           const DeviceRestores& seqs) {
  ApplyReport report;
  const int64_t t0 = MonotonicNanos();
  DropDegradedLinks(next.active);
  FS_RETURN_IF_ERROR(DeadAmong(next.active, "before the plan change"));
  FS_RETURN_IF_ERROR(FormGroup(next.active));
  report.group_ns = MonotonicNanos() - t0;
  ApplyPlanRequest req;
  req.prev_plan_json = PlanToJson(plan_);
  req.next_plan_json = PlanToJson(next);
  req.mode = static_cast<int32_t>(mode);
  // Each device gets its own block tables.
  const Sent sent = SendEach(next.active, WorkerOp::kApplyPlan, [&](int d) {
    req.seqs = d < static_cast<int>(seqs.size()) ? seqs[d] : std::vector<SeqRestore>{};
    WireWriter w;
    req.Encode(&w);
    return w.Take();
  });
  std::vector<DeviceReply> replies = Collect(sent, options_.collective_timeout_ms);
  FS_RETURN_IF_ERROR(DeadAmong(next.active, "while the plan was applied"));
  for (const DeviceReply& r : replies) {
    if (!r.status.ok()) return r.status.WithContext("device " + std::to_string(r.device));
    ApplyStats st;
    WireReader rd(r.body);
    if (!DecodeApplyStats(&rd, &st)) return Internal("device {}: malformed reply", r.device);
    report.devices.push_back(r.device);
    report.stats.push_back(st);
  }
  plan_ = next;
  FS_ASSIGN_OR_RETURN(std::vector<int64_t> capacity, KvCapacityFor(next));
  for (size_t d = 0; d < devices_.size(); ++d) devices_[d].kv_pages = capacity[d];
  report.wall_ns = MonotonicNanos() - t0;
  return report;
}

DeviceLoss WorkerGroup::device_loss(int device) const {
  if (alive(device)) return {};
  return devices_[device].loss;
}

int WorkerGroup::device_pid(int device) const {
  return alive(device) ? devices_[device].process->pid() : -1;
}

}  // namespace failsafe
