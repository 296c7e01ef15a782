#include "engine/pinned_process.h"

#include <sys/syscall.h>
#include <unistd.h>

namespace failsafe {

int PidfdOpen(pid_t pid) { return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)); }

PinnedProcess::PinnedProcess(pid_t pid) : fd_(pid > 0 ? PidfdOpen(pid) : -1) {}

PinnedProcess::~PinnedProcess() {
  if (fd_ >= 0) ::close(fd_);
}

bool PinnedProcess::Signal(int sig) const {
  return fd_ >= 0 && ::syscall(SYS_pidfd_send_signal, fd_, sig, nullptr, 0) == 0;
}

}  // namespace failsafe
