#include "cli/signal_wait.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <thread>

namespace failsafe {

namespace {

// The handlers write to a pipe (write is async-signal-safe).
int g_signal_pipe[2] = {-1, -1};

void OnSignal(int sig) { PostSignal(sig); }

}  // namespace

void PostSignal(int value) {
  const int saved = errno;
  const char c = static_cast<char>(value);
  [[maybe_unused]] ssize_t n = ::write(g_signal_pipe[1], &c, 1);
  errno = saved;
}

Status InstallSignalPipe() {
  if (::pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0)
    return Internal("pipe: {}", std::strerror(errno));
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGINT, &sa, nullptr);
  return Status::Ok();
}

int WaitForSignal() {
  while (true) {
    pollfd p{g_signal_pipe[0], POLLIN, 0};
    if (::poll(&p, 1, -1) < 0 && errno != EINTR) return SIGTERM;
    char c = 0;
    if (::read(g_signal_pipe[0], &c, 1) == 1) return c;
  }
}

int DrainOnSignal(double drain_timeout_s, const std::function<int(int64_t)>& drain,
                  const std::function<void()>& stop) {
  const int sig = WaitForSignal();
  std::printf("%s: draining (up to %g s for requests in flight)\n", strsignal(sig),
              drain_timeout_s);
  std::fflush(stdout);
  int cut = 0;
  std::thread t([&] {
    cut = drain(static_cast<int64_t>(drain_timeout_s * 1000));
    PostSignal(kDrained);
  });
  while (WaitForSignal() != kDrained) {
    std::printf("second signal: stopping now\n");
    std::fflush(stdout);
    stop();
  }
  t.join();
  return cut;
}

}  // namespace failsafe
