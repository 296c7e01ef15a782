// PeerReducer between real processes (fork), each with its own CPU backend
// mapping the others' memory through /proc: the sums of ShmCommunicator bit
// for bit through chunks and the reduce-scatter path, a new group after a
// member left, a group that cannot share falling back together, and a dead
// member failing the survivors by the deadline.
#include "worker/peer_reducer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <cstdio>
#include <vector>

#include "comm/shm_communicator.h"
#include "common/clock.h"
#include "common/forked.h"

namespace failsafe {
namespace {

float Value(int rank, size_t i) {
  return std::sin(0.001f * static_cast<float>(i) + static_cast<float>(rank)) * (1 + rank);
}

// Sums of `count` floats and fixed-point values on `members` (rank r holds
// member rank members[r]'s values) through `peer`, in the backend's memory,
// against the rank-order sums. 0 or a failure's code.
int CheckSums(PeerReducer& peer, Backend& backend, Communicator& comm,
              const std::vector<int>& members, size_t count) {
  const int rank = comm.rank(), me = members[static_cast<size_t>(rank)];
  std::vector<float> v(count);
  for (size_t i = 0; i < count; ++i) v[i] = Value(me, i);
  DeviceArray<float> dv(&backend, count);
  backend.CopyToDevice(dv.data(), v.data(), count * sizeof(float));
  if (!peer.AllReduceSum(comm, dv.data(), count).ok()) return 2;
  backend.CopyToHost(v.data(), dv.data(), count * sizeof(float));
  for (size_t i = 0; i < count; ++i) {
    float want = Value(members[0], i);
    for (size_t m = 1; m < members.size(); ++m) want += Value(members[m], i);
    if (v[i] != want) return 3;
  }
  std::vector<int64_t> f(count);
  for (size_t i = 0; i < count; ++i) f[i] = static_cast<int64_t>(i) * 1000 + me - (1LL << 62);
  DeviceArray<int64_t> df(&backend, count);
  backend.CopyToDevice(df.data(), f.data(), count * sizeof(int64_t));
  if (!peer.AllReduceSum(comm, df.data(), count).ok()) return 4;
  backend.CopyToHost(f.data(), df.data(), count * sizeof(int64_t));
  for (size_t i = 0; i < count; ++i) {
    uint64_t want = 0;  // wrapping, as AddFixed
    for (int m : members)
      want += static_cast<uint64_t>(static_cast<int64_t>(i) * 1000 + m) - (uint64_t{1} << 62);
    if (f[i] != static_cast<int64_t>(want)) {
      std::fprintf(stderr, "rank %d count %zu i %zu got %lld want %lld\n", rank, count, i,
                   static_cast<long long>(f[i]), static_cast<long long>(want));
      return 5;
    }
  }
  return 0;
}

ShmCommunicator MapComm(const ShmRegion& region, int rank, int64_t timeout_ms) {
  return ShmCommunicator(std::move(ShmRegion::Map(::dup(region.fd()))).value(), rank, timeout_ms);
}

class PeerReducerTest : public ::testing::TestWithParam<int> {};

// Slots of 4 KiB: every size past 512 floats goes in chunks, and past
// 2 KiB of traffic by reduce-scatter.
TEST_P(PeerReducerTest, SumsAsTheCommunicatorDoes) {
  const int n = GetParam();
  auto region = ShmCommunicator::CreateRegion(n, 4096);
  ASSERT_TRUE(region.ok());
  auto codes = RunForked(n, [&](int rank) {
    auto backend = MakeCpuBackend(1);
    ShmCommunicator comm = MapComm(*region, rank, 10000);
    PeerReducer peer(backend.get(), 4096, 2048);
    auto ready = peer.Ready(comm);
    if (!ready.ok() || !*ready) return 1;
    std::vector<int> members(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) members[static_cast<size_t>(r)] = r;
    for (size_t count : {size_t{1}, size_t{37}, size_t{512}, size_t{4099}, size_t{100003}}) {
      for (int iter = 0; iter < 2; ++iter) {
        if (int c = CheckSums(peer, *backend, comm, members, count)) return 10 * c + iter;
      }
    }
    return 0;
  });
  for (int c : codes) EXPECT_EQ(c, 0);
}

INSTANTIATE_TEST_SUITE_P(Members, PeerReducerTest, ::testing::Values(2, 3, 5, 8));

// Members 0..3, then a new group of 0, 1 and 3 (2 left): the survivors keep
// their memory and mappings and sum again; the same reducer serves both.
TEST(PeerReducer, NewGroupAfterAMemberLeft) {
  auto first = ShmCommunicator::CreateRegion(4, 4096);
  auto second = ShmCommunicator::CreateRegion(3, 4096);
  ASSERT_TRUE(first.ok() && second.ok());
  auto codes = RunForked(4, [&](int rank) {
    auto backend = MakeCpuBackend(1);
    PeerReducer peer(backend.get(), 4096, 2048);
    {
      ShmCommunicator comm = MapComm(*first, rank, 10000);
      auto ready = peer.Ready(comm);
      if (!ready.ok() || !*ready) return 1;
      if (int c = CheckSums(peer, *backend, comm, {0, 1, 2, 3}, 5000)) return 10 + c;
    }
    if (rank == 2) return 0;
    ShmCommunicator comm = MapComm(*second, rank < 2 ? rank : 2, 10000);
    auto ready = peer.Ready(comm);
    if (!ready.ok() || !*ready) return 2;
    if (int c = CheckSums(peer, *backend, comm, {0, 1, 3}, 70001)) return 20 + c;
    return 0;
  });
  for (int c : codes) EXPECT_EQ(c, 0);
}

// One member's slots are larger than the others': it cannot map theirs at
// its size, so every member hears "no" from the same setup and the group
// stages through the host as before.
TEST(PeerReducer, AGroupThatCannotShareFallsBackTogether) {
  auto region = ShmCommunicator::CreateRegion(3, 4096);
  ASSERT_TRUE(region.ok());
  auto codes = RunForked(3, [&](int rank) {
    auto backend = MakeCpuBackend(1);
    ShmCommunicator comm = MapComm(*region, rank, 10000);
    PeerReducer peer(backend.get(), rank == 1 ? 1 << 20 : 4096);
    auto ready = peer.Ready(comm);
    if (!ready.ok()) return 1;
    if (*ready) return 2;
    if (peer.why_not().empty()) return 3;
    // The group still works.
    std::vector<float> v = {static_cast<float>(rank)};
    if (!comm.AllReduceSum(v.data(), 1).ok() || v[0] != 3.0f) return 4;
    return 0;
  });
  for (int c : codes) EXPECT_EQ(c, 0);
}

// A member killed before the group meets: the survivors' all-reduce fails
// by the communicator's deadline rather than waiting.
TEST(PeerReducer, ADeadMemberFailsTheSurvivorsByTheDeadline) {
  auto region = ShmCommunicator::CreateRegion(3, 4096);
  ASSERT_TRUE(region.ok());
  auto codes = RunForked(3, [&](int rank) {
    auto backend = MakeCpuBackend(1);
    ShmCommunicator comm = MapComm(*region, rank, 300);
    PeerReducer peer(backend.get(), 4096, 2048);
    auto ready = peer.Ready(comm);
    if (!ready.ok() || !*ready) return 1;
    if (int c = CheckSums(peer, *backend, comm, {0, 1, 2}, 100)) return 10 + c;
    if (rank == 2) ::raise(SIGKILL);
    DeviceArray<float> d(backend.get(), 1000);
    backend->SetZero(d.data(), 1000 * sizeof(float));
    const int64_t t0 = MonotonicNanos();
    Status st = peer.AllReduceSum(comm, d.data(), 1000);
    const double s = (MonotonicNanos() - t0) * 1e-9;
    if (st.ok()) return 2;
    return s < 5.0 ? 0 : 3;
  });
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], 0);
  EXPECT_EQ(codes[2], 128 + SIGKILL);
}

}  // namespace
}  // namespace failsafe
