// A slow device, made for real: a SIGSTOP/SIGCONT duty cycle on a worker
// process, which runs `speed` of every period and is stopped for the rest, as
// a CPU quota (cgroup cpu.max) would hold it, without a cgroup to set up.
// Used by slow-bench and the slow-device tests.
//
// Thread-safety: one owner; a thread of its own sends the signals.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <thread>

namespace failsafe {

class ProcessThrottle {
 public:
  // Starts throttling `pid` unless speed >= 1 or pid <= 0 (kill(-1) would
  // signal every process).
  ProcessThrottle(pid_t pid, double speed, int64_t period_ms);
  // Stops throttling and leaves the process running.
  ~ProcessThrottle();
  ProcessThrottle(const ProcessThrottle&) = delete;
  ProcessThrottle& operator=(const ProcessThrottle&) = delete;

 private:
  const pid_t pid_;
  std::atomic<bool> done_{false};
  std::thread thread_;
};

}  // namespace failsafe
