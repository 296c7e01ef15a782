// A process pinned by a pidfd: signals sent through it reach that process or
// none, never another that reused its pid once it exited. Used to watch
// device processes (device_process.h) and to stop, continue and kill worker
// processes on purpose (soak, stall-bench).
//
// Thread-safety: Signal may be called from any thread.
#pragma once

#include <sys/types.h>

namespace failsafe {

// A pidfd for `pid` (readable once the process exited; owned by the caller),
// or -1 with errno set.
int PidfdOpen(pid_t pid);

class PinnedProcess {
 public:
  // Pins `pid` if it is running; pid <= 0 pins nothing (kill(0) and kill(-1)
  // would reach process groups, the whole machine).
  explicit PinnedProcess(pid_t pid);
  ~PinnedProcess();
  PinnedProcess(const PinnedProcess&) = delete;
  PinnedProcess& operator=(const PinnedProcess&) = delete;

  // False if nothing is pinned (pid <= 0, or the process was gone).
  bool ok() const { return fd_ >= 0; }
  // Sends `sig`; false if nothing is pinned or the process is gone.
  bool Signal(int sig) const;

 private:
  const int fd_;  // owned; -1: none
};

}  // namespace failsafe
