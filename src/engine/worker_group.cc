#include "engine/worker_group.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstring>

#include "comm/shm_communicator.h"
#include "common/clock.h"
#include "common/log.h"
#include "placement/plan_json.h"
#include "placement/plan_stats.h"

namespace failsafe {

namespace {

int PidfdOpen(pid_t pid) { return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)); }

// After a missed deadline: how long devices blocked behind a hung peer get to
// answer once the group is aborted.
constexpr int64_t kGraceMs = 1000;

}  // namespace

int64_t ActivationReserveBytes(const ModelConfig& c, int max_step_tokens) {
  // Step scratch: about eight hidden-sized rows and the FFN activations per token.
  return static_cast<int64_t>(max_step_tokens) * (8LL * c.hidden_size + 3LL * c.intermediate_size) *
         4;
}

namespace {}  // namespace

Result<std::unique_ptr<WorkerGroup>> WorkerGroup::Start(const WorkerGroupOptions& options) {
  std::signal(SIGPIPE, SIG_IGN);
  auto g = std::unique_ptr<WorkerGroup>(new WorkerGroup());
  g->options_ = options;
  FS_ASSIGN_OR_RETURN(g->config_, ModelConfig::Load(options.model_dir));
  std::vector<int> alive = options.alive;
  if (alive.empty()) {
    for (int d = 0; d < options.num_devices; ++d) alive.push_back(d);
  }
  FS_ASSIGN_OR_RETURN(g->plan_, MakePlan(g->config_, options.policy, options.num_devices, alive));
  // Check the weights and the memory budget here, so that bad input fails
  // before any process starts.
  FS_ASSIGN_OR_RETURN(auto host, WeightStore::Open(options.model_dir, g->config_));
  host.reset();
  const int64_t slots = static_cast<int64_t>(g->config_.num_layers) * g->config_.num_kv_heads;
  const int64_t page_bytes = 2LL * options.block_size * g->config_.head_dim * 4;
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
                                             options.max_seqs, options.num_devices));
  }
  const size_t logits_bytes =
      static_cast<size_t>(options.max_logits_rows) * g->config_.vocab_size * sizeof(float);
  FS_ASSIGN_OR_RETURN(g->logits_, ShmRegion::Create("failsafe-logits", logits_bytes));
  if (options.comm == CommKind::kGloo) {
    FS_ASSIGN_OR_RETURN(g->store_, KvStoreServer::Start(options.gloo_hostname, 0));
  }
  g->devices_.resize(options.num_devices);
  for (int d : g->plan_.alive) {
    FS_RETURN_IF_ERROR(g->Spawn(d));
    FS_RETURN_IF_ERROR(g->InitDevice(d));
    g->devices_[d].kv_pages = capacity[d];
  }
  for (auto& [d, st] : g->CollectAll(g->plan_.alive, 60000, nullptr)) {
    if (!st.ok()) return st.WithContext("device " + std::to_string(d));
  }
  FS_RETURN_IF_ERROR(g->SendAll(g->plan_.active, WorkerOp::kLoadPlan, PlanToJson(g->plan_)));
  std::vector<std::string> bodies;
  auto replies = g->CollectAll(g->plan_.active, options.step_timeout_ms, &bodies);
  if (replies.size() != g->plan_.active.size())
    return Unavailable("a device died while loading its weights");
  for (size_t i = 0; i < replies.size(); ++i) {
    if (!replies[i].second.ok())
      return replies[i].second.WithContext("device " + std::to_string(replies[i].first));
    WireReader r(bodies[i]);
    g->devices_[replies[i].first].weight_bytes = r.Get<int64_t>();
  }
  FS_RETURN_IF_ERROR(g->FormGroup(g->plan_.active));
  return g;
}

Status WorkerGroup::InitDevice(int d) {
  WorkerInit init;
  init.model_dir = options_.model_dir;
  init.threads = options_.threads_per_device;
  init.block_size = options_.block_size;
  init.logits_rows = options_.max_logits_rows;
  init.device_id = d;
  init.kv_pages = pool_pages_;
  WireWriter w;
  init.Encode(&w);
  std::vector<int> fds = {logits_.fd()};
  if (backup_) fds.push_back(backup_->region().fd());
  return SendTo(d, WorkerOp::kInit, w.data(), fds);
}

