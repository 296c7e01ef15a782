// Devices on other hosts, on loopback: workers started as `failsafe worker
// --join` register over TCP, serve steps beside local worker processes with
// the same tokens as one device, die for real (SIGKILL) mid-stream without
// changing a token, and are refused when their token or protocol is wrong.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <map>

#include "common/clock.h"
#include "common/rng.h"
#include "common/scratch_dir.h"
#include "engine/cluster_listener.h"
#include "engine/engine.h"
#include "engine/offline_run.h"
#include "engine/test_support.h"
#include "engine/worker_group.h"
#include "model/synthetic.h"
#include "worker/cluster_protocol.h"

extern char** environ;

namespace failsafe {
namespace {

constexpr char kToken[] = "remote-test-token";

std::string Binary() { return TestBinary(); }

const std::string& Model() { return TestModelDir("tiny-llama", 21); }

// Written once per token: a worker may be reading it while another starts.
std::string TokenFile(const std::string& token) {
  static std::map<std::string, std::string> files;
  auto it = files.find(token);
  if (it != files.end()) return it->second;
  const std::string path = ProcessScratchDir().Sub("token-" + std::to_string(files.size()));
  std::ofstream(path) << token << "\n";
  return files[token] = path;
}

// Worker processes this test starts; killed and reaped at the end.
class Workers {
 public:
  ~Workers() {
    for (pid_t p : pids_) {
      ::kill(p, SIGKILL);
      ::waitpid(p, nullptr, 0);
    }
  }
  pid_t Join(int port, const std::string& token) {
    std::vector<std::string> args = {Binary(),
                                     "worker",
                                     "--join",
                                     "127.0.0.1:" + std::to_string(port),
                                     "--cluster-token-file",
                                     TokenFile(token),
                                     "--log-level",
                                     "warn"};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = -1;
    EXPECT_EQ(::posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ), 0);
    pids_.push_back(pid);
    return pid;
  }
  // The exit status of `pid` within `timeout_ms`, or -1.
  int WaitExit(pid_t pid, int64_t timeout_ms) {
    const int64_t end = MonotonicNanos() + timeout_ms * 1000000;
    while (MonotonicNanos() < end) {
      int status = 0;
      if (::waitpid(pid, &status, WNOHANG) == pid) {
        std::erase(pids_, pid);
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      ::usleep(20000);
    }
    return -1;
  }

 private:
  std::vector<pid_t> pids_;
};

std::shared_ptr<ClusterListener> Listen() {
  ClusterListenerOptions o;
  o.host = "127.0.0.1";
  o.token = kToken;
  auto l = ClusterListener::Start(o);
  EXPECT_TRUE(l.ok()) << l.status().ToString();
  return *l;
}

Workload MakeWorkload(int n, uint64_t seed) {
  Workload w;
  Rng rng(seed);
  for (int i = 0; i < n; ++i) {
    w.requests.push_back(
        {0.0005 * i, 4 + static_cast<int>(rng.Below(120)), 4 + static_cast<int>(rng.Below(30))});
  }
  return w;
}

struct Setup {
  int devices = 1;
  int remote = 0;
  int spare = 0;  // extra joined workers, for rejoins
};

Result<RunSummary> RunGroup(const Setup& s, const Workload& w,
                            const std::vector<FaultEvent>& faults) {
  Workers workers;
  WorkerGroupOptions o;
  o.model_dir = Model();
  o.worker_binary = Binary();
  o.num_devices = s.devices;
  o.backup_bytes = 64 << 20;
  o.max_step_tokens = 128;
  o.max_logits_rows = 64;
  o.max_seqs = 64;
  o.step_timeout_ms = 600000;
  o.collective_timeout_ms = 10000;
  o.log_level = "warn";
  if (s.remote > 0) {
    o.listener = Listen();
    o.remote_devices = s.remote;
    o.join_timeout_ms = 120000;  // generous under load
    for (int i = 0; i < s.remote + s.spare; ++i) workers.Join(o.listener->port(), kToken);
  }
  FS_ASSIGN_OR_RETURN(auto group, WorkerGroup::Start(o));
  // A rejoin takes only a worker already waiting: let the spares register.
  const int64_t until = MonotonicNanos() + 30000 * 1000000LL;
  while (s.spare > 0 && o.listener->waiting() < s.spare && MonotonicNanos() < until) {
    ::usleep(10000);
  }
  SchedulerConfig sc;
  sc.max_batch_tokens = 128;
  sc.max_num_seqs = 64;
  sc.max_model_len = 1024;
  EngineOptions eo;
  eo.recovery = RecoveryMode::kFull;
  Engine engine(group.get(), sc, eo);
  OfflineRunOptions ro;
  ro.faults = faults;
  ro.sample_every = 2;
  return RunOffline(engine, w, ro);
}

const RunSummary& OneDevice(const Workload& w, uint64_t key) {
  static std::map<uint64_t, RunSummary> cache;
  if (!cache.count(key)) {
    auto r = RunGroup({}, w, {});
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    cache[key] = *r;
  }
  return cache[key];
}

void ExpectSame(const RunSummary& got, const RunSummary& want, int n) {
  EXPECT_EQ(got.requests_completed, n);
  EXPECT_EQ(got.requests_failed, 0) << got.failure;
  EXPECT_EQ(got.output_tokens, want.output_tokens);
  EXPECT_EQ(got.output_digest, want.output_digest);
}

TEST(Remote, LocalAndJoinedDevicesGiveTheTokensOfOneDevice) {
  Workload w = MakeWorkload(10, 4);
  const RunSummary& want = OneDevice(w, 4);
  auto got = RunGroup({4, 2, 0}, w, {});
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ExpectSame(*got, want, 10);
  // Every device remote: the coordinator computes nothing itself.
  auto all = RunGroup({3, 3, 0}, w, {});
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  ExpectSame(*all, want, 10);
}

// A remote worker SIGKILLed mid-stream, then (its "host" lost) both remote
// devices at once, then a worker waiting to join takes a dead one's place.
TEST(Remote, KilledRemoteWorkersAndAWholeHostChangeNoToken) {
  Workload w = MakeWorkload(12, 5);
  const RunSummary& want = OneDevice(w, 5);
  auto got = RunGroup({5, 3, 1}, w,
                      {{false, 4, 5, -1}, {false, 2, 9, -1}, {false, 3, 9, -1}, {true, 4, 14, -1}});
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ExpectSame(*got, want, 12);
  EXPECT_EQ(got->recoveries.size(), 3u);
}

TEST(Remote, AWrongTokenIsRefusedOnBothSides) {
  auto listener = Listen();
  Workers workers;
  const pid_t pid = workers.Join(listener->port(), "not-the-token");
  EXPECT_EQ(workers.WaitExit(pid, 20000), 1);
  EXPECT_EQ(listener->refused(), 1);
  EXPECT_EQ(listener->waiting(), 0);
  // The right token registers.
  workers.Join(listener->port(), kToken);
  auto dev = listener->Take(0, 20000);
  EXPECT_TRUE(dev.ok()) << dev.status().ToString();
}

// A raw hello of another protocol version or another build.
Status Hello(int port, const ClusterHello& hello, std::string* refusal) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return Unavailable("connect failed");
  }
  Channel ch(fd);
  FS_RETURN_IF_ERROR(ch.Send(static_cast<uint32_t>(LinkOp::kHello), hello.Encode()));
  Message m;
  FS_RETURN_IF_ERROR(ch.Receive(&m, 10000));
  if (m.type != static_cast<uint32_t>(LinkOp::kRefused)) return Internal("not refused");
  *refusal = m.payload;
  return Status::Ok();
}

