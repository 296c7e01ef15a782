// UnitShares: every unit done once, each thread's own piece first, and a
// stalled thread's piece taken over by the others.
#include "backend/cpu/unit_shares.h"

#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace failsafe::cpu {
namespace {

TEST(UnitSharesTest, EveryUnitOnceInChunksAtMostTheChunk) {
  for (int count : {0, 1, 7, 100, 1001}) {
    for (int threads : {1, 2, 3, 5}) {
      for (int takes : {1, 3, kUnitShareTakes}) {
        UnitShares shares(count, threads, takes);
        std::vector<std::atomic<int>> done(count);
        const int per = (count + threads - 1) / threads;
        const int chunk = std::max(1, (per + takes - 1) / takes);
        std::atomic<bool> bad_range{false};
        std::vector<std::thread> pool;
        for (int t = 0; t < threads; ++t) {
          pool.emplace_back([&, t] {
            shares.Run(t, [&](int u0, int u1) {
              if (u0 < 0 || u1 > count || u0 >= u1 || u1 - u0 > chunk) bad_range = true;
              for (int u = std::max(0, u0); u < std::min(count, u1); ++u) ++done[u];
            });
          });
        }
        for (auto& th : pool) th.join();
        EXPECT_FALSE(bad_range) << count << " units, " << threads << " threads";
        for (int u = 0; u < count; ++u)
          ASSERT_EQ(done[u].load(), 1) << "unit " << u << " of " << count << ", " << threads
                                       << " threads, " << takes << " takes";
      }
    }
  }
}

TEST(UnitSharesTest, MaxChunkBoundsEveryTake) {
  UnitShares shares(100, 2, 1, 7);
  int largest = 0, total = 0;
  shares.Run(0, [&](int u0, int u1) {
    largest = std::max(largest, u1 - u0);
    total += u1 - u0;
  });
  EXPECT_EQ(largest, 7);
  EXPECT_EQ(total, 100);
}

// Alone, a thread takes its own piece front to back, then the others'
// pieces from their backs, largest first.
TEST(UnitSharesTest, OwnPieceFirstThenOthersFromTheBack) {
  UnitShares shares(12, 3, 2);  // pieces [0, 4), [4, 8), [8, 12); chunks of 2
  std::vector<std::pair<int, int>> taken;
  shares.Run(1, [&](int u0, int u1) { taken.push_back({u0, u1}); });
  const std::vector<std::pair<int, int>> want = {{4, 6}, {6, 8}, {2, 4}, {10, 12}, {0, 2}, {8, 10}};
  EXPECT_EQ(taken, want);
}

// A thread that starts late (its core busy elsewhere) finds its piece taken
// over: the step does not wait for it.
TEST(UnitSharesTest, StalledThreadsPieceIsTakenOver) {
  const int count = 64;
  UnitShares shares(count, 2);
  std::vector<int> by(count, -1);
  std::mutex mu;
  auto run = [&](int t) {
    shares.Run(t, [&](int u0, int u1) {
      std::lock_guard<std::mutex> lock(mu);
      for (int u = u0; u < u1; ++u) by[u] = t;
    });
  };
  std::thread first([&] { run(0); });
  first.join();  // thread 1 starts only when thread 0 has nothing left
  run(1);
  for (int u = 0; u < count; ++u) EXPECT_EQ(by[u], 0) << "unit " << u;
}

}  // namespace
}  // namespace failsafe::cpu
