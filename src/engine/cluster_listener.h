// Where workers on other hosts join a coordinator (`--listen HOST:PORT`).
//
// A thread accepts connections and runs their handshakes (see
// worker/cluster_protocol.h) side by side, without blocking on any one: a
// peer that has not yet proven the cluster token may send at most
// kMaxHandshakeFrame bytes per frame, must finish within the handshake
// deadline, and holds one of a bounded number of pending places (a few per
// peer address; when they are full the oldest pending handshake makes room),
// so neither a flood of idle connections nor frames claiming gigabytes can
// make the coordinator allocate more than a few KiB per place or keep a real
// worker out. Another protocol version, a wrong proof or another build gets a
// refusal saying why, which both sides log. A worker that passes waits, kept
// alive by idle frames, until the coordinator needs a device: Take gives the
// longest-waiting one a device id and a new fencing epoch (never reused), and
// returns the device's proxy. A waiting worker whose connection closes is
// forgotten.
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
#include <vector>

#include "comm/channel.h"
#include "engine/remote_device.h"

namespace failsafe {

struct ClusterListenerOptions {
  std::string host;  // the address to listen on, which peers reach this host at
  int port = 0;      // 0: any free port
  std::string token;
  int64_t heartbeat_ms = 200;
  int64_t link_timeout_ms = 2000;       // a link silent this long is lost
  int64_t handshake_timeout_ms = 5000;  // from accept to a proven token
  int max_pending = 64;                 // handshakes in progress, in all
  int max_pending_per_peer = 8;         // ... and from one address
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
  // `timeout_ms` for one to register; kNotFound if none did.
  Result<std::unique_ptr<RemoteDevice>> Take(int device, int64_t timeout_ms);
  // Refusals so far (for tests and logs).
  int refused() const;
  // Connections closed before they proved the token: silent past the
  // deadline, a frame out of bounds, or pushed out by newer ones.
  int dropped() const;

 private:
  struct Waiting {
    Channel channel;
    std::string peer;
    std::string addr;  // its address: devices on one host share a link
  };
  struct Handshake;  // one connection not yet proven
  ClusterListener() = default;
  void Serve();
  void Accept(int64_t now);
  // Reads what the peer sent; false once the connection is finished with
  // (registered, refused or dropped).
  bool Progress(Handshake& h);
  bool OnHello(Handshake& h);
  bool OnProof(Handshake& h);
  void Refuse(Handshake& h, const Status& why);
  void Drop(Handshake& h, const std::string& why);

  ClusterListenerOptions options_;
  int port_ = 0;
  int listen_fd_ = -1;
  int wake_fd_ = -1;  // an eventfd that stops the thread
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Waiting> waiting_;                         // guarded by mu_
  uint32_t next_epoch_ = 1;                             // guarded by mu_
  int refused_ = 0;                                     // guarded by mu_
  int dropped_ = 0;                                     // guarded by mu_
  bool stop_ = false;                                   // guarded by mu_
  std::vector<std::unique_ptr<Handshake>> handshakes_;  // the thread's own
  int64_t last_drop_log_ns_ = 0;                        // the thread's own
  int drops_unlogged_ = 0;                              // the thread's own
  std::thread thread_;
};

}  // namespace failsafe
