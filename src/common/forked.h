// Tests with real processes: body(rank) in `n` forked children.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <functional>
#include <vector>

namespace failsafe {

// Runs body(rank) in `n` child processes, each exiting with its result,
// and `parent` meanwhile; returns the children's exit codes (128 + the
// signal for one killed). As in a worker, a child's write to a dead peer's
// socket is an error, not a signal.
inline std::vector<int> RunForked(int n, const std::function<int(int)>& body,
                                  const std::function<void()>& parent = {}) {
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      std::signal(SIGPIPE, SIG_IGN);
      ::_exit(body(r));
    }
    pids.push_back(pid);
  }
  if (parent) parent();
  std::vector<int> codes;
  for (pid_t p : pids) {
    int status = 0;
    ::waitpid(p, &status, 0);
    codes.push_back(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
  }
  return codes;
}

}  // namespace failsafe
