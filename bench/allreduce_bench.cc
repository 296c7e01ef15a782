// All-reduce latency and bandwidth for hidden-size payloads, 2 to 8 member
// processes, shared memory and gloo (TCP loopback). Prints a table.
//
//   failsafe_bench_allreduce [--hidden 2048] [--tokens 1,16,128,1024] [--members 2,3,4,5,6,7,8]
//       [--netns NS=ADDR,NS=ADDR,...]
//   failsafe_bench_allreduce --await [--await-us 20,100,500,2000]
//
// With --await, instead: how late Communicator::Await (the wait of each
// collective of a device library, worker/device_group_reducer.h) returns
// after what it waits for is done, another thread marking it done after
// each of the given delays.
//
// With --netns, gloo member r runs in network namespace r mod k of the list
// (created beforehand, e.g. by tests/python/netns_cluster.py --bench) and is
// dialled at its address there; the rendezvous store runs in the first.
#include <fcntl.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "comm/gloo_communicator.h"
#include "comm/kv_store.h"
#include "comm/shm_communicator.h"
#include "common/clock.h"

using namespace failsafe;

namespace {

struct Timing {
  double median_us = 0;
  double p90_us = 0;
};

// Runs `iters` all-reduces of `count` floats in every member; member 0 times
// them between barriers and writes the result into `out_fd`.
int Member(Communicator& comm, size_t count, int iters, int out_fd) {
  std::vector<float> v(count, 1.0f);
  std::vector<double> us;
  for (int i = 0; i < iters + 3; ++i) {
    if (!comm.Barrier().ok()) return 1;
    int64_t t0 = MonotonicNanos();
    if (!comm.AllReduceSum(v.data(), count).ok()) return 2;
    if (i >= 3) us.push_back((MonotonicNanos() - t0) / 1e3);
    std::fill(v.begin(), v.end(), 1.0f);
  }
  if (comm.rank() == 0) {
    std::sort(us.begin(), us.end());
    Timing r{us[us.size() / 2], us[us.size() * 9 / 10]};
    if (::write(out_fd, &r, sizeof(r)) != sizeof(r)) return 3;
  }
  return 0;
}

Timing RunShm(int n, size_t count, int iters) {
  auto region = ShmCommunicator::CreateRegion(n, std::max<size_t>(count * 4, 4096));
  int pipefd[2];
  if (!region.ok() || ::pipe(pipefd) != 0) return {};
  const int fd = region->fd();
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    pid_t pid = ::fork();
    if (pid == 0) {
      ShmCommunicator comm(std::move(ShmRegion::Map(::dup(fd))).value(), r, 60000);
      ::_exit(Member(comm, count, iters, pipefd[1]));
    }
    pids.push_back(pid);
  }
  Timing res;
  if (::read(pipefd[0], &res, sizeof(res)) != sizeof(res)) res = {};
  for (pid_t p : pids) ::waitpid(p, nullptr, 0);
  ::close(pipefd[0]);
  ::close(pipefd[1]);
  return res;
}

// Network namespaces (name, this process's address there) for gloo members.
std::vector<std::pair<std::string, std::string>> g_netns;

// Moves the calling (single-threaded) process into a namespace of g_netns.
bool EnterNetns(size_t i) {
  const int fd = ::open(("/run/netns/" + g_netns[i].first).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = ::setns(fd, CLONE_NEWNET) == 0;
  ::close(fd);
  return ok;
}

Timing RunGloo(int n, size_t count, int iters, int epoch) {
  int pipefd[2], portfd[2];
  if (::pipe(pipefd) != 0 || ::pipe(portfd) != 0) return {};
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    pid_t pid = ::fork();
    if (pid == 0) {
      int port = 0;
      if (::read(portfd[0], &port, sizeof(port)) != sizeof(port)) ::_exit(4);
      GlooGroupOptions o;
      if (!g_netns.empty()) {
        if (!EnterNetns(r % g_netns.size())) ::_exit(6);
        o.hostname = g_netns[r % g_netns.size()].second;
        o.store_host = g_netns[0].second;
      }
      o.store_port = port;
      o.prefix = "bench" + std::to_string(epoch);
      o.rank = r;
      o.size = n;
      auto comm = GlooCommunicator::Connect(o);
      if (!comm.ok()) ::_exit(5);
      ::_exit(Member(**comm, count, iters, pipefd[1]));
    }
    pids.push_back(pid);
  }
  auto server = KvStoreServer::Start(g_netns.empty() ? "127.0.0.1" : g_netns[0].second, 0);
  int port = server.ok() ? (*server)->port() : 0;
  for (int r = 0; r < n; ++r) {
    if (::write(portfd[1], &port, sizeof(port)) != sizeof(port)) break;
  }
  Timing res;
  if (::read(pipefd[0], &res, sizeof(res)) != sizeof(res)) res = {};
  for (pid_t p : pids) ::waitpid(p, nullptr, 0);
  for (int fd : {pipefd[0], pipefd[1], portfd[0], portfd[1]}) ::close(fd);
  return res;
}

