// Where workers on other hosts join a coordinator (`--listen HOST:PORT`).
//
// A thread accepts connections and reads each one's hello: another protocol
// version, another build or a wrong cluster token (compared in constant
// time) gets a refusal saying why, which both sides log. A worker that
// passes waits, kept alive by idle frames, until the coordinator needs a
// device: Take gives the longest-waiting one a device id and a new fencing
// epoch (never reused), and returns the device's proxy. A waiting worker
// whose connection closes is forgotten.
//
// Thread-safety: every public method may be called from any thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "comm/channel.h"
#include "engine/remote_device.h"

namespace failsafe {

struct ClusterListenerOptions {
  std::string host;  // the address to listen on, which peers reach this host at
  int port = 0;      // 0: any free port
  std::string token;
  int64_t heartbeat_ms = 200;
  int64_t link_timeout_ms = 2000;  // a link silent this long is lost
};

class ClusterListener {
 public:
  static Result<std::shared_ptr<ClusterListener>> Start(const ClusterListenerOptions& options);
  ~ClusterListener();
  ClusterListener(const ClusterListener&) = delete;
  ClusterListener& operator=(const ClusterListener&) = delete;

  const std::string& host() const { return options_.host; }
  int port() const { return port_; }
  // Workers registered and waiting for a device id.
  int waiting() const;
  // Welcomes the longest-waiting worker as device `device`, waiting up to
  // `timeout_ms` for one to register; kUnavailable if none did.
  Result<std::unique_ptr<RemoteDevice>> Take(int device, int64_t timeout_ms);
  // Refusals so far (for tests and logs).
  int refused() const;

 private:
  struct Waiting {
    Channel channel;
    std::string peer;
  };
  ClusterListener() = default;
  void Serve();
  void Admit(int fd, const std::string& addr);

  ClusterListenerOptions options_;
  int port_ = 0;
  int listen_fd_ = -1;
  int wake_fd_ = -1;  // an eventfd that stops the thread
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Waiting> waiting_;  // guarded by mu_
  uint32_t next_epoch_ = 1;      // guarded by mu_
  int refused_ = 0;              // guarded by mu_
  bool stop_ = false;            // guarded by mu_
  std::thread thread_;
};

}  // namespace failsafe
