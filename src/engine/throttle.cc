#include "engine/throttle.h"

#include <signal.h>
#include <time.h>

namespace failsafe {

namespace {

void SleepNs(int64_t ns) {
  timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
  while (::nanosleep(&ts, &ts) != 0) {
  }
}

}  // namespace

ProcessThrottle::ProcessThrottle(pid_t pid, double speed, int64_t period_ms) : pid_(pid) {
  if (pid_ <= 0 || speed >= 1) return;
  const int64_t run_ns = static_cast<int64_t>(period_ms * 1e6 * speed);
  const int64_t stop_ns = period_ms * 1000000 - run_ns;
  thread_ = std::thread([this, run_ns, stop_ns] {
    while (!done_) {
      ::kill(pid_, SIGSTOP);
      SleepNs(stop_ns);
      ::kill(pid_, SIGCONT);
      SleepNs(run_ns);
    }
  });
}

ProcessThrottle::~ProcessThrottle() {
  done_ = true;
  if (thread_.joinable()) thread_.join();
  if (pid_ > 0) ::kill(pid_, SIGCONT);
}

}  // namespace failsafe
