#include "worker/remote_link.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstring>
#include <utility>
#include <vector>

#include "comm/tcp.h"
#include "comm/tcp_loss.h"
#include "common/clock.h"
#include "common/log.h"
#include "worker/protocol.h"

namespace failsafe {

namespace {

// Silence from a listener before it gives a device id: it sends kIdle every
// heartbeat.
constexpr int64_t kWaitTimeoutMs = 15000;
// A frame whose first byte arrived is complete within this time.
constexpr int64_t kFrameTimeoutMs = 60000;

// Waits up to timeout_ms for the first byte of a frame, then reads it whole,
// refusing one larger than max_payload.
Status ReceiveWithin(Channel& ch, Message* m, int64_t timeout_ms,
                     uint64_t max_payload = Channel::kMaxPayload) {
  pollfd p{ch.fd(), POLLIN, 0};
  int r;
  do {
    r = ::poll(&p, 1, static_cast<int>(timeout_ms));
  } while (r < 0 && errno == EINTR);
  if (r == 0) return DeadlineExceeded("nothing heard for {} ms", timeout_ms);
  return ch.Receive(m, kFrameTimeoutMs, max_payload);
}

// One attempt at joining over a connected socket: the handshake, then the
// wait for a device id. A refusal fails with kFailedPrecondition; anything
// the connection did (closed, fell silent, sent what no coordinator sends)
// fails otherwise, and the caller may try again.
Status Handshake(Channel& ch, const JoinOptions& o, ClusterWelcome* welcome) {
  ClusterHello hello;
  hello.build_id = ClusterBuildId();
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  hello.host = host;
  hello.pid = ::getpid();
  hello.nonce = NewNonce();
  const std::string hello_bytes = hello.Encode();
  FS_RETURN_IF_ERROR(ch.Send(static_cast<uint32_t>(LinkOp::kHello), hello_bytes));
  bool proven = false;
  while (true) {
    // Nothing large is read before the coordinator has proven the token,
    // and nothing of a welcome, a refusal or an idle frame is large.
    Message m;
    FS_RETURN_IF_ERROR(ReceiveWithin(ch, &m, kWaitTimeoutMs, kMaxHandshakeFrame));
    switch (static_cast<LinkOp>(m.type)) {
      case LinkOp::kChallenge: {
        ClusterChallenge challenge;
        if (proven || !challenge.Decode(m.payload)) return Internal("malformed challenge");
        if (!TokensEqual(challenge.proof,
                         CoordinatorProof(o.token, hello_bytes, challenge.nonce))) {
          // Said, so that the coordinator's log tells why too; no proof of
          // this worker's own goes to a peer that has not proven the token.
          (void)ch.Send(static_cast<uint32_t>(LinkOp::kRefused),
                        "the coordinator's proof does not match the worker's cluster token");
          return FailedPrecondition(
              "the coordinator at {} does not know this cluster token (a wrong token on "
              "one side, or not the coordinator)",
              o.coordinator);
        }
        proven = true;
        FS_RETURN_IF_ERROR(ch.Send(static_cast<uint32_t>(LinkOp::kProof),
                                   WorkerProof(o.token, hello_bytes, challenge.nonce)));
        continue;
      }
      case LinkOp::kIdle:
        if (!proven) return Internal("an idle frame before the challenge");
        continue;
      case LinkOp::kRefused:
        return FailedPrecondition("the coordinator at {} refused this worker: {}", o.coordinator,
                                  m.payload);
      case LinkOp::kWelcome:
        if (!proven) return Internal("a welcome before the challenge");
        if (!welcome->Decode(m.payload)) return Internal("malformed welcome");
        return Status::Ok();
      default:
        return Internal("unexpected frame {} before the welcome", m.type);
    }
  }
}

}  // namespace

Result<std::unique_ptr<RemoteWorkerLink>> RemoteWorkerLink::Join(const JoinOptions& o) {
  FS_ASSIGN_OR_RETURN(auto hp, ParseHostPort(o.coordinator));
  auto link = std::unique_ptr<RemoteWorkerLink>(new RemoteWorkerLink());
  link->coordinator_ = o.coordinator;
  // The coordinator may not listen yet, or may drop a handshake under a
  // flood of connections: both are tried again until connect_timeout_ms.
  const int64_t give_up = MonotonicNanos() + o.connect_timeout_ms * 1000000;
  while (true) {
    const int64_t left_ms = std::max<int64_t>((give_up - MonotonicNanos()) / 1000000, 1);
    FS_ASSIGN_OR_RETURN(int fd, TcpConnect(hp.first, hp.second, left_ms, 200));
    link->channel_ = Channel(fd);
    link->local_address_ = LocalAddress(fd);
    const Status st = Handshake(link->channel_, o, &link->welcome_);
    if (st.ok()) break;
    if (st.code() == StatusCode::kFailedPrecondition) return st;
    if (MonotonicNanos() >= give_up) {
      return Unavailable("the coordinator at {} went away before giving a device id: {}",
                         o.coordinator, st.message());
    }
    FS_LOG_WARN("joining {} failed ({}); trying again", o.coordinator, st.message());
    link->channel_.Close();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  link->reader_ = std::thread([l = link.get()] { l->ReadLoop(); });
  link->heartbeat_ = std::thread([l = link.get()] { l->HeartbeatLoop(); });
  return link;
}

RemoteWorkerLink::~RemoteWorkerLink() {
  {
    std::lock_guard<std::mutex> lock(stop_mu_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  if (heartbeat_.joinable()) heartbeat_.join();
  // The reader stops when the socket is shut down.
  if (channel_.valid()) ::shutdown(channel_.fd(), SHUT_RDWR);
  if (reader_.joinable()) reader_.join();
}

void RemoteWorkerLink::Lost(const std::string& why) {
  // Like a local worker whose coordinator died (PDEATHSIG): nothing to save.
  FS_LOG_ERROR("lost the coordinator at {}: {}; exiting", coordinator_, why);
  std::fflush(stderr);
  ::_exit(kLinkLostExitCode);
}

void RemoteWorkerLink::ReadLoop() {
  while (true) {
    Message m;
    Status st = ReceiveWithin(channel_, &m, welcome_.link_timeout_ms);
    {
      std::lock_guard<std::mutex> lock(stop_mu_);
      if (stop_) break;
    }
    if (!st.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      if (shutting_down_) break;
    }
    if (!st.ok()) Lost(st.message());
    uint32_t epoch = 0;
    std::string body;
    if (!SplitLinkFrame(m.payload, &epoch, &body)) Lost("malformed frame");
    if (epoch != welcome_.epoch) {
      FS_LOG_WARN("dropping a frame of epoch {} (this link's is {})", epoch, welcome_.epoch);
      continue;
    }
    HandleFrame(m.type, body);
  }
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;
  cv_.notify_all();
}

void RemoteWorkerLink::HandleFrame(uint32_t type, const std::string& body) {
  switch (static_cast<LinkOp>(type)) {
    case LinkOp::kRequest: {
      if (body.size() < sizeof(uint32_t)) Lost("malformed request");
      Message m;
      std::memcpy(&m.type, body.data(), sizeof(uint32_t));
      m.payload = body.substr(sizeof(uint32_t));
      std::lock_guard<std::mutex> lock(mu_);
      // After a shutdown the coordinator closes the link: not a loss.
      if (static_cast<WorkerOp>(m.type & 0xff) == WorkerOp::kShutdown) shutting_down_ = true;
      requests_.push_back(std::move(m));
      cv_.notify_all();
      return;
    }
    case LinkOp::kHeartbeat: {
      // Echoed in our next heartbeat, with how long we held it.
      WireReader r(body);
      const int64_t sent = r.Get<int64_t>();
      if (!r.ok()) return;
      std::lock_guard<std::mutex> lock(mu_);
      echo_ns_ = sent;
      echo_at_ns_ = MonotonicNanos();
      return;
    }
    case LinkOp::kAbortGroup: {
      WireReader r(body);
      const std::string prefix = r.GetString();
      std::lock_guard<std::mutex> lock(mu_);
      aborted_.insert(prefix);
      if (auto it = groups_.find(prefix); it != groups_.end()) it->second.Raise();
      return;
    }
    case LinkOp::kBackupFill: {
      WireReader r(body);
      const uint64_t n = r.Get<uint64_t>();
      std::lock_guard<std::mutex> lock(mu_);
      for (uint64_t i = 0; i < n && r.ok(); ++i) {
        const uint64_t offset = r.Get<uint64_t>();
        const std::string bytes = r.GetString();
        if (!r.ok() || !mirror_ || offset > mirror_bytes_ ||
            bytes.size() > mirror_bytes_ - offset) {
          FS_LOG_WARN("dropping a KV backup fill outside the mirror");
          return;
        }
        std::memcpy(mirror_ + offset, bytes.data(), bytes.size());
      }
      return;
    }
    case LinkOp::kKill:
      FS_LOG_WARN("killed by the coordinator (fault injection)");
      std::fflush(stderr);
      ::raise(SIGKILL);
      return;
    default:
      FS_LOG_WARN("ignoring link frame {}", type);
  }
}

void RemoteWorkerLink::HeartbeatLoop() {
  // Loss on the link itself is told with the collectives' (as toward the
  // coordinator's address).
  TcpLossSampler link_loss({channel_.fd()});
  const uint64_t coordinator_host = HostId(PeerAddress(channel_.fd()));
  std::unique_lock<std::mutex> stop_lock(stop_mu_);
  while (!stop_cv_.wait_for(stop_lock, std::chrono::milliseconds(welcome_.heartbeat_ms),
                            [&] { return stop_; })) {
    DeviceProgress p;
    int64_t echo = 0, held = 0;
    std::vector<std::pair<uint64_t, int64_t>> loss;  // (host, how long ago)
    uint64_t alias = 0;
    int64_t moved_ns = 0;
    const int64_t now = MonotonicNanos();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (progress_) {
        p.requests = progress_->requests.load(std::memory_order_acquire);
        p.entered = progress_->entered.load(std::memory_order_acquire);
        p.left = progress_->left.load(std::memory_order_acquire);
        // The peers its connections lost frames to within the window.
        alias = progress_->alias.load(std::memory_order_acquire);
        moved_ns = progress_->last_move_ns.load(std::memory_order_acquire);
        for (const LossPeer& l : DeviceProgressRegion::ReadLoss(*progress_)) {
          if (l.host != 0 && now - l.last_ns < kLossHeardNs)
            loss.push_back({l.host, std::max<int64_t>(0, now - l.last_ns)});
        }
      }
      if (echo_ns_ > 0) {
        echo = echo_ns_;
        held = MonotonicNanos() - echo_at_ns_;
      }
    }
    for (const TcpLossSampler::Lossy& l : link_loss.Sample(now))
      loss.insert(loss.begin(), {coordinator_host, std::max<int64_t>(0, now - l.last_ns)});
    if (loss.size() > kLossPeers + 1) loss.resize(kLossPeers + 1);  // what the coordinator reads
    WireWriter w;
    w.Put(p.requests);
    w.Put(p.entered);
    w.Put(p.left);
    w.Put(echo);
    w.Put(held);
    // (Each as its host and how long ago: the coordinator's clock is not ours.)
    w.Put<uint32_t>(static_cast<uint32_t>(loss.size()));
    for (const auto& [host, ago] : loss) {
      w.Put(host);
      w.Put(ago);
    }
    w.Put(alias);
    // How long ago it last moved in any way: a request or a collective, or
    // a sign of life that counts nothing (its backup writer's copies, a
    // GPU's long choice of a product's algorithms); -1: never.
    w.Put<int64_t>(moved_ns > 0 ? std::max<int64_t>(0, MonotonicNanos() - moved_ns) : -1);
    // A send that fails means the coordinator is gone; the reader sees it.
    (void)Send(LinkOp::kHeartbeat, w.data());
  }
}

Status RemoteWorkerLink::Receive(Message* m) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return closed_ || !requests_.empty(); });
  if (requests_.empty()) return Unavailable("the coordinator is gone");
  *m = std::move(requests_.front());
  requests_.pop_front();
  return Status::Ok();
}