Result<std::vector<int64_t>> WorkerGroup::KvCapacityFor(const Plan& plan) const {
  std::vector<int64_t> cap(plan.num_devices, 0);
  if (options_.kv_pages == 0 && options_.device_memory_bytes > 0) {
    const int64_t page_bytes = 2LL * options_.block_size * config_.head_dim * 4;
    FS_ASSIGN_OR_RETURN(
        cap,
        KvPagesWithinBudget(plan, config_, options_.device_memory_bytes,
                            ActivationReserveBytes(config_, options_.max_step_tokens), page_bytes));
  } else {
    for (int d : plan.active) cap[d] = pool_pages_;
  }
  for (auto& c : cap) c = std::min(c, pool_pages_);
  return cap;
}

WorkerGroup::~WorkerGroup() {
  std::vector<int> alive;
  for (auto& d : devices_) {
    if (d.alive) alive.push_back(d.id);
  }
  (void)SendAll(alive, WorkerOp::kShutdown, "");
  CollectAll(alive, 2000, nullptr);
  for (auto& d : devices_) {
    if (d.pid > 0) {
      ::kill(d.pid, SIGKILL);
      ::waitpid(d.pid, nullptr, 0);
    }
    if (d.pidfd >= 0) ::close(d.pidfd);
  }
}

