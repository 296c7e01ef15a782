// UnitShares: work shared among the threads of a parallel region, each
// starting on its own piece and taking over a slower one's tail.
#pragma once

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <utility>

namespace failsafe::cpu {

// The chunks a thread's piece of work is taken in (UnitShares): fine enough
// that a faster thread can take over most of a slower one's tail, coarse
// enough that each is a long run of memory.
inline constexpr int kUnitShareTakes = 8;

// Splits [0, count) into `parts` contiguous pieces, as equal as whole
// pieces of ceil(count / parts) allow: piece t.
inline std::pair<int, int> Piece(int count, int parts, int t) {
  const int64_t per = (int64_t{count} + parts - 1) / parts;
  return {static_cast<int>(std::min<int64_t>(count, t * per)),
          static_cast<int>(std::min<int64_t>(count, (t + 1) * per))};
}

// Shares [0, count) units of work among the threads of a parallel region.
// Each thread starts on its own equal contiguous piece and takes it front
// to back, a chunk at a time; a thread whose piece is done then takes chunks
// from the back of the piece with the most left. Where the cores run at one
// speed this is the fixed split, each piece read as one run. Where one runs
// slower (another process on its core, a virtual CPU whose host core is
// busy), the other takes over its tail instead of waiting at the barrier.
// Every unit is done once, whole, by one thread; which thread, and in which
// chunks, varies from run to run, so a caller's results must not depend on
// it (Gemm's do not: a column's sum is one thread's, and fixed-point sums
// are exact in any grouping).
class UnitShares {
 public:
  // A piece is taken in about `takes` chunks (1: whole, the fixed split), of
  // at most `max_chunk` units each.
  UnitShares(int count, int threads, int takes = kUnitShareTakes, int max_chunk = 1 << 30)
      : threads_(threads), slots_(new Slot[threads]) {
    const int per = Piece(count, threads, 0).second;
    chunk_ = std::clamp((per + takes - 1) / takes, 1, std::max(1, max_chunk));
    for (int t = 0; t < threads; ++t) {
      const auto [u0, u1] = Piece(count, threads, t);
      slots_[t].range.store(Pack(u0, u1), std::memory_order_relaxed);
    }
  }

  // Thread t's part: f(u0, u1) for each range it takes, until none is left.
  template <typename F>
  void Run(int t, F f) {
    while (Take(t, true, f)) {
    }
    for (;;) {
      int victim = -1;
      uint32_t most = 0;
      for (int p = 0; p < threads_; ++p) {
        const uint64_t v = slots_[p].range.load(std::memory_order_relaxed);
        const uint32_t left = Hi(v) > Lo(v) ? Hi(v) - Lo(v) : 0;
        if (left > most) most = left, victim = p;
      }
      if (victim < 0) return;
      Take(victim, false, f);
    }
  }

 private:
  struct alignas(64) Slot {
    std::atomic<uint64_t> range;  // [Lo, Hi): the units of the piece not yet taken
  };
  static uint64_t Pack(uint32_t lo, uint32_t hi) { return uint64_t{lo} << 32 | hi; }
  static uint32_t Lo(uint64_t v) { return static_cast<uint32_t>(v >> 32); }
  static uint32_t Hi(uint64_t v) { return static_cast<uint32_t>(v); }

  // Takes a chunk of piece p, from its front or its back, and runs it;
  // false if the piece had none left.
  template <typename F>
  bool Take(int p, bool front, F& f) {
    std::atomic<uint64_t>& range = slots_[p].range;
    uint64_t v = range.load(std::memory_order_relaxed);
    for (;;) {
      const uint32_t lo = Lo(v), hi = Hi(v);
      if (lo >= hi) return false;
      const uint32_t n = std::min<uint32_t>(chunk_, hi - lo);
      const uint64_t rest = front ? Pack(lo + n, hi) : Pack(lo, hi - n);
      if (range.compare_exchange_weak(v, rest, std::memory_order_relaxed)) {
        if (front) {
          f(static_cast<int>(lo), static_cast<int>(lo + n));
        } else {
          f(static_cast<int>(hi - n), static_cast<int>(hi));
        }
        return true;
      }
    }
  }

  int threads_;
  int chunk_ = 1;
  std::unique_ptr<Slot[]> slots_;
};

// run(u0, u1) over [0, count) units: on one thread (or with one unit) the
// whole range in one call, else shared out over `threads` in a parallel
// region (UnitShares: pieces taken in about `takes` chunks of at most
// `max_chunk` units).
template <typename Run>
void ShareOut(int count, int threads, Run run, int takes = kUnitShareTakes,
              int max_chunk = 1 << 30) {
  if (threads <= 1 || count <= 1) return run(0, count);
  UnitShares shares(count, threads, takes, max_chunk);
#pragma omp parallel num_threads(threads)
  shares.Run(omp_get_thread_num(), run);
}

}  // namespace failsafe::cpu
