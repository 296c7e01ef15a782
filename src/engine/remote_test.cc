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

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <thread>

#include "comm/shm_region.h"
#include "common/clock.h"
#include "common/rng.h"
#include "common/scratch_dir.h"
#include "common/wire.h"
#include "engine/cluster_listener.h"
#include "engine/engine.h"
#include "engine/offline_run.h"
#include "engine/remote_device.h"
#include "engine/test_support.h"
#include "engine/worker_group.h"
#include "model/synthetic.h"
#include "worker/cluster_protocol.h"
#include "worker/protocol.h"
#include "worker/remote_link.h"

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
  pid_t Join(int port, const std::string& token, const std::vector<std::string>& extra = {}) {
    std::vector<std::string> args = {Binary(),
                                     "worker",
                                     "--join",
                                     "127.0.0.1:" + std::to_string(port),
                                     "--cluster-token-file",
                                     TokenFile(token),
                                     "--log-level",
                                     "warn"};
    args.insert(args.end(), extra.begin(), extra.end());
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
  // Devices 2 and 3, killed together, are found dead in one step or (on a
  // loaded machine, one's link closing later) in two: three recoveries or
  // four, every death and the rejoin in them.
  std::set<int> failed;
  int joined = 0;
  for (const RecoveryReport& r : got->recoveries) {
    failed.insert(r.failed_devices.begin(), r.failed_devices.end());
    joined += static_cast<int>(r.joined_devices.size());
  }
  EXPECT_EQ(failed, (std::set<int>{2, 3, 4}));
  EXPECT_EQ(joined, 1);
  EXPECT_GE(got->recoveries.size(), 3u);
  EXPECT_LE(got->recoveries.size(), 4u);
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

// A TCP connection to the listener on loopback, from `source` (any address
// of 127/8 is this host's).
Channel Dial(int port, const char* source = "127.0.0.1") {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in local{};
  local.sin_family = AF_INET;
  ::inet_pton(AF_INET, source, &local.sin_addr);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&local), sizeof(local)), 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  return Channel(fd);
}

ClusterHello MakeHello() {
  ClusterHello hello;
  hello.build_id = ClusterBuildId();
  hello.host = "test";
  hello.pid = 1;
  hello.nonce = NewNonce();
  return hello;
}

// A handshake by hand, proving `token`; returns the refusal, or "" once the
// listener registered the worker (an idle frame came).
Result<std::string> HandJoin(int port, const ClusterHello& hello, const std::string& token) {
  Channel ch = Dial(port);
  const std::string bytes = hello.Encode();
  FS_RETURN_IF_ERROR(ch.Send(static_cast<uint32_t>(LinkOp::kHello), bytes));
  while (true) {
    Message m;
    FS_RETURN_IF_ERROR(ch.Receive(&m, 10000));
    switch (static_cast<LinkOp>(m.type)) {
      case LinkOp::kRefused:
        return m.payload;
      case LinkOp::kIdle:
        return std::string();
      case LinkOp::kChallenge: {
        ClusterChallenge c;
        if (!c.Decode(m.payload)) return Internal("malformed challenge");
        if (c.proof != CoordinatorProof(kToken, bytes, c.nonce)) return Internal("bad proof");
        FS_RETURN_IF_ERROR(
            ch.Send(static_cast<uint32_t>(LinkOp::kProof), WorkerProof(token, bytes, c.nonce)));
        break;
      }
      default:
        return Internal("unexpected frame {}", m.type);
    }
  }
}