Status WorkerGroup::Spawn(int device) {
  FS_ASSIGN_OR_RETURN(auto pair, Channel::Pair());
  std::string dev = std::to_string(device);
  std::vector<std::string> args = {options_.worker_binary, "worker",          "--fd", "3",
                                   "--log-level",          options_.log_level};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const int child_fd = pair.second.fd();
  pid_t pid = ::fork();
  if (pid < 0) return Internal("fork: {}", std::strerror(errno));
  if (pid == 0) {
    // Only async-signal-safe calls until exec.
    if (child_fd == 3) {
      ::fcntl(3, F_SETFD, 0);
    } else {
      ::dup2(child_fd, 3);
    }
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  pair.second.Close();
  Device& d = devices_[device];
  d.id = device;
  d.pid = pid;
  d.pidfd = PidfdOpen(pid);
  d.channel = std::move(pair.first);
  d.alive = true;
  d.detected_ns = d.killed_ns = 0;
  d.loss_reason.clear();
  FS_LOG_INFO("device {}: worker process {}", device, pid);
  return Status::Ok();
}

// Requests carry a sequence number in the frame type (op in the low 8 bits);
// the reply echoes it, so a late reply to an abandoned request is never taken
// for the answer to a newer one.
Status WorkerGroup::SendTo(int device, WorkerOp op, const std::string& payload,
                           const std::vector<int>& fds) {
  Device& d = devices_[device];
  d.request_seq = (d.request_seq + 1) & 0xffffff;
  return d.channel.Send(static_cast<uint32_t>(op) | (d.request_seq << 8), payload, fds);
}

Status WorkerGroup::SendAll(const std::vector<int>& devices, WorkerOp op,
                            const std::string& payload, const std::vector<std::vector<int>>& fds) {
  for (size_t i = 0; i < devices.size(); ++i) {
    Device& d = devices_[devices[i]];
    if (!d.alive) continue;
    Status st = SendTo(d.id, op, payload, fds.empty() ? std::vector<int>{} : fds[i]);
    if (!st.ok()) MarkDead(d.id, "its channel is closed");
  }
  return Status::Ok();
}

void WorkerGroup::MarkDead(int device, const char* why) {
  Device& d = devices_[device];
  if (!d.alive) return;
  d.alive = false;
  d.detected_ns = MonotonicNanos();
  d.loss_reason = why;
  FS_LOG_WARN("device {} is dead: {}", device, why);
  // No survivor may wait for it in a collective.
  if (comm_region_.valid()) ShmCommunicator::AbortRegion(comm_region_);
  ::kill(d.pid, SIGKILL);
  ::waitpid(d.pid, nullptr, 0);
  d.pid = -1;
  if (d.pidfd >= 0) ::close(d.pidfd);
  d.pidfd = -1;
  d.channel.Close();
}

std::vector<std::pair<int, Status>> WorkerGroup::CollectAll(const std::vector<int>& devices,
                                                            int64_t timeout_ms,
                                                            std::vector<std::string>* bodies) {
  std::vector<std::pair<int, Status>> out;
  std::vector<int> pending;
  for (int d : devices) {
    if (devices_[d].alive) pending.push_back(d);
  }
  std::vector<std::pair<int, std::string>> got;
  int64_t deadline = MonotonicNanos() + timeout_ms * 1000000;
  bool grace = false;
  while (!pending.empty()) {
    std::vector<pollfd> fds;
    for (int d : pending) {
      fds.push_back({devices_[d].channel.fd(), POLLIN, 0});
      fds.push_back({devices_[d].pidfd, POLLIN, 0});
    }
    const int64_t left_ms = (deadline - MonotonicNanos()) / 1000000;
    if (left_ms <= 0) {
      if (!grace && comm_region_.valid()) {
        // Devices waiting in a collective for a hung peer are not hung
        // themselves: abort the group and give them a moment to answer.
        grace = true;
        ShmCommunicator::AbortRegion(comm_region_);
        deadline = MonotonicNanos() + kGraceMs * 1000000;
        continue;
      }
      for (int d : pending) MarkDead(d, "it missed the deadline");
      break;
    }
    int r = ::poll(fds.data(), fds.size(), static_cast<int>(std::min<int64_t>(left_ms, 1 << 30)));
    if (r < 0 && errno == EINTR) continue;
    std::vector<int> still;
    for (size_t i = 0; i < pending.size(); ++i) {
      const int d = pending[i];
      const bool readable = fds[2 * i].revents & POLLIN;
      const bool exited = fds[2 * i + 1].revents != 0;
      if (readable) {
        Message m;
        Status st = devices_[d].channel.Receive(&m, 10000);
        if (st.ok() && (m.type >> 8) != devices_[d].request_seq) {
          FS_LOG_WARN("device {}: discarding a late reply", d);
          still.push_back(d);
          continue;
        }
        if (st.ok()) {
          std::string body;
          Status reply = DecodeReply(m.payload, &body);
          // A device that failed on its own must not leave the others waiting
          // in a collective for it.
          if (!reply.ok() && reply.code() != StatusCode::kAborted && comm_region_.valid()) {
            ShmCommunicator::AbortRegion(comm_region_);
          }
          out.emplace_back(d, reply);
          got.emplace_back(d, std::move(body));
          continue;
        }
        MarkDead(d, "its channel closed");
      } else if (exited || (fds[2 * i].revents & (POLLHUP | POLLERR))) {
        MarkDead(d, "its process exited");
      } else {
        still.push_back(d);
      }
    }
    pending.swap(still);
  }
  if (bodies) {
    bodies->clear();
    for (auto& [d, body] : got) bodies->push_back(std::move(body));
  }
  return out;
}

Status WorkerGroup::FormGroup(const std::vector<int>& members) {
  ++epoch_;
  GroupSpec spec;
  spec.size = static_cast<int32_t>(members.size());
  spec.timeout_ms = options_.collective_timeout_ms;
  std::vector<std::vector<int>> fds;
  if (options_.comm == CommKind::kShm) {
    const size_t slot =
        static_cast<size_t>(options_.max_step_tokens) * config_.hidden_size * sizeof(float);
    FS_ASSIGN_OR_RETURN(
        comm_region_, ShmCommunicator::CreateRegion(spec.size, std::min<size_t>(slot, 16u << 20)));
    for (size_t i = 0; i < members.size(); ++i) fds.push_back({comm_region_.fd()});
  } else {
    spec.kind = CommKind::kGloo;
    spec.store_host = store_->host();
    spec.store_port = store_->port();
    spec.prefix = "epoch" + std::to_string(epoch_);
    spec.hostname = options_.gloo_hostname;
  }
  // Each member needs its own rank: send one by one, then collect.
  for (size_t i = 0; i < members.size(); ++i) {
    spec.rank = static_cast<int32_t>(i);
    WireWriter w;
    spec.Encode(&w);
    Device& d = devices_[members[i]];
    Status st =
        SendTo(d.id, WorkerOp::kJoinGroup, w.data(), fds.empty() ? std::vector<int>{} : fds[i]);
    if (!st.ok()) MarkDead(d.id, "its channel is closed");
  }
  auto replies = CollectAll(members, options_.collective_timeout_ms, nullptr);
  if (replies.size() != members.size()) return Unavailable("a device died while joining the group");
  for (auto& [d, st] : replies) {
    if (!st.ok()) return st.WithContext("device " + std::to_string(d));
  }
  return Status::Ok();
}

Result<const float*> WorkerGroup::Step(const StepBatch& batch, StepTiming* timing) {
  if (batch.num_logits_rows > options_.max_logits_rows) {
    return InvalidArgument("step needs {} logits rows; the group was started with {}",
                           batch.num_logits_rows, options_.max_logits_rows);
  }
  for (int d : plan_.active) {
    if (!devices_[d].alive) return Unavailable("device {} is dead", d);
  }
  const int64_t t0 = MonotonicNanos();
  WireWriter w;
  EncodeBatch(batch, &w);
  FS_RETURN_IF_ERROR(SendAll(plan_.active, WorkerOp::kStep, w.data()));
  std::vector<std::string> bodies;
  auto replies = CollectAll(plan_.active, options_.step_timeout_ms, &bodies);
  std::vector<int> dead = dead_devices();
  if (!dead.empty()) {
    std::string list;
    for (int d : dead) list += (list.empty() ? "" : ", ") + std::to_string(d);
    return Unavailable("device(s) {} died during the step", list);
  }
  for (auto& [d, st] : replies) {
    if (!st.ok()) return st.WithContext("device " + std::to_string(d));
  }
  if (timing) {
    *timing = StepTiming();
    timing->wall_ns = MonotonicNanos() - t0;
    std::vector<ForwardStats> stats(replies.size());
    size_t segments = SIZE_MAX;
    for (size_t i = 0; i < replies.size(); ++i) {
      WireReader r(bodies[i]);
      if (!DecodeStats(&r, &stats[i]))
        return Internal("device {}: malformed step reply", replies[i].first);
      segments = std::min(segments, stats[i].segment_cpu_ns.size());
      int64_t total = 0;
      for (int64_t ns : stats[i].segment_cpu_ns) total += ns;
      timing->devices.push_back(replies[i].first);
      timing->device_compute_ns.push_back(total);
      timing->device_attention_flops.push_back(stats[i].attention_flops);
      timing->device_ffn_flops.push_back(stats[i].ffn_flops);
      timing->device_kv_bytes.push_back(stats[i].kv_bytes);
    }
    for (size_t s = 0; s < segments; ++s) {
      int64_t slowest = 0;
      for (auto& st : stats) slowest = std::max(slowest, st.segment_cpu_ns[s]);
      timing->emulated_ns += slowest;
      timing->segment_max_ns.push_back(slowest);
    }
  }
  return static_cast<const float*>(logits_.data());
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
  std::vector<int> alive;
  for (auto& d : devices_) {
    if (d.alive) alive.push_back(d.id);
  }
  FS_RETURN_IF_ERROR(SendAll(alive, WorkerOp::kFreeSeqs, w.data()));
  for (auto& [d, st] : CollectAll(alive, options_.step_timeout_ms, nullptr)) FS_RETURN_IF_ERROR(st);
  return Status::Ok();
}

std::vector<int> WorkerGroup::dead_devices() const {
  std::vector<int> out;
  for (int d : plan_.alive) {
    if (!devices_[d].alive) out.push_back(d);
  }
  return out;
}

Status WorkerGroup::KillDevice(int device) {
  if (device < 0 || device >= static_cast<int>(devices_.size()) || !devices_[device].alive) {
    return InvalidArgument("device {} is not alive", device);
  }
  devices_[device].killed_ns = MonotonicNanos();
  ::kill(devices_[device].pid, SIGKILL);
  return Status::Ok();
}

std::vector<int> WorkerGroup::alive_devices() const {
  std::vector<int> out;
  for (auto& d : devices_) {
    if (d.alive) out.push_back(d.id);
  }
  return out;
}

Status WorkerGroup::CheckHealth(int64_t timeout_ms) {
  std::vector<int> alive = alive_devices();
  for (int d : alive) {
    pollfd p{devices_[d].pidfd, POLLIN, 0};
    if (::poll(&p, 1, 0) > 0) MarkDead(d, "its process exited");
  }
  alive = alive_devices();
  FS_RETURN_IF_ERROR(SendAll(alive, WorkerOp::kPing, ""));
  CollectAll(alive, timeout_ms, nullptr);  // a device that misses the heartbeat is marked dead
  return Status::Ok();
}

Status WorkerGroup::DrainBackup() {
  std::vector<int> alive;
  for (int d : plan_.active) {
    if (devices_[d].alive) alive.push_back(d);
  }
  FS_RETURN_IF_ERROR(SendAll(alive, WorkerOp::kDrainBackup, ""));
  auto replies = CollectAll(alive, options_.step_timeout_ms, nullptr);
  for (auto& [d, st] : replies) FS_RETURN_IF_ERROR(st);
  if (replies.size() != alive.size())
    return Unavailable("a device died while draining its KV backup");
  return Status::Ok();
}

Status WorkerGroup::SpawnDevice(int device) {
  if (device < 0 || device >= options_.num_devices) {
    return OutOfRange("device id {} is out of range [0, {})", device, options_.num_devices);
  }
  if (devices_[device].alive)
    return InvalidArgument("device {} is alive: it cannot rejoin", device);
  FS_RETURN_IF_ERROR(Spawn(device));
  FS_RETURN_IF_ERROR(InitDevice(device));
  auto replies = CollectAll({device}, 60000, nullptr);
  if (replies.empty()) return Unavailable("device {} died while starting", device);
  return replies[0].second;
}

Result<ApplyReport> WorkerGroup::ApplyPlan(const Plan& next, RecoveryMode mode,
                                           const std::vector<SeqRestore>& seqs) {
  ApplyReport report;
  const int64_t t0 = MonotonicNanos();
  for (int d : next.active) {
    if (!devices_[d].alive) return Unavailable("device {} is not alive", d);
  }
  FS_RETURN_IF_ERROR(FormGroup(next.active));
  report.group_ns = MonotonicNanos() - t0;
  ApplyPlanRequest req;
  req.prev_plan_json = PlanToJson(plan_);
  req.next_plan_json = PlanToJson(next);
  req.mode = static_cast<int32_t>(mode);
  req.seqs = seqs;
  WireWriter w;
  req.Encode(&w);
  FS_RETURN_IF_ERROR(SendAll(next.active, WorkerOp::kApplyPlan, w.data()));
  std::vector<std::string> bodies;
  auto replies = CollectAll(next.active, options_.step_timeout_ms, &bodies);
  if (replies.size() != next.active.size()) {
    std::string list;
    for (int d : next.active) {
      if (!devices_[d].alive) list += (list.empty() ? "" : ", ") + std::to_string(d);
    }
    return Unavailable("device(s) {} died while the plan was applied", list);
  }
  for (size_t i = 0; i < replies.size(); ++i) {
    if (!replies[i].second.ok())
      return replies[i].second.WithContext("device " + std::to_string(replies[i].first));
    ApplyStats st;
    WireReader r(bodies[i]);
    if (!DecodeApplyStats(&r, &st)) return Internal("device {}: malformed reply", replies[i].first);
    report.devices.push_back(replies[i].first);
    report.stats.push_back(st);
  }
  plan_ = next;
  FS_ASSIGN_OR_RETURN(std::vector<int64_t> capacity, KvCapacityFor(next));
  for (size_t d = 0; d < devices_.size(); ++d) devices_[d].kv_pages = capacity[d];
  report.wall_ns = MonotonicNanos() - t0;
  return report;
}

DeviceLoss WorkerGroup::device_loss(int device) const {
  const Device& d = devices_[device];
  if (d.alive || d.detected_ns == 0) return {};
  return {d.killed_ns > 0 && d.killed_ns <= d.detected_ns ? d.killed_ns : 0, d.detected_ns,
          d.loss_reason};
}

pid_t WorkerGroup::device_pid(int device) const { return devices_[device].pid; }

int64_t WorkerGroup::device_weight_bytes(int device) const { return devices_[device].weight_bytes; }

}  // namespace failsafe
