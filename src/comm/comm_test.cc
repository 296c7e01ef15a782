// Communicators with real processes (fork): results, abort and timeouts.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "comm/abort_signal.h"
#include "comm/channel.h"
#include "comm/gloo_communicator.h"
#include "comm/kv_store.h"
#include "comm/shm_communicator.h"
#include "common/clock.h"
#include "common/forked.h"

namespace failsafe {
namespace {

// Inputs are computed once, before forking, so that every process sums the
// very same floats.
const std::vector<std::vector<float>>& Inputs() {
  static const auto* inputs = [] {
    auto* v = new std::vector<std::vector<float>>(8, std::vector<float>(200000));
    for (int r = 0; r < 8; ++r) {
      for (size_t i = 0; i < 200000; ++i)
        (*v)[r][i] = std::sin(0.001f * static_cast<float>(i) + static_cast<float>(r));
    }
    return v;
  }();
  return *inputs;
}
float Value(int rank, size_t i) { return Inputs()[rank][i]; }

// Checks an all-reduce result against the rank-order sum, bit for bit.
int CheckSum(const std::vector<float>& v, int n) {
  for (size_t i = 0; i < v.size(); ++i) {
    float want = Value(0, i);
    for (int r = 1; r < n; ++r) want += Value(r, i);
    if (v[i] != want) {
      std::fprintf(stderr, "n=%d size=%zu i=%zu got %.9g want %.9g\n", n, v.size(), i, v[i], want);
      return 3;
    }
  }
  return 0;
}

// Every collective of the contract on member `rank` of `n`, 0 or the first
// failure's code: float sums bit for bit in rank order, fixed-point sums,
// gathers and a barrier, several times over one group, on sizes smaller
// than the group, not divisible by it, and longer than a shared-memory
// slot (the direct path, the reduce-scatter path, chunking). 67139 floats
// in slots of 16384 end in a chunk of 1603, whose fifths, 320 and a part,
// round down to whole vectors: five pieces of 320 would leave 3 unsummed.
int CheckCollectives(Communicator& comm, int rank, int n) {
  for (size_t count : {size_t{1}, size_t{2}, size_t{37}, size_t{4096}, size_t{50000}, size_t{67139},
                       size_t{100003}}) {
    for (int iter = 0; iter < 2; ++iter) {
      std::vector<float> v(count);
      for (size_t i = 0; i < count; ++i) v[i] = Value(rank, i);
      if (!comm.AllReduceSum(v.data(), count).ok()) return 2;
      if (int c = CheckSum(v, n)) return c;
      std::vector<int64_t> f(count);
      for (size_t i = 0; i < count; ++i) f[i] = static_cast<int64_t>(i) * 1000 + rank;
      if (!comm.AllReduceSum(f.data(), count).ok()) return 4;
      for (size_t i = 0; i < count; ++i) {
        if (f[i] != static_cast<int64_t>(i) * 1000 * n + n * (n - 1) / 2) return 5;
      }
    }
  }
  for (size_t bytes : {size_t{1}, size_t{4000}, size_t{1} << 20}) {
    std::vector<char> mine(bytes, static_cast<char>('a' + rank)), all(bytes * n, 0);
    if (!comm.AllGather(mine.data(), bytes, all.data()).ok()) return 6;
    for (int r = 0; r < n; ++r) {
      for (size_t i = 0; i < bytes; ++i) {
        if (all[r * bytes + i] != static_cast<char>('a' + r)) return 7;
      }
    }
  }
  return comm.Barrier().ok() ? 0 : 8;
}

class ShmTest : public ::testing::TestWithParam<int> {};

TEST_P(ShmTest, AllReduceAndAllGather) {
  const int n = GetParam();
  Inputs();
  auto region = ShmCommunicator::CreateRegion(n, 64 << 10);
  ASSERT_TRUE(region.ok());
  const int fd = region->fd();
  auto codes = RunForked(n, [&](int rank) {
    auto mapped = ShmRegion::Map(::dup(fd));
    if (!mapped.ok()) return 1;
    ShmCommunicator comm(std::move(mapped).value(), rank, 10000);
    return CheckCollectives(comm, rank, n);
  });
  for (int c : codes) EXPECT_EQ(c, 0);
}

INSTANTIATE_TEST_SUITE_P(Members, ShmTest, ::testing::Values(1, 2, 3, 5, 8));

TEST(Shm, AbortFromCoordinatorFailsEveryWaiterFast) {
  const int n = 4;
  auto region = ShmCommunicator::CreateRegion(n, 4096);
  ASSERT_TRUE(region.ok());
  const int fd = region->fd();
  // Rank 3 never shows up (a dead device); the coordinator aborts.
  auto codes = RunForked(
      n - 1,
      [&](int rank) {
        auto mapped = ShmRegion::Map(::dup(fd));
        ShmCommunicator comm(std::move(mapped).value(), rank, 60000);
        std::vector<float> v(100, 1.0f);
        int64_t t0 = MonotonicNanos();
        Status st = comm.AllReduceSum(v.data(), v.size());
        int64_t waited_ms = (MonotonicNanos() - t0) / 1000000;
        if (st.code() != StatusCode::kAborted) return 1;
        if (waited_ms > 5000) return 2;
        // Later calls fail at once.
        return comm.Barrier().code() == StatusCode::kAborted ? 0 : 3;
      },
      [&] {
        ::usleep(200000);
        ShmCommunicator::AbortRegion(*region);
      });
  for (int c : codes) EXPECT_EQ(c, 0);
  EXPECT_TRUE(ShmCommunicator::IsAborted(*region));
}

TEST(Shm, TimeoutAbortsTheGroup) {
  auto region = ShmCommunicator::CreateRegion(3, 4096);
  ASSERT_TRUE(region.ok());
  const int fd = region->fd();
  auto codes = RunForked(2, [&](int rank) {
    auto mapped = ShmRegion::Map(::dup(fd));
    ShmCommunicator comm(std::move(mapped).value(), rank, 300);
    Status st = comm.Barrier();
    return st.code() == StatusCode::kDeadlineExceeded || st.code() == StatusCode::kAborted ? 0 : 1;
  });
  for (int c : codes) EXPECT_EQ(c, 0);
}

// Await: work outside the communicator (a device library's operation)
// waited for as a collective: done when it says so, its error returned,
// ended by the group's abort, and past the timeout the group aborted.
TEST(Shm, AwaitEndsByDoneErrorAbortOrDeadline) {
  auto region = ShmCommunicator::CreateRegion(2, 4096);
  ASSERT_TRUE(region.ok());
  {
    ShmCommunicator comm(ShmRegion::Map(::dup(region->fd())).value(), 0, 60000);
    int polls = 0;
    EXPECT_TRUE(comm.Await([&]() -> Result<bool> { return ++polls == 5; }).ok());
    EXPECT_EQ(polls, 5);
    Status failed = comm.Await([]() -> Result<bool> { return Unavailable("the library failed"); });
    EXPECT_EQ(failed.code(), StatusCode::kUnavailable);
    EXPECT_FALSE(ShmCommunicator::IsAborted(*region));  // the caller's to handle
    // Never done: the coordinator's abort ends it.
    std::thread coordinator([&] {
      ::usleep(100000);
      ShmCommunicator::AbortRegion(*region);
    });
    const int64_t t0 = MonotonicNanos();
    Status aborted = comm.Await([]() -> Result<bool> { return false; });
    coordinator.join();
    EXPECT_EQ(aborted.code(), StatusCode::kAborted);
    EXPECT_LT(MonotonicNanos() - t0, 5000000000LL);
  }
  auto fresh = ShmCommunicator::CreateRegion(2, 4096);
  ASSERT_TRUE(fresh.ok());
  ShmCommunicator comm(ShmRegion::Map(::dup(fresh->fd())).value(), 0, 200);
  const int64_t t0 = MonotonicNanos();
  Status late = comm.Await([]() -> Result<bool> { return false; });
  EXPECT_EQ(late.code(), StatusCode::kDeadlineExceeded);
  EXPECT_GE(MonotonicNanos() - t0, 200000000LL);
  EXPECT_TRUE(ShmCommunicator::IsAborted(*fresh));
}

TEST(Channel, PassesMessagesAndDescriptors) {
  auto pair = Channel::Pair();
  ASSERT_TRUE(pair.ok());
  auto& [a, b] = *pair;
  auto region = ShmRegion::Create("test", 4096);
  ASSERT_TRUE(region.ok());
  static_cast<char*>(region->data())[0] = 'x';
  std::string big(3 << 20, 'y');
  Message m;
  Status received;
  std::thread reader([&] { received = b.Receive(&m, 5000); });
  ASSERT_TRUE(a.Send(7, big, {region->fd()}).ok());
  reader.join();
  ASSERT_TRUE(received.ok()) << received.ToString();
  EXPECT_EQ(m.type, 7u);
  EXPECT_EQ(m.payload, big);
  ASSERT_EQ(m.fds.size(), 1u);
  auto mapped = ShmRegion::Map(m.fds[0]);
  ASSERT_TRUE(mapped.ok());
  EXPECT_EQ(static_cast<char*>(mapped->data())[0], 'x');
  EXPECT_EQ(b.Receive(&m, 50).code(), StatusCode::kDeadlineExceeded);
  a.Close();
  EXPECT_EQ(b.Receive(&m, 1000).code(), StatusCode::kUnavailable);
}

// A gloo group of `n` child processes. Members learn the store's port
// through a pipe: the children fork before the parent starts its server
// thread. `body` runs with the member's communicator; `parent` (optional)
// runs in the parent once the store serves. With `signal_fd` >= 0 every
// member watches that abort signal.
struct GlooGroup {
  int n = 0;
  std::string prefix;
  int64_t timeout_ms = 20000;
  int signal_fd = -1;
};

std::vector<int> RunGlooGroup(const GlooGroup& g,
                              const std::function<int(Communicator&, int)>& body,
                              const std::function<void()>& parent = {}) {
  int port_pipe[2];
  if (::pipe(port_pipe) != 0) return {};
  std::unique_ptr<KvStoreServer> server;
  return RunForked(
      g.n,
      [&](int rank) {
        int port = 0;
        for (int r = 0; r <= rank; ++r) {
          if (::read(port_pipe[0], &port, sizeof(port)) != sizeof(port)) return 10;
        }
        GlooGroupOptions o;
        o.store_port = port;
        o.prefix = g.prefix;
        o.rank = rank;
        o.size = g.n;
        o.timeout_ms = g.timeout_ms;
        AbortSignal abort;
        if (g.signal_fd >= 0) {
          auto mapped = AbortSignal::Map(::dup(g.signal_fd));
          if (!mapped.ok()) return 12;
          abort = std::move(mapped).value();
        }
        auto comm = GlooCommunicator::Connect(o, std::move(abort));
        if (!comm.ok()) return 11;
        return body(**comm, rank);
      },
      [&] {
        auto s = KvStoreServer::Start("127.0.0.1", 0);
        ASSERT_TRUE(s.ok());
        server = std::move(s).value();
        int port = server->port();
        for (int r = 0; r < g.n * g.n; ++r)
          ASSERT_EQ(::write(port_pipe[1], &port, sizeof(port)), (ssize_t)sizeof(port));
        if (parent) parent();
      });
}

class GlooTest : public ::testing::TestWithParam<int> {};

// The same contract and bits as the shared-memory group.
TEST_P(GlooTest, CollectivesMatchTheSharedMemoryGroup) {
  const int n = GetParam();
  Inputs();
  auto codes = RunGlooGroup({n, "gt" + std::to_string(n)}, [&](Communicator& comm, int rank) {
    return CheckCollectives(comm, rank, n);
  });
  ASSERT_EQ(codes.size(), static_cast<size_t>(n));
  for (int c : codes) EXPECT_EQ(c, 0);
}

INSTANTIATE_TEST_SUITE_P(Members, GlooTest, ::testing::Values(2, 3, 5));

TEST(Gloo, AllReduceOverLoopbackAndDeadPeer) {
  const int n = 3;
  Inputs();
  auto codes = RunGlooGroup({n, "g0"}, [&](Communicator& comm, int rank) {
    std::vector<float> v(20000);
    for (size_t i = 0; i < v.size(); ++i) v[i] = Value(rank, i);
    if (!comm.AllReduceSum(v.data(), v.size()).ok()) return 12;
    if (CheckSum(v, n) != 0) return 13;
    if (rank == 2) ::_exit(0);  // a device dies
    int64_t t0 = MonotonicNanos();
    Status st = comm.AllReduceSum(v.data(), v.size());
    if (st.code() != StatusCode::kAborted) return 14;
    return (MonotonicNanos() - t0) / 1000000 < 10000 ? 0 : 15;
  });
  for (int c : codes) EXPECT_EQ(c, 0);
}

// A hung member (it never enters the collective) does not hold the others
// for the collective timeout: the coordinator raises the group's abort
// signal and every member waiting in gloo fails at once.
TEST(Gloo, AbortSignalFailsMembersWaitingOnAHungPeer) {
  auto signal = AbortSignal::Create();
  ASSERT_TRUE(signal.ok());
  const int signal_fd = signal->fd();
  auto codes = RunGlooGroup(
      {3, "g1", 60000, signal_fd},
      [&](Communicator& comm, int rank) {
        std::vector<float> v(1000, 1.0f);
        if (!comm.AllReduceSum(v.data(), v.size()).ok()) return 13;
        if (rank == 2) {
          // Hung: it never enters the next collective, and stays (its
          // connections open) well after the abort.
          auto watch = AbortSignal::Map(::dup(signal_fd));
          if (!watch.ok()) return 16;
          while (!watch->raised()) watch->WaitChange(watch->generation());
          ::usleep(2000000);
          return 0;
        }
        const int64_t t0 = MonotonicNanos();
        Status st = comm.AllReduceSum(v.data(), v.size());
        if (st.code() != StatusCode::kAborted) return 14;
        // The abort comes about 0.4 s in; the hung peer leaves 2 s later.
        return (MonotonicNanos() - t0) / 1000000 < 1500 ? 0 : 15;
      },
      [&] {
        ::usleep(500000);
        signal->Raise();
      });
  for (int c : codes) EXPECT_EQ(c, 0);
}

// A member whose collective is stuck inside gloo's transport (a send
// queued behind a peer that stopped reading, its socket's buffer full; a
// receive whose data had begun to arrive) still fails at once when the
// group is aborted: the coordinator would otherwise declare a healthy
// device dead for not answering the abort. The last rank freezes (SIGSTOP)
// in the middle of a large all-reduce, as a device behind a link that
// stopped carrying does; the others' collectives wait on its data, some of
// it received.
class GlooStuckTest : public ::testing::TestWithParam<int> {};

TEST_P(GlooStuckTest, AbortFailsACollectiveStuckInTheTransport) {
  const int n = GetParam();
  int pid_pipe[2];
  ASSERT_EQ(::pipe(pid_pipe), 0);
  auto signal = AbortSignal::Create();
  ASSERT_TRUE(signal.ok());
  auto codes = RunGlooGroup(
      {n, "g2-" + std::to_string(n), 30000, signal->fd()},
      [&](Communicator& comm, int rank) {
        // Far more than the sockets' buffers hold; once through, so that
        // the freeze below comes in the middle of the transfers.
        std::vector<float> big(48 << 20, 1.0f);
        if (!comm.AllReduceSum(big.data(), big.size()).ok()) return 18;
        if (rank == n - 1) {
          const pid_t self = ::getpid();
          if (::write(pid_pipe[1], &self, sizeof(self)) != sizeof(self)) return 17;
          std::thread([] {
            ::usleep(20000);
            ::raise(SIGSTOP);
          }).detach();
          (void)comm.AllReduceSum(big.data(), big.size());
          return 0;
        }
        const int64_t t0 = MonotonicNanos();
        Status st = comm.AllReduceSum(big.data(), big.size());
        const int64_t ms = (MonotonicNanos() - t0) / 1000000;
        if (st.code() != StatusCode::kAborted || ms >= 1500) {
          std::fprintf(stderr, "rank %d: %s after %lld ms\n", rank, st.ToString().c_str(),
                       static_cast<long long>(ms));
          return 14;
        }
        // The group stays failed: nothing more runs on it.
        std::vector<float> small(1000, 1.0f);
        if (comm.AllReduceSum(small.data(), small.size()).code() != StatusCode::kAborted) return 16;
        // And idle: gloo's device thread does not spin on what the aborted
        // collective left in its connections while the group lives on.
        timespec c0, c1;
        ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
        ::usleep(400000);
        ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
        const int64_t cpu_ms =
            ((c1.tv_sec - c0.tv_sec) * 1000000000LL + (c1.tv_nsec - c0.tv_nsec)) / 1000000;
        if (cpu_ms > 100) {
          std::fprintf(stderr, "rank %d: %lld ms of CPU in 400 ms after the abort\n", rank,
                       static_cast<long long>(cpu_ms));
          return 19;
        }
        return 0;
      },
      [&] {
        pid_t frozen = 0;
        ASSERT_EQ(::read(pid_pipe[0], &frozen, sizeof(frozen)), (ssize_t)sizeof(frozen));
        ::usleep(700000);
        signal->Raise();
        ::usleep(2500000);
        ::kill(frozen, SIGKILL);
      });
  ASSERT_EQ(codes.size(), static_cast<size_t>(n));
  for (int r = 0; r + 1 < n; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
  EXPECT_EQ(codes[n - 1], 128 + SIGKILL);
}

INSTANTIATE_TEST_SUITE_P(Members, GlooStuckTest, ::testing::Values(2, 3));

}  // namespace
}  // namespace failsafe