TEST(Remote, AnotherProtocolVersionOrBuildIsRefused) {
  auto listener = Listen();
  ClusterHello hello = MakeHello();
  hello.version = kClusterProtocolVersion + 1;
  auto why = HandJoin(listener->port(), hello, kToken);
  ASSERT_TRUE(why.ok()) << why.status().ToString();
  EXPECT_NE(why->find("protocol version " + std::to_string(kClusterProtocolVersion + 1)),
            std::string::npos)
      << *why;
  // Another build is told so once it proved the token, and not before.
  hello = MakeHello();
  hello.build_id = "0123456789abcdef";
  why = HandJoin(listener->port(), hello, "not-the-token");
  ASSERT_TRUE(why.ok()) << why.status().ToString();
  EXPECT_EQ(*why, "wrong cluster token");
  why = HandJoin(listener->port(), hello, kToken);
  ASSERT_TRUE(why.ok()) << why.status().ToString();
  EXPECT_NE(why->find("another build"), std::string::npos) << *why;
  EXPECT_EQ(listener->refused(), 3);
  // The right build and token register.
  why = HandJoin(listener->port(), MakeHello(), kToken);
  ASSERT_TRUE(why.ok()) << why.status().ToString();
  EXPECT_EQ(*why, "");
}

// A coordinator of the test's own on a loopback port.
struct FakeCoordinator {
  FakeCoordinator() {
    fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(::listen(fd, 4), 0);
    socklen_t len = sizeof(addr);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    port = ntohs(addr.sin_port);
  }
  ~FakeCoordinator() { ::close(fd); }
  // The next connection, once it said hello, and a challenge proving
  // `token` sent back; false if any of it failed.
  bool Challenge(const std::string& token, Channel* ch, std::string* hello,
                 ClusterChallenge* challenge) const {
    *ch = Channel(::accept4(fd, nullptr, nullptr, SOCK_CLOEXEC));
    Message m;
    if (!ch->Receive(&m, 20000).ok() || m.type != static_cast<uint32_t>(LinkOp::kHello)) {
      return false;
    }
    *hello = m.payload;
    challenge->nonce = NewNonce();
    challenge->proof = CoordinatorProof(token, *hello, challenge->nonce);
    return ch->Send(static_cast<uint32_t>(LinkOp::kChallenge), challenge->Encode()).ok();
  }
  int fd = -1;
  int port = 0;
};

ClusterWelcome Welcome() {
  ClusterWelcome welcome;
  welcome.device_id = 0;
  welcome.epoch = 7;
  welcome.heartbeat_ms = 100;
  welcome.link_timeout_ms = 1000;
  return welcome;
}

// A worker whose coordinator goes silent without closing the connection (a
// host that vanished, a cut link) exits within the link timeout (with
// --no-rejoin; by default it joins again, next test). On the way the
// worker's side of the handshake is checked: its proof is right, and the
// token is in none of its frames.
TEST(Remote, AWorkerWhoseCoordinatorFallsSilentExits) {
  FakeCoordinator coordinator;
  Workers workers;
  const pid_t pid = workers.Join(coordinator.port, kToken, {"--no-rejoin"});
  Channel ch;
  std::string hello;
  ClusterChallenge challenge;
  ASSERT_TRUE(coordinator.Challenge(kToken, &ch, &hello, &challenge));
  Message m;
  ASSERT_TRUE(ch.Receive(&m, 20000).ok());
  ASSERT_EQ(m.type, static_cast<uint32_t>(LinkOp::kProof));
  EXPECT_EQ(m.payload, WorkerProof(kToken, hello, challenge.nonce));
  EXPECT_EQ(hello.find(kToken), std::string::npos);
  EXPECT_EQ(m.payload.find(kToken), std::string::npos);
  ASSERT_TRUE(ch.Send(static_cast<uint32_t>(LinkOp::kWelcome), Welcome().Encode()).ok());
  const int64_t t0 = MonotonicNanos();
  EXPECT_EQ(workers.WaitExit(pid, 15000), kLinkLostExitCode);
  const int64_t ms = (MonotonicNanos() - t0) / 1000000;
  EXPECT_GE(ms, 900);   // it waited for the timeout ...
  EXPECT_LT(ms, 6000);  // ... and not much longer (generous under load)
}

