// A worker's end of a link to a coordinator on another host, over TCP.
//
// Join connects and runs the handshake (worker/cluster_protocol.h): it says
// hello (protocol version, build id, a nonce), checks that the coordinator
// proves it holds the cluster token, proves the same itself, and waits for a
// device id. A refusal, or a coordinator that cannot prove the token, comes
// back as an error that says why; a connection lost before the device id is
// tried again until the connect timeout.
//
// The link then runs two threads besides the worker's own: a reader that
// takes every frame off the socket (requests are queued for the worker;
// group aborts, KV backup fills and kills are acted on at once, even while
// the worker computes) and a heartbeat that sends the device's progress
// counters. When the coordinator is silent for the link timeout (it died, or
// the network between is cut) the process exits at once with
// kLinkLostExitCode, as a local worker dies with its coordinator; `failsafe
// worker --join` then starts another that joins again (cli/worker_cmd.cc).
//
// Frames of another epoch than the welcome's are dropped.
//
// Thread-safety: Receive from the worker's thread only; Send and the
// upload/register calls from any thread (sends are serialised).
#pragma once

#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "comm/abort_signal.h"
#include "comm/channel.h"
#include "worker/cluster_protocol.h"
#include "worker/device_progress.h"

namespace failsafe {

// The exit code of a worker that lost its coordinator, or could not reach
// it: worth joining again, unlike a refusal (1).
inline constexpr int kLinkLostExitCode = 3;

struct JoinOptions {
  std::string coordinator;  // HOST:PORT
  std::string token;
  int64_t connect_timeout_ms = 30000;  // keeps trying to connect this long
};

class RemoteWorkerLink {
 public:
  // Connects and registers; blocks until the coordinator gives a device id.
  static Result<std::unique_ptr<RemoteWorkerLink>> Join(const JoinOptions& options);
  ~RemoteWorkerLink();
  RemoteWorkerLink(const RemoteWorkerLink&) = delete;
  RemoteWorkerLink& operator=(const RemoteWorkerLink&) = delete;

  const ClusterWelcome& welcome() const { return welcome_; }
  // This host's address on the route to the coordinator (what peers dial).
  const std::string& local_address() const { return local_address_; }

  // The next request (type and payload, as over a local channel); fails
  // once the coordinator is gone.
  Status Receive(Message* m);
  Status SendReply(uint32_t type, const std::string& payload);
  Status Send(LinkOp op, const std::string& body);

  // The device's progress slot, whose counters heartbeats carry.
  void SetProgressSlot(DeviceProgressSlot* slot);
  // A group's abort signal, raised when the coordinator aborts the group
  // (`prefix` names it); raised at once if the abort came first.
  void RegisterGroup(const std::string& prefix, const AbortSignal& signal);
  // Where KV backup fills from the coordinator are written: a mirror of the
  // coordinator's region, `bytes` long.
  void SetBackupMirror(void* base, size_t bytes);

 private:
  RemoteWorkerLink() = default;
  void ReadLoop();
  void HeartbeatLoop();
  void HandleFrame(uint32_t type, const std::string& body);
  [[noreturn]] void Lost(const std::string& why);

  Channel channel_;
  ClusterWelcome welcome_;
  std::string local_address_;
  std::string coordinator_;

  std::mutex send_mu_;  // serialises sends

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Message> requests_;               // guarded by mu_
  bool closed_ = false;                        // guarded by mu_
  bool shutting_down_ = false;                 // guarded by mu_
  DeviceProgressSlot* progress_ = nullptr;     // guarded by mu_
  std::map<std::string, AbortSignal> groups_;  // guarded by mu_
  std::set<std::string> aborted_;              // guarded by mu_
  char* mirror_ = nullptr;                     // guarded by mu_
  size_t mirror_bytes_ = 0;                    // guarded by mu_
  // The coordinator's latest heartbeat (its clock) and when it came (ours):
  // echoed back so that it measures the link's round trip.
  int64_t echo_ns_ = 0, echo_at_ns_ = 0;  // guarded by mu_

  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  bool stop_ = false;  // guarded by stop_mu_
  std::thread reader_, heartbeat_;
};

}  // namespace failsafe
