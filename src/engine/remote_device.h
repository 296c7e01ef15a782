// The coordinator's end of a link to a device on another host: a proxy that
// makes the remote worker look like a local one to DeviceProcess.
//
// The coordinator talks to a local Unix socket exactly as to a child
// process (requests with their shared-memory descriptors, replies); the
// proxy thread carries that over TCP. Where a local device would share
// memory, the proxy stands in: it keeps the logits, progress and KV backup
// regions the coordinator sent at kInit and writes into them what the worker
// sends (its logits columns, its progress counters, its backup bytes); it
// sends down the backup blocks a restore needs before a plan change; a
// watcher thread forwards the group's abort signal. Heartbeats go both ways;
// a link silent for the link timeout, or closed, is lost: lost_fd() becomes
// readable, which the coordinator takes as the device's death (the pidfd of
// a local device).
//
// Every frame carries the link's epoch; frames of another epoch are dropped.
//
// Thread-safety: the public methods may be called from the thread that
// drives the WorkerGroup; the proxy and watcher threads are internal.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "comm/abort_signal.h"
#include "comm/channel.h"
#include "comm/shm_region.h"
#include "comm/tcp_loss.h"
#include "worker/cluster_protocol.h"
#include "worker/device_progress.h"
#include "worker/kv_backup_layout.h"

namespace failsafe {

class RemoteDevice {
 public:
  // Takes over a registered, welcomed TCP connection of device `device`.
  // `peer` names the worker in logs.
  // `addr`: the worker's address (its host: devices there share a link).
  static Result<std::unique_ptr<RemoteDevice>> Start(Channel tcp, int device,
                                                     const ClusterWelcome& welcome,
                                                     std::string peer, std::string addr = "");
  // Stops the threads and closes the connection (the worker then exits).
  ~RemoteDevice();
  RemoteDevice(const RemoteDevice&) = delete;
  RemoteDevice& operator=(const RemoteDevice&) = delete;

  // The coordinator's end of the local socket (once).
  Channel TakeLocalEnd() { return std::move(local_coordinator_end_); }
  // Readable once the link is lost (an eventfd; owned here).
  int lost_fd() const { return lost_fd_; }
  bool lost() const { return lost_.load(); }
  // Closes the link now: nothing from the worker is heard again.
  void Close();
  // Asks the worker to SIGKILL itself (fault injection).
  Status KillWorker();
  const std::string& peer() const { return peer_; }
  // Bytes carried over the link so far, each way.
  int64_t bytes_sent() const { return bytes_sent_.load(); }
  int64_t bytes_received() const { return bytes_received_.load(); }

 private:
  RemoteDevice() = default;
  void Run();
  void WatchAborts();
  void Lose(const std::string& why);
  Status SendFrame(LinkOp op, const std::string& body);
  // A request from the coordinator: translated and sent on.
  Status Forward(Message& m);
  // A frame from the worker.
  Status Receive(uint32_t type, const std::string& body);
  void WriteLogits(const std::string& body);
  void WriteBackup(const std::string& body);
  Status SendRestoreBlocks(const std::string& apply_plan_payload);

  int device_ = -1;
  ClusterWelcome welcome_;
  std::string peer_;
  std::string addr_;
  Channel tcp_;
  Channel local_;                  // the proxy's end
  Channel local_coordinator_end_;  // until taken
  int lost_fd_ = -1;
  int wake_fd_ = -1;  // an eventfd that stops the proxy thread
  std::atomic<bool> lost_{false};
  std::atomic<int64_t> bytes_sent_{0}, bytes_received_{0};
  std::mutex send_mu_;  // serialises sends on tcp_

  // Proxy thread only:
  ShmRegion logits_;
  DeviceProgressRegion progress_;
  ShmRegion backup_;
  BackupLayout backup_layout_;
  uint32_t request_seq_ = 0;  // of the latest request forwarded
  DeviceProgress last_heard_progress_;
  int64_t last_echo_ns_ = 0;  // the heartbeat of ours the worker last echoed
  // The link's round trips and heartbeat lateness of the last 2 s (when, how
  // long), whose worst is the progress slot's link_rtt_ns.
  std::deque<std::pair<int64_t, int64_t>> link_delays_;
  // Notes a delay and publishes the worst of the window as the progress
  // slot's link_rtt_ns.
  void NoteLinkDelay(int64_t now_ns, int64_t delay_ns);
  // Every heartbeat: a retransmission timeout running on the link's socket
  // counts as a delay of the timeout, and a link that loses frames as loss
  // between the device's host and the coordinator's (the hang watch's
  // LossyHost).
  void CheckRetransmits(int64_t now_ns);
  std::unique_ptr<TcpLossSampler> link_loss_;

  // The current group's abort signal, which the watcher forwards.
  std::mutex group_mu_;
  std::condition_variable group_cv_;
  std::shared_ptr<AbortSignal> group_;  // guarded by group_mu_
  std::string group_prefix_;            // guarded by group_mu_
  bool stop_ = false;                   // Close() was called; guarded by group_mu_

  std::thread proxy_, watcher_;
};

}  // namespace failsafe