// By default a worker that lost its link, or was killed, joins again: a new
// hello arrives once the link has timed out, and again after a kill.
TEST(Remote, AWorkerThatLostItsLinkJoinsAgain) {
  FakeCoordinator coordinator;
  Workers workers;
  const pid_t pid = workers.Join(coordinator.port, kToken);
  std::vector<int64_t> pids;
  for (int round = 0; round < 3; ++round) {
    Channel ch;
    std::string hello;
    ClusterChallenge challenge;
    ASSERT_TRUE(coordinator.Challenge(kToken, &ch, &hello, &challenge)) << round;
    auto h = ClusterHello::Decode(hello);
    ASSERT_TRUE(h.ok());
    pids.push_back(h->pid);
    Message m;
    ASSERT_TRUE(ch.Receive(&m, 20000).ok());
    ASSERT_EQ(m.type, static_cast<uint32_t>(LinkOp::kProof));
    ClusterWelcome welcome = Welcome();
    welcome.epoch = 7 + round;
    ASSERT_TRUE(ch.Send(static_cast<uint32_t>(LinkOp::kWelcome), welcome.Encode()).ok());
    // Round 0: silence, the link times out. Round 1: a kill (fault injection).
    if (round == 1) {
      ASSERT_TRUE(ch.Send(static_cast<uint32_t>(LinkOp::kKill), LinkFrame(welcome.epoch, "")).ok());
    }
  }
  // A new worker process each time, under the same supervisor, still running.
  EXPECT_NE(pids[0], pids[1]);
  EXPECT_NE(pids[1], pids[2]);
  EXPECT_EQ(workers.WaitExit(pid, 100), -1);
}

// A coordinator's proxy for a worker over a socket pair, as the tests
// below drive it: the worker's end, the proxy and the coordinator's end.
struct Proxied {
  bool Start(const ClusterWelcome& welcome) {
    auto pair = Channel::Pair();
    if (!pair.ok()) return false;
    worker = std::move(pair->second);
    auto started = RemoteDevice::Start(std::move(pair->first), 0, welcome, "test", "10.0.0.9");
    if (!started.ok()) return false;
    remote = std::move(*started);
    coordinator = remote->TakeLocalEnd();
    return true;
  }
  Channel worker;
  std::unique_ptr<RemoteDevice> remote;
  Channel coordinator;
};

