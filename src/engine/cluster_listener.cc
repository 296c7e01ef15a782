#include "engine/cluster_listener.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "comm/tcp.h"
#include "common/clock.h"
#include "common/log.h"
#include "worker/cluster_protocol.h"

namespace failsafe {

struct ClusterListener::Handshake {
  int fd = -1;
  std::string addr;
  int64_t started_ns = 0;
  FrameReader frame{kMaxHandshakeFrame};
  bool challenged = false;  // the hello was answered; the proof comes next
  std::string hello_bytes;  // as the worker encoded it
  ClusterHello hello;
  std::string nonce;  // the coordinator's
  std::string peer;   // for logs
};

Result<std::shared_ptr<ClusterListener>> ClusterListener::Start(const ClusterListenerOptions& o) {
  if (o.token.empty()) {
    return InvalidArgument(
        "--listen needs a cluster token (--cluster-token-file FILE or FAILSAFE_CLUSTER_TOKEN)");
  }
  if (o.heartbeat_ms <= 0 || o.link_timeout_ms <= o.heartbeat_ms) {
    return InvalidArgument("the link timeout must exceed the heartbeat interval");
  }
  if (o.handshake_timeout_ms <= 0 || o.max_pending <= 0 || o.max_pending_per_peer <= 0) {
    return InvalidArgument("the handshake deadline and the pending limits must be positive");
  }
  auto l = std::shared_ptr<ClusterListener>(new ClusterListener());
  l->options_ = o;
  FS_ASSIGN_OR_RETURN(TcpListener tcp, TcpListen(o.host, o.port));
  l->listen_fd_ = tcp.fd;
  ::fcntl(l->listen_fd_, F_SETFL, ::fcntl(l->listen_fd_, F_GETFL) | O_NONBLOCK);
  l->port_ = tcp.port;
  l->wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (l->wake_fd_ < 0) return Internal("eventfd: {}", std::strerror(errno));
  l->thread_ = std::thread([p = l.get()] { p->Serve(); });
  FS_LOG_INFO("workers on other hosts join at {}:{}", o.host, l->port_);
  return l;
}

ClusterListener::~ClusterListener() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  const uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof(one));
  if (thread_.joinable()) thread_.join();
  for (auto& h : handshakes_) ::close(h->fd);
  for (int fd : {listen_fd_, wake_fd_}) {
    if (fd >= 0) ::close(fd);
  }
}

int ClusterListener::waiting() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(waiting_.size());
}

int ClusterListener::refused() const {
  std::lock_guard<std::mutex> lock(mu_);
  return refused_;
}

int ClusterListener::dropped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return dropped_;
}

void ClusterListener::Serve() {
  const int64_t heartbeat_ns = options_.heartbeat_ms * 1000000;
  const int64_t deadline_ns = options_.handshake_timeout_ms * 1000000;
  int64_t last_idle = 0;
  std::vector<pollfd> fds;
  while (true) {
    int64_t now = MonotonicNanos();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) return;
      // Waiting workers hear from the coordinator, and are dropped once
      // their connection closes.
      if (now - last_idle >= heartbeat_ns) {
        last_idle = now;
        std::erase_if(waiting_, [](Waiting& w) {
          pollfd p{w.channel.fd(), POLLIN, 0};
          if (::poll(&p, 1, 0) > 0) {
            FS_LOG_WARN("worker {} left before it got a device id", w.peer);
            return true;
          }
          return !w.channel.Send(static_cast<uint32_t>(LinkOp::kIdle), "").ok();
        });
      }
    }
    // Handshakes past their deadline go; the poll wakes for the next one.
    std::erase_if(handshakes_, [&](std::unique_ptr<Handshake>& h) {
      if (now - h->started_ns < deadline_ns) return false;
      Drop(*h, "did not finish its handshake in time");
      return true;
    });
    int64_t wake_ns = last_idle + heartbeat_ns;
    fds.assign({{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}});
    for (const auto& h : handshakes_) {
      fds.push_back({h->fd, POLLIN, 0});
      wake_ns = std::min(wake_ns, h->started_ns + deadline_ns);
    }
    const int timeout_ms = static_cast<int>(
        std::clamp<int64_t>((wake_ns - now) / 1000000 + 1, 0, options_.heartbeat_ms));
    const int r = ::poll(fds.data(), fds.size(), timeout_ms);
    if (r < 0 && errno == EINTR) continue;
    if (fds[1].revents) return;
    // The handshakes polled are the first fds.size() - 2 of handshakes_.
    size_t polled = fds.size() - 2, kept = 0;
    for (size_t i = 0; i < handshakes_.size(); ++i) {
      bool keep = true;
      if (i < polled && fds[i + 2].revents) keep = Progress(*handshakes_[i]);
      if (keep) handshakes_[kept++] = std::move(handshakes_[i]);
    }
    handshakes_.resize(kept);
    if (fds[0].revents & POLLIN) Accept(MonotonicNanos());
  }
}

