#include "engine/device_process.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <csignal>
#include <cstring>
#include <string_view>

#include "common/clock.h"
#include "common/log.h"
#include "engine/pinned_process.h"

extern "C" char** environ;

namespace failsafe {

Result<std::unique_ptr<DeviceProcess>> DeviceProcess::Spawn(const std::string& binary,
                                                            const std::string& log_level,
                                                            const std::vector<std::string>& env) {
  FS_ASSIGN_OR_RETURN(auto pair, Channel::Pair());
  std::vector<std::string> args = {binary, "worker", "--fd", "3", "--log-level", log_level};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  // The environment, built before fork (the child may only make
  // async-signal-safe calls): ours, each variable in `env` replacing ours.
  std::vector<char*> envp;
  auto name = [](std::string_view v) { return v.substr(0, v.find('=')); };
  for (char** e = environ; *e != nullptr; ++e) {
    const bool replaced = std::any_of(env.begin(), env.end(),
                                      [&](const std::string& a) { return name(a) == name(*e); });
    if (!replaced) envp.push_back(*e);
  }
  for (const std::string& a : env) envp.push_back(const_cast<char*>(a.c_str()));
  envp.push_back(nullptr);
  const int child_fd = pair.second.fd();
  const pid_t pid = ::fork();
  if (pid < 0) return Internal("fork: {}", std::strerror(errno));
  if (pid == 0) {
    // Only async-signal-safe calls until exec.
    if (child_fd == 3) {
      ::fcntl(3, F_SETFD, 0);
    } else {
      ::dup2(child_fd, 3);
    }
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
  pair.second.Close();
  auto p = std::unique_ptr<DeviceProcess>(new DeviceProcess());
  p->pid_ = pid;
  p->pidfd_ = PidfdOpen(pid);
  p->channel_ = std::move(pair.first);
  if (p->pidfd_ < 0) return Internal("pidfd_open: {}", std::strerror(errno));
  return p;
}

std::unique_ptr<DeviceProcess> DeviceProcess::Attach(std::unique_ptr<RemoteDevice> remote) {
  auto p = std::unique_ptr<DeviceProcess>(new DeviceProcess());
  p->channel_ = remote->TakeLocalEnd();
  p->pidfd_ = ::dup(remote->lost_fd());
  p->remote_ = std::move(remote);
  return p;
}

Status DeviceProcess::KillRemote() {
  if (!remote_) return FailedPrecondition("not a device on another host");
  return remote_->KillWorker();
}

DeviceProcess::~DeviceProcess() {
  remote_.reset();  // closes the link
  if (!reaped_ && pid_ > 0) {
    ::kill(pid_, SIGKILL);
    // A killed process exits at once unless it sleeps in the kernel; do not
    // wait long for one that does (init reaps it when we exit).
    WaitExit(1000);
  }
  if (pidfd_ >= 0) ::close(pidfd_);
}

bool DeviceProcess::Exited() const {
  pollfd p{pidfd_, POLLIN, 0};
  return reaped_ || ::poll(&p, 1, 0) > 0;
}

Status DeviceProcess::Send(WorkerOp op, const std::string& payload, const std::vector<int>& fds) {
  request_seq_ = (request_seq_ + 1) & 0xffffff;
  return channel_.Send(static_cast<uint32_t>(op) | (request_seq_ << 8), payload, fds);
}

Status DeviceProcess::ReadReply(int64_t timeout_ms, Status* reply, std::string* body, bool* stale) {
  Message m;
  FS_RETURN_IF_ERROR(channel_.Receive(&m, timeout_ms));
  for (int fd : m.fds) ::close(fd);
  *stale = (m.type >> 8) != request_seq_;
  if (*stale) return Status::Ok();
  *reply = DecodeReply(m.payload, body);
  return Status::Ok();
}

void DeviceProcess::Kill() {
  if (killed_ns_ == 0) killed_ns_ = MonotonicNanos();
  if (pid_ > 0 && !reaped_) ::kill(pid_, SIGKILL);
  if (remote_) remote_->Close();
  channel_.Close();
  Reap();
}

bool DeviceProcess::Reap() {
  if (reaped_ || pid_ <= 0) return true;
  if (::waitpid(pid_, nullptr, WNOHANG) == pid_) reaped_ = true;
  return reaped_;
}

bool DeviceProcess::WaitExit(int64_t timeout_ms) {
  const int64_t deadline = MonotonicNanos() + timeout_ms * 1000000;
  while (!Reap()) {
    const int64_t left_ms = (deadline - MonotonicNanos()) / 1000000;
    if (left_ms <= 0) return false;
    pollfd p{pidfd_, POLLIN, 0};
    // A signal (the server's SIGTERM handler) ends a poll early: wait on.
    if (::poll(&p, 1, static_cast<int>(std::min<int64_t>(left_ms, INT_MAX))) > 0) return Reap();
  }
  return true;
}

}  // namespace failsafe