// The coordinator fences a device on another host by closing its link and
// waits for the link's threads; over a lossy link they may be mid-frame (a
// large reply arriving a piece at a time, a request the link holds back).
// Closing stops them at once: neither waits for the frame to complete or for
// its 60 s timeout, and nothing of the frame reaches the coordinator.
TEST(Remote, ClosingALinkMidFrameStopsItAtOnce) {
  ClusterWelcome welcome = Welcome();
  welcome.link_timeout_ms = 120000;  // the link never times out by itself here
  for (const bool sending : {false, true}) {
    SCOPED_TRACE(sending ? "a request held back" : "a reply half-way");
    Proxied link;
    ASSERT_TRUE(link.Start(welcome));
    Channel& worker = link.worker;
    Channel& coordinator = link.coordinator;
    if (sending) {
      // A request larger than the socket's buffers, which the worker never
      // reads: the proxy blocks in its send.
      ASSERT_TRUE(
          coordinator
              .Send(static_cast<uint32_t>(WorkerOp::kStep) | (1u << 8), std::string(32u << 20, 'r'))
              .ok());
    } else {
      // The header of a 1 MiB frame and its first bytes; the rest never comes.
      struct {
        uint32_t type, num_fds;
        uint64_t length;
      } header{static_cast<uint32_t>(LinkOp::kReply), 0, 1u << 20};
      static_assert(sizeof(header) == FrameReader::kHeaderBytes);
      ASSERT_EQ(::write(worker.fd(), &header, sizeof(header)),
                static_cast<ssize_t>(sizeof(header)));
      const std::string some(4096, 'x');
      ASSERT_EQ(::write(worker.fd(), some.data(), some.size()), static_cast<ssize_t>(some.size()));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the proxy is in it
    const int64_t t0 = MonotonicNanos();
    link.remote->Close();
    link.remote.reset();
    const int64_t ms = (MonotonicNanos() - t0) / 1000000;
    EXPECT_LT(ms, 1000);
    // Nothing reached the coordinator, and its end sees the link gone.
    Message m;
    EXPECT_FALSE(coordinator.Receive(&m, 100).ok());
  }
}

// A remote device's heartbeat says how long ago it last moved in any way:
// a sign of life that changes no counter (its backup writer draining, a
// GPU choosing a product's algorithms) dates its move in the coordinator's
// progress slot, as a local device's own writes do, and never moves it
// back; a heartbeat that does not say leaves it alone.
TEST(Remote, HeartbeatsCarryMovesThatCountNothing) {
  ClusterWelcome welcome = Welcome();
  welcome.link_timeout_ms = 120000;
  Proxied link;
  ASSERT_TRUE(link.Start(welcome));
  Channel& worker = link.worker;
  Channel& coordinator = link.coordinator;
  auto logits = ShmRegion::Create("remote-test-logits", 4096);
  auto progress = DeviceProgressRegion::Create(1);
  ASSERT_TRUE(logits.ok() && progress.ok());
  ASSERT_TRUE(coordinator
                  .Send(static_cast<uint32_t>(WorkerOp::kInit) | (1u << 8), "init",
                        {logits->fd(), progress->fd()})
                  .ok());
  // The init forwarded (past the proxy's own heartbeats): it has mapped the
  // regions.
  bool forwarded = false;
  for (const int64_t until = MonotonicNanos() + int64_t{20} * 1000000000;
       !forwarded && MonotonicNanos() < until;) {
    Message m;
    ASSERT_TRUE(worker.Receive(&m, 20000).ok());
    forwarded = m.type == static_cast<uint32_t>(LinkOp::kRequest);
  }
  ASSERT_TRUE(forwarded);
  DeviceProgressSlot* slot = progress->slot(0);
  // requests, entered, left (unchanged), no echo, no loss, no alias, then
  // how long ago it moved (absent: an older worker's heartbeat).
  auto heartbeat = [&](std::optional<int64_t> moved_ago_ns) {
    WireWriter w;
    w.Put<uint64_t>(0);
    w.Put<uint64_t>(0);
    w.Put<uint64_t>(0);
    w.Put<int64_t>(0);
    w.Put<int64_t>(0);
    w.Put<uint32_t>(0);
    w.Put<uint64_t>(0);
    if (moved_ago_ns) w.Put<int64_t>(*moved_ago_ns);
    ASSERT_TRUE(
        worker.Send(static_cast<uint32_t>(LinkOp::kHeartbeat), LinkFrame(welcome.epoch, w.data()))
            .ok());
  };
  // Heard once the proxy has read the frame: until then the slot is as it was.
  auto heard = [&](int64_t before_ns) {
    const int64_t until = MonotonicNanos() + int64_t{20} * 1000000000;
    while (slot->heard_ns.load() <= before_ns && MonotonicNanos() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    return slot->heard_ns.load() > before_ns;
  };
  int64_t t = MonotonicNanos();
  heartbeat(std::nullopt);
  ASSERT_TRUE(heard(t));
  EXPECT_EQ(slot->last_move_ns.load(), 0);
  t = MonotonicNanos();
  heartbeat(int64_t{30} * 1000000);  // moved 30 ms ago
  ASSERT_TRUE(heard(t));
  const int64_t moved = slot->last_move_ns.load();
  EXPECT_LE(moved, MonotonicNanos() - int64_t{30} * 1000000);
  EXPECT_GE(moved, t - int64_t{30} * 1000000);
  t = MonotonicNanos();
  heartbeat(int64_t{1000} * 1000000000);  // an older move: not back
  ASSERT_TRUE(heard(t));
  EXPECT_EQ(slot->last_move_ns.load(), moved);
  t = MonotonicNanos();
  heartbeat(-1);  // never moved
  ASSERT_TRUE(heard(t));
  EXPECT_EQ(slot->last_move_ns.load(), moved);
  link.remote->Close();
}

// A worker does not prove itself to (or take requests from) a coordinator
// that cannot prove the token first.
TEST(Remote, AWorkerRefusesACoordinatorWithoutTheToken) {
  FakeCoordinator coordinator;
  Workers workers;
  const pid_t pid = workers.Join(coordinator.port, kToken);
  Channel ch;
  std::string hello;
  ClusterChallenge challenge;
  ASSERT_TRUE(coordinator.Challenge("a guess", &ch, &hello, &challenge));
  EXPECT_EQ(workers.WaitExit(pid, 15000), 1);
  Message m;
  // It said why and closed, without a proof.
  ASSERT_TRUE(ch.Receive(&m, 5000).ok());
  EXPECT_EQ(m.type, static_cast<uint32_t>(LinkOp::kRefused));
  EXPECT_EQ(ch.Receive(&m, 5000).code(), StatusCode::kUnavailable);
}

int64_t PeakRssKiB() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::atoll(line.c_str() + 6);
  }
  return -1;
}

