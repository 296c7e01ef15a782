// Time sources. The engine (engine/engine.h) reads every instant through the
// Clock of its options, so that the simulator drives it on a virtual clock
// (sim/sim_executor.h) and tests on a fake one; the server's request
// latencies use the engine's clock. Code that measures real processes,
// sockets and compute (the worker group, remote devices, hang detection,
// CPU kernels) reads MonotonicNanos directly: it only ever runs for real.
// Pure modules (core, placement) take no clock (callers pass times in).
#pragma once

#include <time.h>

#include <atomic>
#include <cstdint>

namespace failsafe {

inline int64_t MonotonicNanos() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

// CPU time consumed by the calling thread: compute time that does not count
// time spent waiting for a core on an oversubscribed machine.
inline int64_t ThreadCpuNanos() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

class Clock {
 public:
  virtual ~Clock() = default;
  virtual int64_t NowNanos() const = 0;
  double NowSeconds() const { return static_cast<double>(NowNanos()) * 1e-9; }
};

class RealClock final : public Clock {
 public:
  int64_t NowNanos() const override { return MonotonicNanos(); }
};

// A clock that moves only when told to. Thread-safe.
class FakeClock final : public Clock {
 public:
  explicit FakeClock(int64_t start_nanos = 0) : now_(start_nanos) {}
  int64_t NowNanos() const override { return now_.load(); }
  void Advance(int64_t nanos) { now_.fetch_add(nanos); }
  void Set(int64_t nanos) { now_.store(nanos); }

 private:
  std::atomic<int64_t> now_;
};

}  // namespace failsafe
