#include "common/fd_share.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <random>
#include <system_error>

namespace failsafe {

namespace {

// An abstract socket's address: a NUL, then the name (no file to remove).
socklen_t Address(const std::string& name, sockaddr_un* a) {
  std::memset(a, 0, sizeof(*a));
  a->sun_family = AF_UNIX;
  std::memcpy(a->sun_path + 1, name.data(), name.size());
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
}

// Whether the process at the other end of `sock` is this process's user.
bool SameUser(int sock) {
  ucred c{};
  socklen_t len = sizeof(c);
  return ::getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &c, &len) == 0 && c.uid == ::geteuid();
}

// One byte and room for one descriptor: what the server sends, the client
// receives.
struct FdMessage {
  char byte = 'F';
  iovec iov{};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr m{};
  FdMessage() {
    iov = {&byte, 1};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = control;
    m.msg_controllen = sizeof(control);
  }
  FdMessage(const FdMessage&) = delete;
  FdMessage& operator=(const FdMessage&) = delete;
};

std::string RandomName() {
  std::random_device rd;
  const uint64_t r = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  return fmt::format("failsafe-fd-{}-{:016x}", ::getpid(), r);
}

}  // namespace

Result<std::unique_ptr<FdShare>> FdShare::Serve(int fd) {
  std::unique_ptr<FdShare> s(new FdShare());
  s->owner_ = ::getpid();
  s->fd_ = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (s->fd_ < 0) return Internal("sharing descriptor {}: {}", fd, std::strerror(errno));
  s->listen_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s->listen_ < 0) return Internal("socket: {}", std::strerror(errno));
  for (int attempt = 0;; ++attempt) {
    s->name_ = RandomName();
    sockaddr_un a;
    const socklen_t len = Address(s->name_, &a);
    if (::bind(s->listen_, reinterpret_cast<const sockaddr*>(&a), len) == 0) break;
    if (errno != EADDRINUSE || attempt == 3)
      return Internal("binding {}: {}", s->name_, std::strerror(errno));
  }
  if (::listen(s->listen_, 64) != 0) return Internal("listen: {}", std::strerror(errno));
  if (::pipe2(s->stop_, O_CLOEXEC) != 0) return Internal("pipe: {}", std::strerror(errno));
  FdShare* raw = s.get();
  try {
    s->thread_ = std::make_unique<std::thread>([raw] { raw->Run(); });
  } catch (const std::system_error& e) {
    return Internal("starting the share's thread: {}", e.what());
  }
  return s;
}

FdShare::~FdShare() {
  if (thread_ && ::getpid() != owner_) {
    // A copy in a child forked without exec: the thread is the parent's
    // (not in this process), and so is the stop pipe's other end. Only
    // this process's descriptors are closed.
    (void)thread_.release();
  } else if (thread_) {
    const char c = 0;
    while (::write(stop_[1], &c, 1) < 0 && errno == EINTR) {
    }
    thread_->join();
  }
  for (int fd : {fd_, listen_, stop_[0], stop_[1]}) {
    if (fd >= 0) ::close(fd);
  }
}

void FdShare::Run() {
  pollfd p[2] = {{listen_, POLLIN, 0}, {stop_[0], POLLIN, 0}};
  while (true) {
    if (::poll(p, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (p[1].revents != 0) return;
    if ((p[0].revents & (POLLERR | POLLHUP | POLLNVAL)) != 0) return;  // the socket broke
    if ((p[0].revents & POLLIN) == 0) continue;
    const int c = ::accept4(listen_, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) {
      // Out of descriptors, say: the caller waits, then gives up; this
      // thread does not spin meanwhile.
      if (errno != EINTR && errno != EAGAIN && errno != ECONNABORTED)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    if (SameUser(c)) {
      FdMessage out;
      cmsghdr* h = CMSG_FIRSTHDR(&out.m);
      h->cmsg_level = SOL_SOCKET;
      h->cmsg_type = SCM_RIGHTS;
      h->cmsg_len = CMSG_LEN(sizeof(int));
      std::memcpy(CMSG_DATA(h), &fd_, sizeof(int));
      // Counted first: a peer that has the descriptor finds it counted.
      served_.fetch_add(1);
      if (::sendmsg(c, &out.m, MSG_NOSIGNAL) != 1) served_.fetch_sub(1);
    }
    ::close(c);
  }
}

Result<int> FetchSharedFd(const std::string& name, int timeout_ms) {
  if (name.empty() || name.size() > FdShare::kMaxNameChars)
    return InvalidArgument("not a shared descriptor's name");
  const int s = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0) return Internal("socket: {}", std::strerror(errno));
  // Bounded both ways: a stopped owner's queue of connections fills, and a
  // connect to a full queue waits (up to the send timeout).
  timeout_ms = std::max(timeout_ms, 1);
  timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
  ::setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  ::setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  sockaddr_un a;
  const socklen_t len = Address(name, &a);
  if (::connect(s, reinterpret_cast<const sockaddr*>(&a), len) != 0) {
    const int e = errno;
    ::close(s);
    if (e == EAGAIN || e == EINTR || e == EINPROGRESS)
      return Unavailable("{} accepts no connection (its owner stopped?)", name);
    return Unavailable("no process of this network namespace serves {}: {}", name,
                       std::strerror(e));
  }
  if (!SameUser(s)) {
    ::close(s);
    return Unavailable("{} is served by another user", name);
  }
  FdMessage in;
  ssize_t n;
  do {
    n = ::recvmsg(s, &in.m, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  const int e = errno;
  ::close(s);
  if (n != 1) {
    return Unavailable("{} did not answer{}", name,
                       n < 0 ? fmt::format(": {}", std::strerror(e)) : std::string());
  }
  const cmsghdr* h = CMSG_FIRSTHDR(&in.m);
  if (!h || h->cmsg_level != SOL_SOCKET || h->cmsg_type != SCM_RIGHTS ||
      h->cmsg_len != CMSG_LEN(sizeof(int))) {
    // Whatever descriptors came are closed, not leaked.
    for (; h; h = CMSG_NXTHDR(&in.m, const_cast<cmsghdr*>(h))) {
      if (h->cmsg_level != SOL_SOCKET || h->cmsg_type != SCM_RIGHTS) continue;
      const size_t n = (h->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < n; ++i) {
        int extra = -1;
        std::memcpy(&extra, CMSG_DATA(h) + i * sizeof(int), sizeof(int));
        ::close(extra);
      }
    }
    return Unavailable("{} answered without one descriptor", name);
  }
  int fd = -1;
  std::memcpy(&fd, CMSG_DATA(h), sizeof(int));
  return fd;
}

}  // namespace failsafe
