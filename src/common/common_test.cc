#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstring>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <vector>

#include "common/clock.h"
#include "common/fd_share.h"
#include "common/forked.h"
#include "common/ordered_sums.h"
#include "common/rng.h"
#include "common/scratch_dir.h"
#include "common/sse.h"
#include "common/status.h"
#include "common/units.h"

namespace failsafe {
namespace {

TEST(Units, ParsesSizes) {
  EXPECT_EQ(*ParseBytes("4096"), 4096);
  EXPECT_EQ(*ParseBytes("2GiB"), 2LL << 30);
  EXPECT_EQ(*ParseBytes("1.5KiB"), 1536);
  EXPECT_EQ(*ParseBytes("3MB"), 3000000);
  EXPECT_FALSE(ParseBytes("lots").ok());
  EXPECT_FALSE(ParseBytes("-1GiB").ok());
  EXPECT_FALSE(ParseBytes("5 parsecs").ok());
}

TEST(Units, ParsesDurations) {
  EXPECT_DOUBLE_EQ(*ParseDuration("250ms"), 0.25);
  EXPECT_DOUBLE_EQ(*ParseDuration("2.5s"), 2.5);
  EXPECT_FALSE(ParseDuration("soon").ok());
}

TEST(Rng, SameSeedSameStream) {
  Rng a(42), b(42), c(43);
  for (int i = 0; i < 100; ++i) {
    uint64_t x = a.Next();
    EXPECT_EQ(x, b.Next());
    EXPECT_NE(x, c.Next());
  }
}

TEST(Rng, NormalHasUnitVariance) {
  Rng r(7);
  double sum = 0, sq = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    double x = r.Normal();
    sum += x;
    sq += x * x;
  }
  EXPECT_NEAR(sum / n, 0.0, 0.01);
  EXPECT_NEAR(sq / n, 1.0, 0.02);
}

Result<int> Half(int x) {
  if (x % 2) return InvalidArgument("{} is odd", x);
  return x / 2;
}

Status UseHalf(int x, int* out) {
  FS_ASSIGN_OR_RETURN(*out, Half(x));
  return Status::Ok();
}

TEST(Status, PropagatesErrors) {
  int out = 0;
  EXPECT_TRUE(UseHalf(4, &out).ok());
  EXPECT_EQ(out, 2);
  Status s = UseHalf(3, &out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "3 is odd");
}

TEST(ScratchDir, RemovedWithItsOwnerButNotByAForkedChild) {
  std::string path;
  {
    ScratchDir a("scratch_test");
    ScratchDir b("scratch_test");
    path = a.path();
    EXPECT_NE(a.path(), b.path());
    ASSERT_TRUE(std::filesystem::is_directory(path));
    std::filesystem::create_directories(a.Sub("x/y"));
    std::ofstream(a.Sub("x/y/z")) << "z";
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      ScratchDir moved = std::move(a);  // destroyed in the child: must not remove
      std::exit(0);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    EXPECT_TRUE(std::filesystem::exists(path + "/x/y/z"));
    ScratchDir c = std::move(a);
    EXPECT_EQ(c.path(), path);
  }
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_TRUE(std::filesystem::is_directory(ProcessScratchDir().path()));
}

TEST(Sse, EventsAreSplitWhenWhole) {
  std::string buf = "data: {\"a\":1}\n\ndata: [DONE]\n\n: comment\n\ndata: {\"b\"";
  auto events = TakeSseData(&buf);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0], "{\"a\":1}");
  EXPECT_EQ(events[1], "[DONE]");
  EXPECT_EQ(buf, "data: {\"b\"");
  buf += ":2}\r\n\r\n";
  events = TakeSseData(&buf);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0], "{\"b\":2}");
  EXPECT_TRUE(buf.empty());
}

}  // namespace
}  // namespace failsafe

namespace failsafe {
namespace {

// A reduce-scatter's pieces cover every element once, each starting on a
// 64-byte line, for every length and group size (a rounding that left the
// tail unsummed once hid here).
TEST(OrderedSums, ScatterPiecesTileTheRange) {
  for (int members = 1; members <= 9; ++members) {
    for (size_t n = 0; n <= 700; ++n) {
      size_t next = 0;
      for (int r = 0; r < members; ++r) {
        size_t b, e;
        ScatterPiece<float>(n, members, r, &b, &e);
        ASSERT_EQ(b, next) << n << " over " << members << ", member " << r;
        ASSERT_LE(b, e);
        ASSERT_TRUE(b == n || b % 16 == 0);
        next = e;
      }
      ASSERT_EQ(next, n) << n << " over " << members;
    }
  }
}

// Floats in order, each addition rounded; fixed point wrapping.
TEST(OrderedSums, InOrderAndWrapping) {
  const std::vector<float> a(37, 1e8f), b(37, 1.0f), c(37, -1e8f);
  const float* fs[3] = {a.data(), b.data(), c.data()};
  std::vector<float> out(37);
  SumInOrder(fs, 3, 0, 37, out.data());
  for (float v : out) EXPECT_EQ(v, (1e8f + 1.0f) + -1e8f);  // 0: the 1 is lost in order
  const std::vector<int64_t> x(20, INT64_MAX), y(20, 2);
  const int64_t* is[2] = {x.data(), y.data()};
  std::vector<int64_t> sum(20);
  SumInOrder(is, 2, 0, 20, sum.data());
  for (int64_t v : sum) EXPECT_EQ(v, AddFixed(INT64_MAX, 2));
}

// A memfd of `bytes` holding `fill`, for the FdShare tests.
int FilledMemfd(size_t bytes, char fill) {
  const int fd = ::memfd_create("fd-share-test", MFD_CLOEXEC);
  if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(bytes)) != 0) return -1;
  const std::string data(bytes, fill);
  return ::pwrite(fd, data.data(), bytes, 0) == static_cast<ssize_t>(bytes) ? fd : -1;
}

