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

#include "comm/tcp.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/wire.h"

namespace failsafe {

namespace {
enum : uint32_t { kSet = 1, kGet = 2, kValue = 3 };

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
  FS_ASSIGN_OR_RETURN(TcpListener l, TcpListen(host, port));
  s->listen_fd_ = l.fd;
  s->port_ = l.port;
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
        SetTcpNoDelay(fd);
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
  FS_ASSIGN_OR_RETURN(int fd, TcpConnect(host, port, timeout_ms));
  auto c = std::make_unique<KvStoreClient>();
  c->channel_ = Channel(fd);
  return c;
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

Result<std::string> KvStoreClient::Get(const std::string& key, int64_t timeout_ms,
                                       const std::function<bool()>& cancelled) {
  std::lock_guard<std::mutex> lock(mu_);
  WireWriter w;
  w.PutString(key);
  FS_RETURN_IF_ERROR(channel_.Send(kGet, w.data()));
  const int64_t until = MonotonicNanos() + timeout_ms * 1000000;
  if (cancelled) {
    // Until the answer starts to arrive (a frame is then read whole).
    for (;;) {
      const int64_t left_ms = (until - MonotonicNanos()) / 1000000;
      if (left_ms <= 0) break;
      pollfd p{channel_.fd(), POLLIN, 0};
      const int r = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left_ms, 50)));
      if (r > 0) break;
      if (r < 0 && errno != EINTR) break;
      if (cancelled()) return Aborted("store key '{}': the wait was cancelled", key);
    }
  }
  Message m;
  Status st = channel_.Receive(&m, std::max<int64_t>(0, (until - MonotonicNanos()) / 1000000));
  if (!st.ok()) return st.WithContext("store key '" + key + "'");
  return m.payload;
}

}  // namespace failsafe
