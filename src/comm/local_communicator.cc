#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>

#include "comm/communicator.h"
#include "common/clock.h"

namespace failsafe {

Communicator::Communicator()
    : serial_([] {
        static std::atomic<uint64_t> next{1};
        return next.fetch_add(1, std::memory_order_relaxed);
      }()) {}

Status Communicator::PollUntil(const std::function<Result<bool>()>& done, int64_t timeout_ms,
                               const std::function<bool()>& aborted,
                               const std::function<void()>& abort) {
  const int64_t start = MonotonicNanos();
  const int64_t deadline = start + timeout_ms * 1000000;
  for (;;) {
    FS_ASSIGN_OR_RETURN(const bool finished, done());
    if (finished) return Status::Ok();
    if (aborted()) return Aborted("collective group was aborted");
    const int64_t now = MonotonicNanos();
    if (now > deadline) {
      abort();
      return DeadlineExceeded("collective did not complete within {} ms", timeout_ms);
    }
    const int64_t waited = now - start;
    if (waited < kPollYieldNs) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(
          std::chrono::nanoseconds(std::clamp<int64_t>(waited / 16, kPollNapMinNs, kPollNapMaxNs)));
    }
  }
}

// Alone, nothing but `done` can end the wait: it is the only member.
Status LocalCommunicator::Await(const std::function<Result<bool>()>& done) {
  return PollUntil(
      done, INT64_MAX / 2000000, [] { return false; }, [] {});
}

Status LocalCommunicator::AllGather(const void* send, size_t bytes, void* recv) {
  if (recv != send) std::memmove(recv, send, bytes);
  return Status::Ok();
}

}  // namespace failsafe
