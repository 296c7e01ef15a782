// One device's worker process and the line to it.
//
// The process is the failsafe program started as `worker` with its end of a
// control channel on fd 3; it dies with the coordinator (PDEATHSIG). The
// coordinator watches it through a pidfd, and kills it for real. Killing
// never blocks: the process is reaped once it has exited.
//
// Requests carry a sequence number in the frame type (op in the low 8 bits)
// and every reply echoes it, so a late reply to an abandoned request is
// recognised and dropped, never taken for the answer to a newer one.
//
// A device on another host (engine/remote_device.h) is driven the same way:
// its channel is a local socket to the link's proxy, its "pidfd" the link's
// lost signal; killing it closes the link (the worker then exits on its own).
//
// Thread-safety: one thread drives a DeviceProcess.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "comm/channel.h"
#include "common/status.h"
#include "engine/remote_device.h"
#include "worker/protocol.h"

namespace failsafe {

class DeviceProcess {
 public:
  // Starts `binary worker --fd 3 --log-level LEVEL`, in this process's
  // environment with `env` ("NAME=value") added or replacing.
  static Result<std::unique_ptr<DeviceProcess>> Spawn(const std::string& binary,
                                                      const std::string& log_level,
                                                      const std::vector<std::string>& env = {});
  // A device on another host, behind its link.
  static std::unique_ptr<DeviceProcess> Attach(std::unique_ptr<RemoteDevice> remote);
  // Kills the process if it still runs, and reaps it if it has exited.
  ~DeviceProcess();
  DeviceProcess(const DeviceProcess&) = delete;
  DeviceProcess& operator=(const DeviceProcess&) = delete;

  pid_t pid() const { return pid_; }  // -1 for a device on another host
  bool remote() const { return remote_ != nullptr; }
  // A device on another host: asks its worker to SIGKILL itself.
  Status KillRemote();
  int pidfd() const { return pidfd_; }              // readable once the process exited
  int channel_fd() const { return channel_.fd(); }  // readable when a reply (or EOF) is there
  bool Exited() const;

  // Sends a request; fails with kUnavailable if the channel is closed.
  Status Send(WorkerOp op, const std::string& payload, const std::vector<int>& fds = {});
  // Reads one reply (the channel is readable). Sets *stale for a reply to an
  // earlier request (to be ignored); fails if the channel broke.
  Status ReadReply(int64_t timeout_ms, Status* reply, std::string* body, bool* stale);

  // SIGKILL now and close the channel: nothing from this process is heard
  // again. Reaps it if it already exited.
  void Kill();
  int64_t killed_ns() const { return killed_ns_; }  // the first Kill's (MonotonicNanos), or 0
  // Reaps the process if it has exited; true once it has.
  bool Reap();
  // Waits up to timeout_ms for the process to exit, and reaps it; true once
  // it has. What a killed process holds (a GPU's memory too) is freed only
  // as it exits.
  bool WaitExit(int64_t timeout_ms);

 private:
  DeviceProcess() = default;
  pid_t pid_ = -1;
  int pidfd_ = -1;
  bool reaped_ = false;
  int64_t killed_ns_ = 0;
  Channel channel_;
  uint32_t request_seq_ = 0;              // of the last request sent
  std::unique_ptr<RemoteDevice> remote_;  // a device on another host
};

}  // namespace failsafe
