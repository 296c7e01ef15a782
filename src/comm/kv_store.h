// A small TCP key-value store for rendezvous of multi-host collective groups
// (gloo): the coordinator serves it; workers set their addresses and wait for
// their peers'. Gets block until the key is set or the timeout passes.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/channel.h"
#include "common/status.h"

namespace failsafe {

class KvStoreServer {
 public:
  ~KvStoreServer();
  // Binds host:port (port 0: any free port) and starts serving on a thread.
  static Result<std::unique_ptr<KvStoreServer>> Start(const std::string& host, int port);
  int port() const { return port_; }
  const std::string& host() const { return host_; }

 private:
  KvStoreServer() = default;
  void Serve();

  std::string host_;
  int port_ = 0;
  int listen_fd_ = -1;
  int wake_fd_[2] = {-1, -1};  // a pipe that stops the server thread
  std::thread thread_;
};

class KvStoreClient {
 public:
  static Result<std::unique_ptr<KvStoreClient>> Connect(const std::string& host, int port,
                                                        int64_t timeout_ms);
  Status Set(const std::string& key, const std::string& value);
  // Waits up to `timeout_ms` for the key to be set; `cancelled` (optional),
  // looked at every 50 ms while waiting, ends the wait early with kAborted.
  Result<std::string> Get(const std::string& key, int64_t timeout_ms,
                          const std::function<bool()>& cancelled = nullptr);

 private:
  std::mutex mu_;
  Channel channel_;  // guarded by mu_
};

}  // namespace failsafe
