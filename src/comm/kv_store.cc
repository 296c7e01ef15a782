#include "comm/kv_store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/clock.h"
#include "common/log.h"
#include "common/wire.h"

namespace failsafe {

namespace {
enum : uint32_t { kSet = 1, kGet = 2, kValue = 3 };

Result<sockaddr_in> Resolve(const std::string& host, int port) {
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
}  // namespace

KvStoreServer::~KvStoreServer() {
  if (wake_fd_[1] >= 0) {
    char c = 1;
    ssize_t unused = ::write(wake_fd_[1], &c, 1);
    (void)unused;
  }
  if (thread_.joinable()) thread_.join();
  for (int fd : {listen_fd_, wake_fd_[0], wake_fd_[1]}) {
    if (fd >= 0) ::close(fd);
  }
}

Result<std::unique_ptr<KvStoreServer>> KvStoreServer::Start(const std::string& host, int port) {
  auto s = std::unique_ptr<KvStoreServer>(new KvStoreServer());
  FS_ASSIGN_OR_RETURN(sockaddr_in addr, Resolve(host, port));
  s->listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s->listen_fd_ < 0) return Internal("socket: {}", std::strerror(errno));
  int one = 1;
  ::setsockopt(s->listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(s->listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::listen(s->listen_fd_, 64) != 0) {
    return Unavailable("cannot listen on {}:{}: {}", host, port, std::strerror(errno));
  }
  socklen_t len = sizeof(addr);
  ::getsockname(s->listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  s->port_ = ntohs(addr.sin_port);
  s->host_ = host;
  if (::pipe2(s->wake_fd_, O_CLOEXEC) != 0) return Internal("pipe: {}", std::strerror(errno));
  s->thread_ = std::thread([p = s.get()] { p->Serve(); });
  return s;
}

void KvStoreServer::Serve() {
  std::map<std::string, std::string> data;
  std::map<std::string, std::vector<int>> waiting;  // key -> client fds waiting for it
  std::vector<std::unique_ptr<Channel>> clients;
  while (true) {
    std::vector<pollfd> fds = {{wake_fd_[0], POLLIN, 0}, {listen_fd_, POLLIN, 0}};
    for (auto& c : clients) fds.push_back({c->fd(), POLLIN, 0});
    if (::poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      FS_LOG_ERROR("kv store: poll failed: {}", std::strerror(errno));
      return;
    }
    if (fds[0].revents) return;
    if (fds[1].revents & POLLIN) {
      int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd >= 0) {
        int one = 1;
        ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        clients.push_back(std::make_unique<Channel>(fd));
      }
    }
    for (size_t i = 2; i < fds.size(); ++i) {
      if (!fds[i].revents) continue;
      Channel* c = clients[i - 2].get();
      Message m;
      if (!c->Receive(&m, 1000).ok()) {
        for (auto& [key, fdlist] : waiting) std::erase(fdlist, c->fd());
        c->Close();
        continue;
      }
      WireReader r(m.payload);
      std::string key = r.GetString();
      if (m.type == kSet) {
        std::string value = r.GetString();
        data[key] = value;
        auto w = waiting.find(key);
        if (w != waiting.end()) {
          for (int fd : w->second) {
            for (auto& cl : clients) {
              if (cl->fd() == fd) (void)cl->Send(kValue, value);
            }
          }
          waiting.erase(w);
        }
        (void)c->Send(kValue, "");
      } else if (m.type == kGet) {
        auto it = data.find(key);
        if (it != data.end()) {
          (void)c->Send(kValue, it->second);
        } else {
          waiting[key].push_back(c->fd());
        }
      }
    }
    std::erase_if(clients, [](const std::unique_ptr<Channel>& c) { return !c->valid(); });
  }
}

Result<std::unique_ptr<KvStoreClient>> KvStoreClient::Connect(const std::string& host, int port,
                                                              int64_t timeout_ms) {
  FS_ASSIGN_OR_RETURN(sockaddr_in addr, Resolve(host, port));
  const int64_t deadline = MonotonicNanos() + timeout_ms * 1000000;
  while (true) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return Internal("socket: {}", std::strerror(errno));
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      auto c = std::make_unique<KvStoreClient>();
      c->channel_ = Channel(fd);
      return c;
    }
    ::close(fd);
    if (MonotonicNanos() > deadline)
      return Unavailable("cannot reach the store at {}:{}", host, port);
    ::usleep(20000);
  }
}

Status KvStoreClient::Set(const std::string& key, const std::string& value) {
  std::lock_guard<std::mutex> lock(mu_);
  WireWriter w;
  w.PutString(key);
  w.PutString(value);
  FS_RETURN_IF_ERROR(channel_.Send(kSet, w.data()));
  Message m;
  return channel_.Receive(&m, 60000);
}

Result<std::string> KvStoreClient::Get(const std::string& key, int64_t timeout_ms) {
  std::lock_guard<std::mutex> lock(mu_);
  WireWriter w;
  w.PutString(key);
  FS_RETURN_IF_ERROR(channel_.Send(kGet, w.data()));
  Message m;
  Status st = channel_.Receive(&m, timeout_ms);
  if (!st.ok()) return st.WithContext("store key '" + key + "'");
  return m.payload;
}

}  // namespace failsafe