void ClusterListener::Accept(int64_t now) {
  // Everything queued, so a flood cannot fill the kernel's backlog.
  while (true) {
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    const int fd =
        ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&ss), &len, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) return;
    // (As PeerAddress names it: the host a worker's gloo peers see.)
    const std::string found = PeerAddress(fd);
    const std::string addr = found.empty() ? std::string("?") : found;
    SetTcpNoDelay(fd);
    auto h = std::make_unique<Handshake>();
    h->fd = fd;
    h->addr = addr;
    h->peer = addr;
    h->started_ns = now;
    // Room for it: the oldest handshake of the same address if that address
    // holds its share, else the oldest of all if every place is taken.
    // (handshakes_ is in the order of arrival.)
    const auto same = [&](const std::unique_ptr<Handshake>& o) { return o->addr == h->addr; };
    auto victim = handshakes_.end();
    if (std::count_if(handshakes_.begin(), handshakes_.end(), same) >=
        options_.max_pending_per_peer) {
      victim = std::find_if(handshakes_.begin(), handshakes_.end(), same);
    } else if (static_cast<int>(handshakes_.size()) >= options_.max_pending) {
      victim = handshakes_.begin();
    }
    if (victim != handshakes_.end()) {
      Drop(**victim, "was pushed out by newer connections");
      handshakes_.erase(victim);
    }
    handshakes_.push_back(std::move(h));
  }
}

