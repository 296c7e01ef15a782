#include "engine/cluster_listener.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "comm/tcp.h"
#include "common/clock.h"
#include "common/log.h"
#include "worker/cluster_protocol.h"

namespace failsafe {

namespace {

// A connection says hello within this time or is dropped.
constexpr int64_t kHelloTimeoutMs = 5000;

}  // namespace

Result<std::shared_ptr<ClusterListener>> ClusterListener::Start(const ClusterListenerOptions& o) {
  if (o.token.empty()) {
    return InvalidArgument(
        "--listen needs a cluster token (--cluster-token-file FILE or FAILSAFE_CLUSTER_TOKEN)");
  }
  if (o.heartbeat_ms <= 0 || o.link_timeout_ms <= o.heartbeat_ms) {
    return InvalidArgument("the link timeout must exceed the heartbeat interval");
  }
  auto l = std::shared_ptr<ClusterListener>(new ClusterListener());
  l->options_ = o;
  FS_ASSIGN_OR_RETURN(TcpListener tcp, TcpListen(o.host, o.port));
  l->listen_fd_ = tcp.fd;
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

void ClusterListener::Serve() {
  while (true) {
    std::vector<pollfd> fds = {{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) return;
      // Waiting workers hear from the coordinator, and are dropped once
      // their connection closes.
      std::erase_if(waiting_, [](Waiting& w) {
        pollfd p{w.channel.fd(), POLLIN, 0};
        if (::poll(&p, 1, 0) > 0) {
          FS_LOG_WARN("worker {} left before it got a device id", w.peer);
          return true;
        }
        return !w.channel.Send(static_cast<uint32_t>(LinkOp::kIdle), "").ok();
      });
    }
    const int r = ::poll(fds.data(), fds.size(), static_cast<int>(options_.heartbeat_ms));
    if (r < 0 && errno == EINTR) continue;
    if (fds[1].revents) return;
    if (!(fds[0].revents & POLLIN)) continue;
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    const int fd = ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&ss), &len, SOCK_CLOEXEC);
    if (fd < 0) continue;
    char buf[INET6_ADDRSTRLEN] = "?";
    if (ss.ss_family == AF_INET) {
      ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&ss)->sin_addr, buf, sizeof(buf));
    }
    Admit(fd, buf);
  }
}

void ClusterListener::Admit(int fd, const std::string& addr) {
  SetTcpNoDelay(fd);
  Channel ch(fd);
  Message m;
  Status st = ch.Receive(&m, kHelloTimeoutMs);
  if (!st.ok()) {
    FS_LOG_WARN("a connection from {} sent no hello: {}", addr, st.message());
    return;
  }
  Status verdict;
  std::string peer = addr;
  if (m.type != static_cast<uint32_t>(LinkOp::kHello)) {
    verdict = InvalidArgument("the first frame is not a hello");
  } else if (auto hello = ClusterHello::Decode(m.payload); !hello.ok()) {
    verdict = hello.status();
  } else {
    peer = fmt::format("{} ({}, pid {})", hello->host, addr, hello->pid);
    if (hello->build_id != ClusterBuildId()) {
      verdict = FailedPrecondition(
          "the worker is another build (build id {}, this coordinator's is {}); run the same "
          "failsafe program on every host",
          hello->build_id, ClusterBuildId());
    } else if (!TokensEqual(hello->token, options_.token)) {
      verdict = FailedPrecondition("wrong cluster token");
    }
  }
  if (!verdict.ok()) {
    FS_LOG_WARN("refused worker {}: {}", peer, verdict.message());
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++refused_;  // counted before the worker hears it
    }
    (void)ch.Send(static_cast<uint32_t>(LinkOp::kRefused), verdict.message());
    return;
  }
  FS_LOG_INFO("worker {} registered; waiting for a device id", peer);
  std::lock_guard<std::mutex> lock(mu_);
  waiting_.push_back({std::move(ch), peer});
  cv_.notify_all();
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
      return RemoteDevice::Start(std::move(w.channel), device, welcome, w.peer);
    }
    const int64_t left = give_up - MonotonicNanos();
    if (left <= 0) break;
    cv_.wait_for(lock, std::chrono::nanoseconds(left));
  }
  return Unavailable(
      "no worker joined at {}:{} to be device {} (start one with `failsafe worker --join "
      "{}:{}`)",
      options_.host, port_, device, options_.host, port_);
}

}  // namespace failsafe
