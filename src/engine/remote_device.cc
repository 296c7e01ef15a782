#include "engine/remote_device.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <set>

#include "common/clock.h"
#include "common/log.h"
#include "placement/plan_json.h"
#include "worker/protocol.h"

namespace failsafe {

namespace {

// A frame whose first byte arrived is complete within this time.
constexpr int64_t kFrameTimeoutMs = 60000;

void Signal(int efd) {
  const uint64_t one = 1;
  (void)!::write(efd, &one, sizeof(one));
}

}  // namespace

Result<std::unique_ptr<RemoteDevice>> RemoteDevice::Start(Channel tcp, int device,
                                                          const ClusterWelcome& welcome,
                                                          std::string peer, std::string addr) {
  auto d = std::unique_ptr<RemoteDevice>(new RemoteDevice());
  d->device_ = device;
  d->welcome_ = welcome;
  d->peer_ = std::move(peer);
  d->addr_ = std::move(addr);
  d->tcp_ = std::move(tcp);
  FS_ASSIGN_OR_RETURN(auto pair, Channel::Pair());
  d->local_coordinator_end_ = std::move(pair.first);
  d->local_ = std::move(pair.second);
  d->lost_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  d->wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (d->lost_fd_ < 0 || d->wake_fd_ < 0) return Internal("eventfd: {}", std::strerror(errno));
  d->proxy_ = std::thread([p = d.get()] { p->Run(); });
  d->watcher_ = std::thread([p = d.get()] { p->WatchAborts(); });
  return d;
}

RemoteDevice::~RemoteDevice() {
  Close();
  if (proxy_.joinable()) proxy_.join();
  if (watcher_.joinable()) watcher_.join();
  for (int fd : {lost_fd_, wake_fd_}) {
    if (fd >= 0) ::close(fd);
  }
}

void RemoteDevice::Close() {
  {
    std::lock_guard<std::mutex> lock(group_mu_);
    stop_ = true;
    if (group_) group_->Wake();
  }
  group_cv_.notify_all();
  if (wake_fd_ >= 0) Signal(wake_fd_);
  // A thread blocked mid-frame (a large reply arriving over a lossy link, a
  // send the link holds back) returns now rather than when the frame
  // completes or times out: the coordinator that fences a device waits for
  // these threads, and nothing more of the frame may reach it.
  if (tcp_.valid()) ::shutdown(tcp_.fd(), SHUT_RDWR);
}

Status RemoteDevice::KillWorker() { return SendFrame(LinkOp::kKill, ""); }

Status RemoteDevice::SendFrame(LinkOp op, const std::string& body) {
  std::lock_guard<std::mutex> lock(send_mu_);
  if (lost_) return Unavailable("the link to {} is lost", peer_);
  bytes_sent_ += static_cast<int64_t>(body.size() + 20);
  return tcp_.Send(static_cast<uint32_t>(op), LinkFrame(welcome_.epoch, body));
}

void RemoteDevice::Lose(const std::string& why) {
  if (lost_.exchange(true)) return;
  bool closed = false;  // by Close(): no news
  {
    std::lock_guard<std::mutex> lock(group_mu_);
    closed = stop_;
  }
  if (!closed) FS_LOG_WARN("device {} ({}): link lost: {}", device_, peer_, why);
  Signal(lost_fd_);
}

void RemoteDevice::NoteLinkDelay(int64_t now_ns, int64_t delay_ns) {
  constexpr int64_t kWindowNs = 2000 * 1000000LL;
  while (!link_delays_.empty() && now_ns - link_delays_.front().first > kWindowNs)
    link_delays_.pop_front();
  if (delay_ns > 0) link_delays_.emplace_back(now_ns, delay_ns);
  if (!progress_.valid()) return;
  DeviceProgressSlot* slot = progress_.slot(device_);
  if (!slot) return;
  int64_t worst = 0;
  for (const auto& [at, delay] : link_delays_) worst = std::max(worst, delay);
  if (worst > 0) slot->link_rtt_ns.store(worst, std::memory_order_release);
}

void RemoteDevice::CheckRetransmits(int64_t now_ns) {
  // A frame of ours the link lost: the kernel's TCP state says so once its
  // retransmission timer has fired (at least 200 ms after the frame went
  // out) until the frame is acknowledged, before any late heartbeat of the
  // worker's can show it. Only a timeout counts as a delay: fast
  // retransmits and tail loss probes are what congestion control does on a
  // healthy link too. Loss the sampler finds (a timeout pending, or
  // segments lost that the worker did not have) counts as loss between the
  // device's host and the coordinator's (the hang watch's LossyHost), which
  // is weighed only while a step stalls.
  tcp_info ti{};
  socklen_t len = sizeof(ti);
  if (::getsockopt(tcp_.fd(), IPPROTO_TCP, TCP_INFO, &ti, &len) != 0) return;
  if (ti.tcpi_retransmits > 0)
    NoteLinkDelay(now_ns, std::max<int64_t>(1, static_cast<int64_t>(ti.tcpi_rto) * 1000));
  if (!link_loss_) link_loss_ = std::make_unique<TcpLossSampler>(std::vector<int>{tcp_.fd()});
  DeviceProgressSlot* slot = progress_.valid() ? progress_.slot(device_) : nullptr;
  for (const TcpLossSampler::Lossy& l : link_loss_->Sample(now_ns))
    DeviceProgressRegion::NoteLoss(slot, kCoordinatorHostId, l.last_ns);
}

void RemoteDevice::Run() {
  int64_t last_heard = MonotonicNanos(), last_sent = 0;
  const int64_t beat_ns = welcome_.heartbeat_ms * 1000000;
  const int64_t timeout_ns = welcome_.link_timeout_ms * 1000000;
  while (!lost_) {
    const int64_t now = MonotonicNanos();
    if (now - last_sent >= beat_ns) {
      // The worker echoes the time it was sent: the link's round trip.
      WireWriter beat;
      beat.Put(now);
      if (!SendFrame(LinkOp::kHeartbeat, beat.data()).ok()) {
        Lose("the connection is closed");
        break;
      }
      last_sent = now;
      CheckRetransmits(now);
    }
    if (now - last_heard > timeout_ns) {
      Lose(fmt::format("no heartbeat for {} ms", (now - last_heard) / 1000000));
      break;
    }
    pollfd fds[3] = {{tcp_.fd(), POLLIN, 0}, {local_.fd(), POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    const int r = ::poll(fds, 3, static_cast<int>(welcome_.heartbeat_ms));
    if (r < 0 && errno == EINTR) continue;
    if (fds[2].revents) break;  // Close()
    if (fds[1].revents) {
      Message m;
      if (!local_.Receive(&m, kFrameTimeoutMs).ok()) break;  // the coordinator let go
      Status st = Forward(m);
      for (int fd : m.fds) ::close(fd);
      if (!st.ok()) {
        Lose(st.ToString());
        break;
      }
    }
    if (fds[0].revents) {
      Message m;
      Status st = tcp_.Receive(&m, kFrameTimeoutMs);
      if (!st.ok()) {
        Lose(st.code() == StatusCode::kUnavailable ? "the connection closed" : st.ToString());
        break;
      }
      last_heard = MonotonicNanos();
      bytes_received_ += static_cast<int64_t>(m.payload.size() + 16);
      uint32_t epoch = 0;
      std::string body;
      if (!SplitLinkFrame(m.payload, &epoch, &body)) {
        Lose("a malformed frame");
        break;
      }
      if (epoch != welcome_.epoch) {
        FS_LOG_WARN("device {}: dropping a frame of epoch {} (the link's is {})", device_, epoch,
                    welcome_.epoch);
        continue;
      }
      st = Receive(m.type, body);
      if (!st.ok()) {
        Lose(st.ToString());
        break;
      }
    }
  }
  // The worker sees the connection close and exits.
  std::lock_guard<std::mutex> lock(send_mu_);
  if (tcp_.valid()) ::shutdown(tcp_.fd(), SHUT_RDWR);
  lost_ = true;
  Signal(lost_fd_);
}

Status RemoteDevice::Forward(Message& m) {
  request_seq_ = m.type >> 8;
  std::string payload = m.payload;
  switch (static_cast<WorkerOp>(m.type & 0xff)) {
    case WorkerOp::kInit: {
      // fds: logits, progress, (KV backup). The worker keeps its own; this
      // proxy writes what it sends into the coordinator's.
      if (m.fds.size() < 2) return InvalidArgument("an init without its regions");
      FS_ASSIGN_OR_RETURN(logits_, ShmRegion::Map(::dup(m.fds[0])));
      FS_ASSIGN_OR_RETURN(progress_, DeviceProgressRegion::Map(::dup(m.fds[1])));
      if (DeviceProgressSlot* slot = progress_.slot(device_); slot && !addr_.empty())
        slot->host.store(HostId(addr_), std::memory_order_release);
      WireWriter w;
      w.Put<uint8_t>(m.fds.size() > 2 ? 1 : 0);
      if (m.fds.size() > 2) {
        FS_ASSIGN_OR_RETURN(backup_, ShmRegion::Map(::dup(m.fds[2])));
        backup_layout_ = BackupLayout(*static_cast<const BackupHeader*>(backup_.data()));
        w.Put(backup_layout_.header());
      }
      payload += w.data();
      break;
    }
    case WorkerOp::kJoinGroup: {
      WireReader r(m.payload);
      GroupSpec spec;
      if (!spec.Decode(&r) || m.fds.size() != 1) return InvalidArgument("malformed group");
      if (spec.kind == CommKind::kGloo) {
        FS_ASSIGN_OR_RETURN(AbortSignal signal, AbortSignal::Map(::dup(m.fds[0])));
        std::lock_guard<std::mutex> lock(group_mu_);
        if (group_) group_->Wake();
        group_ = std::make_shared<AbortSignal>(std::move(signal));
        group_prefix_ = spec.prefix;
        group_cv_.notify_all();
      }
      break;
    }
    case WorkerOp::kApplyPlan:
      FS_RETURN_IF_ERROR(SendRestoreBlocks(m.payload));
      break;
    default:
      break;
  }
  std::string body(sizeof(uint32_t), '\0');
  std::memcpy(body.data(), &m.type, sizeof(uint32_t));
  body += payload;
  return SendFrame(LinkOp::kRequest, body);
}

Status RemoteDevice::Receive(uint32_t type, const std::string& body) {
  switch (static_cast<LinkOp>(type)) {
    case LinkOp::kReply: {
      if (body.size() < sizeof(uint32_t)) return Internal("malformed reply");
      uint32_t inner = 0;
      std::memcpy(&inner, body.data(), sizeof(inner));
      return local_.Send(inner, body.substr(sizeof(uint32_t)));
    }
    case LinkOp::kHeartbeat: {
      WireReader r(body);
      DeviceProgress p;
      p.requests = r.Get<uint64_t>();
      p.entered = r.Get<uint64_t>();
      p.left = r.Get<uint64_t>();
      if (!r.ok() || !progress_.valid()) return Status::Ok();
      // The latest heartbeat of ours it had (when we sent it, our clock) and
      // how long it held it before this one.
      int64_t echo_ns = r.Get<int64_t>(), held_ns = r.Get<int64_t>();
      if (!r.ok()) echo_ns = 0;
      DeviceProgressSlot* slot = progress_.slot(device_);
      if (!slot) return Status::Ok();
      const int64_t now = MonotonicNanos();
      const int64_t previous = slot->heard_ns.exchange(now, std::memory_order_acq_rel);
      // What the link costs now: the worst of the last few seconds' round
      // trips, and of the heartbeats' lateness (a frame lost and sent again
      // shows there first).
      if (previous > 0) NoteLinkDelay(now, now - previous - welcome_.heartbeat_ms * 1000000);
      if (echo_ns > 0 && echo_ns != last_echo_ns_) {
        last_echo_ns_ = echo_ns;
        NoteLinkDelay(now, std::max<int64_t>(1, now - echo_ns - held_ns));
        slot->link_rtt_samples.fetch_add(1, std::memory_order_relaxed);
      }
      // The peer hosts its collective connections lost frames to, and how
      // long ago (clocks of other hosts are not this one's).
      const uint32_t n = r.Get<uint32_t>();
      for (uint32_t i = 0; r.ok() && i < std::min<uint32_t>(n, kLossPeers + 1); ++i) {
        const uint64_t host = r.Get<uint64_t>();
        const int64_t ago = r.Get<int64_t>();
        if (r.ok() && ago >= 0 && ago < kLossHeardNs)
          DeviceProgressRegion::NoteLoss(slot, host, now - ago);
      }
      // The host id its collective peers know it by (the address it gives
      // them), if it said.
      if (const uint64_t alias = r.Get<uint64_t>(); r.ok())
        slot->alias.store(alias, std::memory_order_release);
      // Its latest move of any kind, as long ago as it said, where later
      // than any heard: a sign of life that changes no counter (its backup
      // writer's, a long choice's) keeps it from being taken for a hung
      // device. (The frame's time on its way makes the move look that much
      // newer, as a counter's change is dated when heard; never later than
      // now.)
      if (const int64_t ago = r.Get<int64_t>(); r.ok() && ago >= 0 && ago <= now) {
        const int64_t at = now - ago;
        int64_t seen = slot->last_move_ns.load(std::memory_order_acquire);
        while (at > seen && !slot->last_move_ns.compare_exchange_weak(
                                seen, at, std::memory_order_acq_rel, std::memory_order_acquire)) {
        }
      }
      // Clocks of other hosts are not this one's: a move is dated when heard.
      if (p.requests != last_heard_progress_.requests ||
          p.entered != last_heard_progress_.entered || p.left != last_heard_progress_.left) {
        slot->requests.store(p.requests, std::memory_order_relaxed);
        slot->entered.store(p.entered, std::memory_order_relaxed);
        slot->left.store(p.left, std::memory_order_relaxed);
        slot->last_move_ns.store(MonotonicNanos(), std::memory_order_release);
        last_heard_progress_ = p;
      }
      return Status::Ok();
    }
    case LinkOp::kLogits:
      WriteLogits(body);
      return Status::Ok();
    case LinkOp::kBackup:
      WriteBackup(body);
      return Status::Ok();
    default:
      FS_LOG_WARN("device {}: ignoring link frame {}", device_, type);
      return Status::Ok();
  }
}

void RemoteDevice::WriteLogits(const std::string& body) {
  LogitsColumns c;
  if (!c.Decode(body) || !logits_.valid()) {
    FS_LOG_WARN("device {}: dropping malformed logits", device_);
    return;
  }
  // Columns of an abandoned step must not land over a newer step's.
  if (c.seq != request_seq_) return;
  if (static_cast<size_t>(c.rows) * c.vocab * sizeof(float) > logits_.size()) {
    FS_LOG_WARN("device {}: dropping logits larger than the region", device_);
    return;
  }
  auto* out = static_cast<float*>(logits_.data());
  const float* in = c.values.data();
  for (const auto& [begin, end] : c.ranges) {
    for (int r = 0; r < c.rows; ++r) {
      std::memcpy(out + static_cast<int64_t>(r) * c.vocab + begin, in,
                  sizeof(float) * (end - begin));
      in += end - begin;
    }
  }
}

void RemoteDevice::WriteBackup(const std::string& body) {
  BackupUpload up;
  if (!up.Decode(body) || !backup_.valid() || up.slot < 0 ||
      up.slot >= backup_layout_.header().max_seqs ||
      device_ >= backup_layout_.header().num_devices) {
    FS_LOG_WARN("device {}: dropping a malformed KV backup upload", device_);
    return;
  }
  const size_t blocks_begin = backup_layout_.header_bytes() + backup_layout_.progress_bytes();
  for (const auto& [offset, bytes] : up.ranges) {
    if (offset < blocks_begin || offset > backup_.size() ||
        bytes.size() > backup_.size() - offset) {
      FS_LOG_WARN("device {}: dropping a KV backup upload outside the blocks", device_);
      return;
    }
  }
  for (const auto& [offset, bytes] : up.ranges) {
    std::memcpy(static_cast<char*>(backup_.data()) + offset, bytes.data(), bytes.size());
  }
  // Published after the bytes, as a local device's writer does.
  BackupProgress* p = backup_layout_.Progress(backup_.data(), up.slot, device_);
  if (p->seq_id.load(std::memory_order_relaxed) != up.seq_id) {
    p->tokens.store(0, std::memory_order_relaxed);
    p->seq_id.store(up.seq_id, std::memory_order_relaxed);
  }
  p->tokens.store(up.tokens, std::memory_order_release);
}

Status RemoteDevice::SendRestoreBlocks(const std::string& payload) {
  if (!backup_.valid()) return Status::Ok();
  WireReader r(payload);
  ApplyPlanRequest req;
  if (!req.Decode(&r)) return InvalidArgument("malformed plan change");
  FS_ASSIGN_OR_RETURN(Plan next, PlanFromJson(req.next_plan_json));
  const BackupHeader& h = backup_layout_.header();
  const size_t slot_bytes = static_cast<size_t>(backup_layout_.slot_bytes());
  const char* base = static_cast<const char*>(backup_.data());
  // Per request, the (layer, head group) slots this device will hold.
  for (const SeqRestore& s : req.seqs) {
    if (s.restore_tokens <= 0) continue;
    std::vector<std::pair<int, int>> slots;
    for (int l = 0; l < h.num_layers && l < static_cast<int>(next.layers.size()); ++l) {
      const auto& layer = next.layers[l];
      if (device_ < static_cast<int>(layer.tp_heads.size())) {
        for (int head : layer.tp_heads[device_]) slots.emplace_back(l, head);
      }
      if (s.dp_rank == device_) {
        for (int head : layer.dp_heads) slots.emplace_back(l, head);
      }
    }
    WireWriter w;
    uint64_t n = 0;
    WireWriter ranges;
    for (int blk = s.restore_from / h.block_size; blk * h.block_size < s.restore_tokens; ++blk) {
      if (blk >= static_cast<int>(s.backup_blocks.size()) || s.backup_blocks[blk] < 0 ||
          s.backup_blocks[blk] >= h.num_blocks) {
        break;
      }
      for (const auto& [layer, head] : slots) {
        const char* src = backup_layout_.Slot(backup_.data(), s.backup_blocks[blk], layer, head);
        ranges.Put<uint64_t>(static_cast<uint64_t>(src - base));
        ranges.PutString(std::string(src, slot_bytes));
        ++n;
      }
    }
    w.Put<uint64_t>(n);
    FS_RETURN_IF_ERROR(SendFrame(LinkOp::kBackupFill, w.data() + ranges.data()));
  }
  return Status::Ok();
}

void RemoteDevice::WatchAborts() {
  std::shared_ptr<AbortSignal> forwarded;  // the last group whose abort went down
  std::unique_lock<std::mutex> lock(group_mu_);
  while (!stop_) {
    if (!group_) {
      group_cv_.wait(lock);
      continue;
    }
    std::shared_ptr<AbortSignal> group = group_;
    const std::string prefix = group_prefix_;
    const uint32_t seen = group->generation();
    if (group->raised() && forwarded != group) {
      forwarded = group;
      lock.unlock();
      WireWriter w;
      w.PutString(prefix);
      (void)SendFrame(LinkOp::kAbortGroup, w.data());
      lock.lock();
      continue;
    }
    lock.unlock();
    group->WaitChange(seen);
    lock.lock();
  }
}

}  // namespace failsafe