bool ClusterListener::Progress(Handshake& h) {
  char buf[512];
  while (!h.frame.done()) {
    const size_t want = std::min(h.frame.Want(), sizeof(buf));
    const ssize_t n = ::recv(h.fd, buf, want, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    if (n <= 0) {
      Drop(h, "closed the connection during its handshake");
      return false;
    }
    if (Status st = h.frame.Add(buf, static_cast<size_t>(n)); !st.ok()) {
      Drop(h, "sent " + st.message());
      return false;
    }
  }
  return h.challenged ? OnProof(h) : OnHello(h);
}

bool ClusterListener::OnHello(Handshake& h) {
  if (h.frame.type() != static_cast<uint32_t>(LinkOp::kHello)) {
    Refuse(h, InvalidArgument("the first frame is not a hello"));
    return false;
  }
  auto hello = ClusterHello::Decode(h.frame.payload());
  if (!hello.ok()) {
    Refuse(h, hello.status());
    return false;
  }
  h.hello = std::move(*hello);
  h.hello_bytes = h.frame.payload();
  h.peer = fmt::format("{} ({}, pid {})", h.hello.host, h.addr, h.hello.pid);
  h.nonce = NewNonce();
  ClusterChallenge challenge;
  challenge.nonce = h.nonce;
  challenge.proof = CoordinatorProof(options_.token, h.hello_bytes, h.nonce);
  // A few hundred bytes fit an empty socket buffer: the send does not block.
  Channel ch(h.fd);
  const Status st = ch.Send(static_cast<uint32_t>(LinkOp::kChallenge), challenge.Encode());
  ch.Release();
  if (!st.ok()) {
    Drop(h, "could not be sent its challenge: " + st.message());
    return false;
  }
  h.challenged = true;
  h.frame.Reset();
  return true;
}

bool ClusterListener::OnProof(Handshake& h) {
  if (h.frame.type() == static_cast<uint32_t>(LinkOp::kRefused)) {
    // What a stranger writes is not logged; what it means is.
    Refuse(h, FailedPrecondition(
                  "wrong cluster token (the worker found this coordinator's proof wrong)"));
    return false;
  }
  if (h.frame.type() != static_cast<uint32_t>(LinkOp::kProof) ||
      !TokensEqual(h.frame.payload(), WorkerProof(options_.token, h.hello_bytes, h.nonce))) {
    Refuse(h, FailedPrecondition("wrong cluster token"));
    return false;
  }
  if (h.hello.build_id != ClusterBuildId()) {
    Refuse(h, FailedPrecondition(
                  "the worker is another build (build id {}, this coordinator's is {}); run the "
                  "same failsafe program on every host",
                  h.hello.build_id, ClusterBuildId()));
    return false;
  }
  // Proven: the link is served by blocking reads and writes from here on.
  ::fcntl(h.fd, F_SETFL, ::fcntl(h.fd, F_GETFL) & ~O_NONBLOCK);
  FS_LOG_INFO("worker {} registered; waiting for a device id", h.peer);
  std::lock_guard<std::mutex> lock(mu_);
  waiting_.push_back({Channel(h.fd), h.peer, h.addr});
  h.fd = -1;
  cv_.notify_all();
  return false;
}

void ClusterListener::Refuse(Handshake& h, const Status& why) {
  FS_LOG_WARN("refused worker {}: {}", h.peer, why.message());
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++refused_;  // counted before the worker hears it
  }
  Channel ch(h.fd);
  h.fd = -1;
  (void)ch.Send(static_cast<uint32_t>(LinkOp::kRefused), why.message());
}

void ClusterListener::Drop(Handshake& h, const std::string& why) {
  ::close(h.fd);
  h.fd = -1;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++dropped_;
  }
  // A flood is logged once a second, not once a connection.
  ++drops_unlogged_;
  const int64_t now = MonotonicNanos();
  if (now - last_drop_log_ns_ < 1000000000) return;
  if (drops_unlogged_ == 1) {
    FS_LOG_WARN("dropped a connection from {}: it {}", h.peer, why);
  } else {
    FS_LOG_WARN("dropped {} connections that proved no cluster token (the last from {}: it {})",
                drops_unlogged_, h.peer, why);
  }
  drops_unlogged_ = 0;
  last_drop_log_ns_ = now;
}

Result<std::unique_ptr<RemoteDevice>> ClusterListener::Take(int device, int64_t timeout_ms) {
  const int64_t give_up = MonotonicNanos() + timeout_ms * 1000000;
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    while (!waiting_.empty()) {
      Waiting w = std::move(waiting_.front());
      waiting_.pop_front();
      ClusterWelcome welcome;
      welcome.device_id = device;
      welcome.epoch = next_epoch_++;
      welcome.heartbeat_ms = options_.heartbeat_ms;
      welcome.link_timeout_ms = options_.link_timeout_ms;
      if (!w.channel.Send(static_cast<uint32_t>(LinkOp::kWelcome), welcome.Encode()).ok()) {
        continue;  // it left
      }
      FS_LOG_INFO("device {}: worker {} (link epoch {})", device, w.peer, welcome.epoch);
      return RemoteDevice::Start(std::move(w.channel), device, welcome, w.peer, w.addr);
    }
    const int64_t left = give_up - MonotonicNanos();
    if (left <= 0) break;
    cv_.wait_for(lock, std::chrono::nanoseconds(left));
  }
  return NotFound(
      "no worker joined at {}:{} to be device {} (start one with `failsafe worker --join "
      "{}:{}`)",
      options_.host, port_, device, options_.host, port_);
}

}  // namespace failsafe