// Strangers on another address flood the cluster port while a real worker
// joins: connections that never speak, headers claiming 8 GiB, hellos that
// never prove the token, proofs of a wrong token. The listener's memory stays
// flat, and the worker gets its device id at once.
TEST(Remote, StrangersCannotMakeTheListenerAllocateOrKeepAWorkerOut) {
  auto listener = Listen();
  const int port = listener->port();
  const int64_t rss_before = PeakRssKiB();
  std::atomic<bool> stop{false};
  std::atomic<int> sent{0};
  std::thread flood([&] {
    std::vector<Channel> idle;
    for (int i = 0; !stop.load(); ++i) {
      Channel ch = Dial(port, "127.0.0.2");
      switch (i % 4) {
        case 0:  // silent
          break;
        case 1: {  // a header claiming 8 GiB
          const uint64_t header[2] = {static_cast<uint32_t>(LinkOp::kHello), 8ull << 30};
          (void)!::send(ch.fd(), header, sizeof(header), MSG_NOSIGNAL);
          break;
        }
        case 2:  // a hello, then silence
          (void)ch.Send(static_cast<uint32_t>(LinkOp::kHello), MakeHello().Encode());
          break;
        case 3: {  // a proof of a wrong token
          (void)ch.Send(static_cast<uint32_t>(LinkOp::kHello), MakeHello().Encode());
          Message m;
          if (ch.Receive(&m, 2000, kMaxHandshakeFrame).ok()) {
            (void)ch.Send(static_cast<uint32_t>(LinkOp::kProof), std::string(kProofBytes, 'x'));
          }
          break;
        }
      }
      idle.push_back(std::move(ch));
      if (idle.size() > 400) idle.erase(idle.begin(), idle.begin() + 200);
      sent.fetch_add(1);
      ::usleep(2000);
    }
  });
  while (sent.load() < 100) ::usleep(10000);
  Workers workers;
  const int64_t t0 = MonotonicNanos();
  workers.Join(port, kToken);
  auto dev = listener->Take(0, 30000);
  const double join_s = (MonotonicNanos() - t0) / 1e9;
  // The flood goes on a while after the join.
  while (sent.load() < 400) ::usleep(10000);
  stop = true;
  flood.join();
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  const int64_t grown_kib = PeakRssKiB() - rss_before;
  std::printf(
      "%d connections from strangers: %d dropped, %d refused; peak memory +%lld KiB; "
      "the worker joined in %.2f s\n",
      sent.load(), listener->dropped(), listener->refused(), static_cast<long long>(grown_kib),
      join_s);
  // The worker process starts and joins in well under this, flood or not.
  EXPECT_LT(join_s, 10.0);
  EXPECT_GT(listener->dropped(), 200);
  EXPECT_LT(grown_kib, 16 * 1024);
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
