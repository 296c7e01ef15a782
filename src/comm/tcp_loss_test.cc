// TcpLossSampler: its arithmetic over counters of a table of the test's
// own; and against the kernel: two network namespaces joined by a link of
// this test's own (a TAP device in each, frames copied between them by a
// thread that drops them on demand), a TCP connection across it, which
// needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN), iproute2 and /dev/net/tun
// and is skipped without them.
#include "comm/tcp_loss.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "comm/tcp.h"
#include "common/clock.h"

namespace failsafe {
namespace {

constexpr int64_t kMs = 1000000;

// The peers a sample finds lossy, and when each was last seen losing frames.
std::map<std::string, int64_t> Lossy(TcpLossSampler& s, int64_t now) {
  std::map<std::string, int64_t> out;
  for (const TcpLossSampler::Lossy& l : s.Sample(now)) out[l.peer] = l.last_ns;
  return out;
}

TEST(TcpLossSampler, CountsSegmentsLostNotRetransmittedSpuriously) {
  // Descriptors 3 and 4 connect to .2, 5 to .3.
  std::map<int, TcpLossState> k;
  k[3].inode = 103;
  k[4].inode = 104;
  k[5].inode = 105;
  TcpLossSampler s({{3, "10.0.0.2"}, {4, "10.0.0.2"}, {5, "10.0.0.3"}},
                   [&](int fd, TcpLossState* out) {
                     const auto it = k.find(fd);
                     if (it == k.end()) return false;
                     *out = it->second;
                     return true;
                   });
  ASSERT_EQ(s.connections(), 3u);
  int64_t t = 1000 * kMs;
  EXPECT_TRUE(Lossy(s, t).empty());
  // One segment lost on each connection to .2: two for that peer, lossy,
  // dated by the sample that saw them, until the window has passed.
  k[3].retransmitted = 1;
  k[4].retransmitted = 1;
  const int64_t lost_at = t += 50 * kMs;
  EXPECT_EQ(Lossy(s, t), (std::map<std::string, int64_t>{{"10.0.0.2", lost_at}}));
  EXPECT_EQ(Lossy(s, t += 900 * kMs), (std::map<std::string, int64_t>{{"10.0.0.2", lost_at}}));
  EXPECT_TRUE(Lossy(s, t += 200 * kMs).empty());
  // Two sent again toward .3, both of which it had (duplicate SACKs, one a
  // sample late): not lossy once the correction comes.
  k[5].retransmitted = 2;
  k[5].spurious = 1;
  EXPECT_TRUE(Lossy(s, t += 50 * kMs).empty());  // one lost so far: under the threshold
  k[5].spurious = 2;
  EXPECT_TRUE(Lossy(s, t += 50 * kMs).empty());
  // A correction whose loss has left the window hides no later loss.
  t += 950 * kMs;  // the first of those two has left, its correction not
  k[5].retransmitted = 4;
  EXPECT_EQ(Lossy(s, t), (std::map<std::string, int64_t>{{"10.0.0.3", t}}));
  t += 1100 * kMs;
  EXPECT_TRUE(Lossy(s, t).empty());
  // A retransmission timeout pending: lossy at once, whatever the count.
  k[3].timed_out = true;
  t += 50 * kMs;
  EXPECT_EQ(Lossy(s, t), (std::map<std::string, int64_t>{{"10.0.0.2", t}}));
  k[3].timed_out = false;
  EXPECT_TRUE(Lossy(s, t += 50 * kMs).empty());
  // Descriptor 4 now names another socket (closed, its number reused),
  // whose counters are not the connection's: it drops out; 3 closes.
  k[4] = {204, 1000, 0, true};
  k.erase(3);
  EXPECT_TRUE(Lossy(s, t += 50 * kMs).empty());
  EXPECT_EQ(s.connections(), 1u);
}

constexpr int kPort = 7519;
// Three segments: the last one's acknowledgement is delayed, and a
// tail-loss probe may go out before it (a spurious retransmission).
constexpr int kRequestBytes = 4000;

bool Run(const std::string& command) {
  return std::system((command + " >/dev/null 2>&1").c_str()) == 0;
}

// Runs `fn` on a thread that has entered namespace `ns` (sockets and TAP
// devices made there belong to it).
template <typename Fn>
void InNamespace(const std::string& ns, Fn fn) {
  std::thread t([&] {
    const int fd = ::open(("/run/netns/" + ns).c_str(), O_RDONLY | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::setns(fd, CLONE_NEWNET), 0);
    ::close(fd);
    fn();
  });
  t.join();
}

int OpenTap(const char* name) {
  const int fd = ::open("/dev/net/tun", O_RDWR | O_CLOEXEC);
  if (fd < 0) return -1;
  ifreq ifr{};
  ifr.ifr_flags = IFF_TAP | IFF_NO_PI;
  std::strncpy(ifr.ifr_name, name, IFNAMSIZ - 1);
  if (::ioctl(fd, TUNSETIFF, &ifr) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Namespaces a (10.9.0.1) and b (10.9.0.2), each with an eth0 whose frames
// the relay thread carries, dropping each with probability `loss`.
class Link {
 public:
  Link() {
    const std::string tag = "fsloss" + std::to_string(::getpid());
    a_ = tag + "a";
    b_ = tag + "b";
    if (::geteuid() != 0 || ::access("/dev/net/tun", R_OK | W_OK) != 0 ||
        !Run("ip netns add " + a_)) {
      return;
    }
    made_ = Run("ip netns add " + b_);
    if (!made_) return;
    InNamespace(a_, [&] { tap_a_ = OpenTap("eth0"); });
    InNamespace(b_, [&] { tap_b_ = OpenTap("eth0"); });
    if (tap_a_ < 0 || tap_b_ < 0) return;
    int i = 1;
    for (const std::string& ns : {a_, b_}) {
      if (!Run("ip -n " + ns + " addr add 10.9.0." + std::to_string(i++) + "/24 dev eth0") ||
          !Run("ip -n " + ns + " link set eth0 up") || !Run("ip -n " + ns + " link set lo up")) {
        return;
      }
    }
    relay_ = std::thread([this] { Relay(); });
    ok_ = true;
  }
  ~Link() {
    stop_ = true;
    if (relay_.joinable()) relay_.join();
    if (tap_a_ >= 0) ::close(tap_a_);
    if (tap_b_ >= 0) ::close(tap_b_);
    if (made_ || !a_.empty()) {
      Run("ip netns del " + a_);
      Run("ip netns del " + b_);
    }
  }
  bool ok() const { return ok_; }
  const std::string& a() const { return a_; }
  const std::string& b() const { return b_; }
  void set_loss(double loss) { loss_ = loss; }

 private:
  void Relay() {
    std::mt19937 rng(7);
    std::uniform_real_distribution<double> u(0, 1);
    std::vector<char> frame(65536);
    while (!stop_) {
      pollfd fds[2] = {{tap_a_, POLLIN, 0}, {tap_b_, POLLIN, 0}};
      if (::poll(fds, 2, 20) <= 0) continue;
      for (int k = 0; k < 2; ++k) {
        if (!(fds[k].revents & POLLIN)) continue;
        const ssize_t n = ::read(fds[k].fd, frame.data(), frame.size());
        if (n <= 0 || u(rng) < loss_.load()) continue;
        (void)!::write(fds[1 - k].fd, frame.data(), static_cast<size_t>(n));
      }
    }
  }

  std::string a_, b_;
  bool made_ = false, ok_ = false;
  int tap_a_ = -1, tap_b_ = -1;
  std::atomic<double> loss_{0};
  std::atomic<bool> stop_{false};
  std::thread relay_;
};

// Small requests, each answered (as a collective's exchanges are), for
// `seconds`, sampling the client's connection every 50 ms; how many samples
// found the server's address lossy.
int LossySamples(int client, double seconds) {
  TcpLossSampler sampler({client});
  EXPECT_EQ(sampler.connections(), 1u);
  int lossy = 0;
  char buf[kRequestBytes] = {};
  const int64_t end = MonotonicNanos() + static_cast<int64_t>(seconds * 1e9);
  int64_t next_sample = MonotonicNanos();
  while (MonotonicNanos() < end) {
    (void)!::send(client, buf, sizeof(buf), MSG_NOSIGNAL);
    pollfd p{client, POLLIN, 0};
    if (::poll(&p, 1, 100) > 0) (void)!::recv(client, buf, sizeof(buf), MSG_DONTWAIT);
    if (MonotonicNanos() >= next_sample) {
      for (const TcpLossSampler::Lossy& l : sampler.Sample(MonotonicNanos())) {
        EXPECT_EQ(l.peer, "10.9.0.2");
        ++lossy;
      }
      next_sample += 50 * 1000000LL;
    }
  }
  return lossy;
}

// A link that delivers every frame: never lossy, whatever spurious
// retransmissions (a tail-loss probe before a delayed acknowledgement) the
// exchange draws; one that drops a third of them: lossy.
TEST(TcpLossSampler, TellsALossyLinkFromAHealthyOne) {
  Link link;
  if (!link.ok()) GTEST_SKIP() << "needs root, iproute2 and /dev/net/tun";
  int server = -1, client = -1;
  InNamespace(link.b(), [&] {
    auto l = TcpListen("10.9.0.2", kPort);
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    server = l->fd;
  });
  InNamespace(link.a(), [&] {
    auto c = TcpConnect("10.9.0.2", kPort, 5000);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    client = *c;
  });
  ASSERT_GE(client, 0);
  const int conn = ::accept(server, nullptr, nullptr);
  ASSERT_GE(conn, 0);
  // The server answers every request it reads.
  std::atomic<bool> stop{false};
  std::thread echo([&] {
    char buf[4096];
    while (!stop) {
      pollfd p{conn, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      const ssize_t n = ::recv(conn, buf, sizeof(buf), 0);
      if (n <= 0) break;
      // (An answer takes a while, as a step's compute does.)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      (void)!::send(conn, buf, 8, MSG_NOSIGNAL);
    }
  });
  // A socket that is not connected (the listener) is left out.
  EXPECT_EQ(TcpLossSampler({server}).connections(), 0u);
  EXPECT_EQ(LossySamples(client, 1.5), 0);
  link.set_loss(0.33);
  EXPECT_GT(LossySamples(client, 1.5), 0);
  stop = true;
  ::shutdown(conn, SHUT_RDWR);
  echo.join();
  for (int fd : {client, conn, server}) ::close(fd);
}

}  // namespace
}  // namespace failsafe