// Await's lateness: another thread marks the wait's work done `delay_us`
// after the wait began; the time from that mark to Await's return.
void RunAwait(const std::vector<int>& delays_us) {
  std::printf("Communicator::Await: from the work's end to the wait's return, median (p90) us\n");
  LocalCommunicator comm;
  for (int delay : delays_us) {
    std::vector<double> late;
    const int iters = delay >= 1000 ? 100 : 300;
    for (int i = 0; i < iters; ++i) {
      std::atomic<int64_t> done_at{0};
      const int64_t start = MonotonicNanos();
      std::thread marker([&] {
        while (MonotonicNanos() - start < delay * int64_t{1000}) {
        }
        done_at.store(MonotonicNanos(), std::memory_order_release);
      });
      const Status st = comm.Await(
          [&]() -> Result<bool> { return done_at.load(std::memory_order_acquire) != 0; });
      const int64_t back = MonotonicNanos();
      marker.join();
      if (!st.ok()) return;
      late.push_back((back - done_at.load()) / 1e3);
    }
    std::sort(late.begin(), late.end());
    std::printf("  done after %5d us: %8.1f (%8.1f)\n", delay, late[late.size() / 2],
                late[late.size() * 9 / 10]);
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"FailSafe all-reduce benchmark"};
  int hidden = 2048;
  std::vector<int> tokens = {1, 16, 128, 1024};
  std::vector<int> members = {2, 3, 4, 5, 6, 7, 8};
  app.add_option("--hidden", hidden, "hidden size (floats per token)")->capture_default_str();
  app.add_option("--tokens", tokens, "tokens per all-reduce")->delimiter(',');
  app.add_option("--members", members, "group sizes")->delimiter(',');
  std::vector<std::string> netns;
  app.add_option("--netns", netns,
                 "gloo members across network namespaces NS=ADDR (member r in the r mod k-th)")
      ->delimiter(',');
  bool await = false;
  std::vector<int> await_us = {20, 100, 500, 2000};
  app.add_flag("--await", await, "time Communicator::Await's lateness instead");
  app.add_option("--await-us", await_us, "with --await: delays until the work is done")
      ->delimiter(',');
  CLI11_PARSE(app, argc, argv);
  if (await) {
    RunAwait(await_us);
    return 0;
  }
  for (const std::string& spec : netns) {
    const size_t eq = spec.find('=');
    if (eq == std::string::npos) {
      std::fprintf(stderr, "--netns: '%s' is not NS=ADDR\n", spec.c_str());
      return 2;
    }
    g_netns.emplace_back(spec.substr(0, eq), spec.substr(eq + 1));
  }
  // The store (and this process) in the first namespace.
  if (!g_netns.empty() && !EnterNetns(0)) {
    std::fprintf(stderr, "--netns: cannot enter %s (root needed)\n", g_netns[0].first.c_str());
    return 2;
  }
  if (!g_netns.empty()) {
    std::printf("gloo members across %zu network namespaces (veth); shm within one host\n",
                g_netns.size());
  }
  std::printf(
      "all-reduce of [tokens, %d] fp32; median (p90) latency per call; bandwidth = payload / "
      "median\n",
      hidden);
  std::printf("%-5s %7s %10s | %22s %10s | %22s %10s\n", "n", "tokens", "payload", "shm latency us",
              "shm GB/s", "gloo latency us", "gloo GB/s");
  int epoch = 0;
  for (int n : members) {
    for (int t : tokens) {
      const size_t count = static_cast<size_t>(t) * hidden;
      const int iters = count < 100000 ? 200 : 30;
      Timing s = RunShm(n, count, iters);
      Timing g = RunGloo(n, count, iters, epoch++);
      const double bytes = count * 4.0;
      std::printf("%-5d %7d %8.0fKB | %12.1f (%7.1f) %10.2f | %12.1f (%7.1f) %10.2f\n", n, t,
                  bytes / 1024, s.median_us, s.p90_us, bytes / (s.median_us * 1e3), g.median_us,
                  g.p90_us, bytes / (g.median_us * 1e3));
      std::fflush(stdout);
    }
  }
  return 0;
}