TEST(Remote, AnotherProtocolVersionOrBuildIsRefused) {
  auto listener = Listen();
  ClusterHello hello;
  hello.build_id = ClusterBuildId();
  hello.token = kToken;
  hello.version = kClusterProtocolVersion + 1;
  std::string why;
  ASSERT_TRUE(Hello(listener->port(), hello, &why).ok());
  EXPECT_NE(why.find("protocol version " + std::to_string(kClusterProtocolVersion + 1)),
            std::string::npos)
      << why;
  hello.version = kClusterProtocolVersion;
  hello.build_id = "0123456789abcdef";
  ASSERT_TRUE(Hello(listener->port(), hello, &why).ok());
  EXPECT_NE(why.find("another build"), std::string::npos) << why;
  EXPECT_EQ(listener->refused(), 2);
}

// A worker whose coordinator goes silent without closing the connection (a
// host that vanished, a cut link) exits within the link timeout.
TEST(Remote, AWorkerWhoseCoordinatorFallsSilentExits) {
  // A coordinator that welcomes the worker and then says nothing.
  const int lfd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(lfd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(lfd, 4), 0);
  socklen_t len = sizeof(addr);
  ::getsockname(lfd, reinterpret_cast<sockaddr*>(&addr), &len);
  Workers workers;
  const pid_t pid = workers.Join(ntohs(addr.sin_port), kToken);
  Channel ch(::accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC));
  ::close(lfd);
  Message m;
  ASSERT_TRUE(ch.Receive(&m, 20000).ok());
  ASSERT_EQ(m.type, static_cast<uint32_t>(LinkOp::kHello));
  ClusterWelcome welcome;
  welcome.device_id = 0;
  welcome.epoch = 7;
  welcome.heartbeat_ms = 100;
  welcome.link_timeout_ms = 1000;
  ASSERT_TRUE(ch.Send(static_cast<uint32_t>(LinkOp::kWelcome), welcome.Encode()).ok());
  const int64_t t0 = MonotonicNanos();
  EXPECT_EQ(workers.WaitExit(pid, 15000), 1);
  const int64_t ms = (MonotonicNanos() - t0) / 1000000;
  EXPECT_GE(ms, 900);   // it waited for the timeout ...
  EXPECT_LT(ms, 6000);  // ... and not much longer (generous under load)
}

TEST(Remote, TokensCompareWhole) {
  EXPECT_TRUE(TokensEqual("abc", "abc"));
  EXPECT_FALSE(TokensEqual("abc", "abd"));
  EXPECT_FALSE(TokensEqual("abc", "abcd"));
  EXPECT_FALSE(TokensEqual("", "a"));
  EXPECT_TRUE(ParseHostPort("10.0.0.1:1234").ok());
  EXPECT_FALSE(ParseHostPort("10.0.0.1").ok());
  EXPECT_FALSE(ParseHostPort("h:99999").ok());
}

}  // namespace
}  // namespace failsafe