Status RemoteWorkerLink::SendReply(uint32_t type, const std::string& payload) {
  std::string body(sizeof(type), '\0');
  std::memcpy(body.data(), &type, sizeof(type));
  body += payload;
  return Send(LinkOp::kReply, body);
}

Status RemoteWorkerLink::Send(LinkOp op, const std::string& body) {
  std::lock_guard<std::mutex> lock(send_mu_);
  return channel_.Send(static_cast<uint32_t>(op), LinkFrame(welcome_.epoch, body));
}

void RemoteWorkerLink::SetProgressSlot(DeviceProgressSlot* slot) {
  std::lock_guard<std::mutex> lock(mu_);
  progress_ = slot;
}

void RemoteWorkerLink::RegisterGroup(const std::string& prefix, const AbortSignal& signal) {
  std::lock_guard<std::mutex> lock(mu_);
  // Only the newest group matters: older ones are never used again.
  groups_.clear();
  if (aborted_.count(prefix)) signal.Raise();
  auto mapped = AbortSignal::Map(::dup(signal.fd()));
  if (mapped.ok()) groups_.emplace(prefix, std::move(*mapped));
}

void RemoteWorkerLink::SetBackupMirror(void* base, size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  mirror_ = static_cast<char*>(base);
  mirror_bytes_ = bytes;
}

}  // namespace failsafe
