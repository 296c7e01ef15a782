// A file descriptor that other processes of this host fetch by name: a
// thread of the owner answers each connection to an abstract Unix socket
// with a duplicate of the descriptor (SCM_RIGHTS). What the descriptor
// names then lives while any process holds it or a mapping of it, so
// memory a peer mapped stays when its owner dies (a device killed with -9
// mid-collective: Backend::AllocatePeerMemory's handles carry the name).
//
// Who may fetch: a process of the same user (the server checks the
// caller's credentials, the caller the server's) in the same network
// namespace (abstract socket names are per namespace: a process in another
// one fails to connect, and its group stages through the host instead).
// The credentials are the guard: abstract names are listed in
// /proc/net/unix (the name's random bits only keep two shares apart).
//
// A copy in a child forked without exec leaves the parent's share serving.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "common/status.h"

namespace failsafe {

class FdShare {
 public:
  // At most this many characters in a name.
  static constexpr size_t kMaxNameChars = 40;

  // Serves a duplicate of `fd` (the caller keeps its own) until destroyed.
  static Result<std::unique_ptr<FdShare>> Serve(int fd);
  ~FdShare();
  FdShare(const FdShare&) = delete;
  FdShare& operator=(const FdShare&) = delete;

  const std::string& name() const { return name_; }
  // Descriptors handed out so far.
  int served() const { return served_.load(); }

 private:
  FdShare() = default;
  void Run();

  pid_t owner_ = 0;  // the process that serves
  std::string name_;
  int fd_ = -1;             // the duplicate served
  int listen_ = -1;         // the socket
  int stop_[2] = {-1, -1};  // a pipe: written to stop the thread
  std::atomic<int> served_{0};
  std::unique_ptr<std::thread> thread_;
};

// The descriptor served under `name`, as a new descriptor of this process
// (close-on-exec; the caller closes it). Unavailable where no process of
// this user serves that name here, or none answers within `timeout_ms`.
Result<int> FetchSharedFd(const std::string& name, int timeout_ms = 2000);

}  // namespace failsafe
