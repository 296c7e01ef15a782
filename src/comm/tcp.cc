#include "comm/tcp.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/clock.h"

namespace failsafe {

namespace {

Result<sockaddr_in> ResolveIpv4(const std::string& host, int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::inet_pton(AF_INET, host.c_str(), &addr.sin_addr) == 1) return addr;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0 || !res) {
    return InvalidArgument("cannot resolve host '{}'", host);
  }
  addr.sin_addr = reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr;
  ::freeaddrinfo(res);
  return addr;
}

std::string AddressText(const sockaddr_storage& ss) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (ss.ss_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&ss)->sin_addr, buf, sizeof(buf));
    return buf;
  }
  if (ss.ss_family != AF_INET6) return "";
  const in6_addr& a = reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_addr;
  if (IN6_IS_ADDR_V4MAPPED(&a)) {
    ::inet_ntop(AF_INET, a.s6_addr + 12, buf, sizeof(buf));
  } else {
    ::inet_ntop(AF_INET6, &a, buf, sizeof(buf));
  }
  return buf;
}

Result<int> ConnectOnce(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  if (int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &res); rc != 0) {
    return InvalidArgument("cannot resolve {}: {}", host, ::gai_strerror(rc));
  }
  std::string last = "no address";
  for (addrinfo* a = res; a; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
      ::freeaddrinfo(res);
      SetTcpNoDelay(fd);
      return fd;
    }
    last = std::strerror(errno);
    ::close(fd);
  }
  ::freeaddrinfo(res);
  return Unavailable("cannot connect to {}:{}: {}", host, port, last);
}

}  // namespace

Result<TcpListener> TcpListen(const std::string& host, int port) {
  FS_ASSIGN_OR_RETURN(sockaddr_in addr, ResolveIpv4(host, port));
  TcpListener l;
  l.fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (l.fd < 0) return Internal("socket: {}", std::strerror(errno));
  const int one = 1;
  ::setsockopt(l.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(l.fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::listen(l.fd, 64) != 0) {
    const int err = errno;
    ::close(l.fd);
    return Unavailable("cannot listen on {}:{}: {}", host, port, std::strerror(err));
  }
  socklen_t len = sizeof(addr);
  ::getsockname(l.fd, reinterpret_cast<sockaddr*>(&addr), &len);
  l.port = ntohs(addr.sin_port);
  return l;
}

Result<int> TcpConnect(const std::string& host, int port, int64_t timeout_ms, int64_t retry_ms) {
  const int64_t give_up = MonotonicNanos() + timeout_ms * 1000000;
  while (true) {
    Result<int> fd = ConnectOnce(host, port);
    if (fd.ok() || fd.status().code() != StatusCode::kUnavailable || MonotonicNanos() > give_up) {
      return fd;
    }
    ::usleep(static_cast<useconds_t>(retry_ms * 1000));
  }
}

void SetTcpNoDelay(int fd) {
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

std::string LocalAddress(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "127.0.0.1";
  std::string text = AddressText(ss);
  return text.empty() ? "127.0.0.1" : text;
}

std::string PeerAddress(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "";
  return AddressText(ss);
}

}  // namespace failsafe