TEST(FdShare, AnotherProcessFetchesTheDescriptor) {
  const int fd = FilledMemfd(4096, 'x');
  ASSERT_GE(fd, 0);
  auto share = FdShare::Serve(fd);
  ASSERT_TRUE(share.ok()) << share.status().ToString();
  const std::string name = (*share)->name();
  EXPECT_LE(name.size(), FdShare::kMaxNameChars);
  const auto codes = RunForked(3, [&](int) {
    auto got = FetchSharedFd(name);
    if (!got.ok()) return 1;
    char c[2] = {};
    const bool same = ::pread(*got, c, 2, 4094) == 2 && c[0] == 'x' && c[1] == 'x';
    ::close(*got);
    return same ? 0 : 2;
  });
  EXPECT_EQ(codes, std::vector<int>({0, 0, 0}));
  EXPECT_EQ((*share)->served(), 3);
  ::close(fd);  // the share keeps a descriptor of its own
  auto again = FetchSharedFd(name);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  ::close(*again);
}

// A forked owner of a share of `bytes` of `fill`: `with(pid, name)` runs in
// this process meanwhile and must kill it (the owner waits to be killed).
// If the owner fails before it says its name, `with` is not run.
void WithAnOwner(size_t bytes, char fill, const std::function<void(pid_t, std::string)>& with) {
  int names[2];
  ASSERT_EQ(::pipe(names), 0);
  RunForked(
      1,
      [&](int) {
        const int fd = FilledMemfd(bytes, fill);
        auto share = FdShare::Serve(fd);
        if (fd < 0 || !share.ok()) return 1;
        const std::string name = (*share)->name();
        const pid_t self = ::getpid();
        if (::write(names[1], &self, sizeof(self)) != sizeof(self) ||
            ::write(names[1], name.data(), name.size()) != static_cast<ssize_t>(name.size()))
          return 1;
        ::pause();  // until killed
        return 0;
      },
      [&] {
        ::close(names[1]);  // a child that died before writing: the reads end
        pid_t owner = 0;
        char buf[64] = {};
        if (::read(names[0], &owner, sizeof(owner)) != sizeof(owner)) return;
        const ssize_t n = ::read(names[0], buf, sizeof(buf));
        with(owner, std::string(buf, n > 0 ? static_cast<size_t>(n) : 0));
      });
  ::close(names[0]);
}

// What a device killed with -9 mid-collective leaves a peer that fetched
// its memory: the memory, whole.
TEST(FdShare, MemoryOutlivesItsOwner) {
  const size_t bytes = 1 << 20;
  int fetched = -1;
  std::string why;
  WithAnOwner(bytes, 'm', [&](pid_t owner, const std::string& name) {
    auto got = FetchSharedFd(name);
    if (!got.ok()) why = got.status().ToString();
    fetched = got.ok() ? *got : -1;
    ::kill(owner, SIGKILL);
  });
  ASSERT_GE(fetched, 0) << why;
  void* p = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fetched, 0);
  ASSERT_NE(p, MAP_FAILED);
  ::close(fetched);
  const std::string want(bytes, 'm');
  EXPECT_EQ(std::memcmp(p, want.data(), bytes), 0);
  ::munmap(p, bytes);
}

// An owner that is alive but answers nothing (SIGSTOPped, as a hung
// device is): each fetch gives up by its timeout, also once its queue of
// connections is full.
TEST(FdShare, AStoppedOwnerTimesOutEveryFetch) {
  int timely = 0;
  WithAnOwner(64, 's', [&](pid_t owner, const std::string& name) {
    ::kill(owner, SIGSTOP);
    // Stopped only once every thread of it is: until then its share's
    // thread may still answer.
    int st = 0;
    if (::waitpid(owner, &st, WUNTRACED) != owner || !WIFSTOPPED(st)) {
      ADD_FAILURE() << "the owner did not stop";
      ::kill(owner, SIGKILL);
      return;
    }
    // More fetches than the listening queue holds (64).
    for (int i = 0; i < 80; ++i) {
      const int64_t t0 = MonotonicNanos();
      auto got = FetchSharedFd(name, 20);
      if (got.ok()) ::close(*got);
      timely += !got.ok() && MonotonicNanos() - t0 < 1000000000;
    }
    ::kill(owner, SIGKILL);
  });
  EXPECT_EQ(timely, 80);
}

TEST(FdShare, UnknownAndStoppedNamesAreUnavailable) {
  EXPECT_EQ(FetchSharedFd("failsafe-fd-no-such-name").status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(FetchSharedFd("").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(FetchSharedFd(std::string(FdShare::kMaxNameChars + 1, 'a')).status().code(),
            StatusCode::kInvalidArgument);
  const int fd = FilledMemfd(64, 'y');
  ASSERT_GE(fd, 0);
  std::string name;
  {
    auto share = FdShare::Serve(fd);
    ASSERT_TRUE(share.ok()) << share.status().ToString();
    name = (*share)->name();
  }
  EXPECT_EQ(FetchSharedFd(name).status().code(), StatusCode::kUnavailable);
  ::close(fd);
}

}  // namespace
}  // namespace failsafe
