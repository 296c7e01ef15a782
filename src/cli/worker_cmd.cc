#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <thread>

#include "cli/commands.h"
#include "common/clock.h"
#include "common/log.h"
#include "worker/cluster_protocol.h"
#include "worker/remote_link.h"
#include "worker/worker_main.h"

namespace failsafe {

namespace {

volatile sig_atomic_t g_stop = 0;
volatile pid_t g_child = -1;

void StopSupervisor(int) {
  g_stop = 1;
  if (g_child > 0) ::kill(g_child, SIGTERM);
}

// Runs the joined worker in a child process, and another each time one
// loses its coordinator (kLinkLostExitCode: the link fell silent, or the
// coordinator could not be reached) or is killed, after a backoff from 250 ms
// doubling to 5 s (afresh after a minute alive). A refusal, or a worker the
// coordinator shut down, ends it with the worker's exit code. The child dies
// with this process.
int SuperviseJoinedWorker(const JoinedWorkerOptions& o) {
  struct sigaction sa {};
  sa.sa_handler = StopSupervisor;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGINT, &sa, nullptr);
  const pid_t self = ::getpid();
  int64_t backoff_ms = 250;
  while (!g_stop) {
    const int64_t started = MonotonicNanos();
    const pid_t child = ::fork();
    if (child < 0) {
      FS_LOG_ERROR("fork: {}", std::strerror(errno));
      return 1;
    }
    if (child == 0) {
      ::signal(SIGTERM, SIG_DFL);
      ::signal(SIGINT, SIG_DFL);
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != self) ::_exit(1);  // the supervisor died already
      std::fflush(stderr);
      ::_exit(RunJoinedWorker(o));
    }
    g_child = child;
    int status = 0;
    while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
    }
    g_child = -1;
    if (g_stop) break;
    std::string why;
    if (WIFEXITED(status)) {
      if (WEXITSTATUS(status) != kLinkLostExitCode) return WEXITSTATUS(status);
      why = "lost its coordinator";
    } else {
      why = fmt::format("was killed by signal {}", WTERMSIG(status));
    }
    if (MonotonicNanos() - started > 60'000'000'000LL) backoff_ms = 250;
    FS_LOG_WARN("the worker {}; joining {} again in {} ms", why, o.coordinator, backoff_ms);
    for (int64_t slept = 0; slept < backoff_ms && !g_stop; slept += 50) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    backoff_ms = std::min<int64_t>(2 * backoff_ms, 5000);
  }
  return 0;
}

}  // namespace

CommandFn RegisterWorker(CLI::App& app) {
  struct Flags {
    int fd = 3;
    std::string join, token_file, model, advertise;
    bool rejoin = true;
  };
  auto f = std::make_shared<Flags>();
  app.add_option("--fd", f->fd, "control channel descriptor (a worker the coordinator started)")
      ->capture_default_str();
  app.add_option("--join", f->join,
                 "HOST:PORT of a coordinator started with --listen: run a device on this host "
                 "and join it over TCP");
  app.add_option("--cluster-token-file", f->token_file,
                 "file whose first line is the cluster token (default: $FAILSAFE_CLUSTER_TOKEN)");
  app.add_option("--model", f->model,
                 "the model's directory on this host (default: the coordinator's path)");
  app.add_option("--advertise", f->advertise,
                 "the address other devices reach this one at for collectives (default: this "
                 "host's address on the route to the coordinator)");
  app.add_flag("--rejoin,!--no-rejoin", f->rejoin,
               "with --join: when the link to the coordinator is lost (or this worker is "
               "killed), join again, retrying until the coordinator can be reached; a refusal "
               "still ends it")
      ->capture_default_str();
  return [f]() -> int {
    if (f->join.empty()) return RunWorker(f->fd);
    auto token = ReadClusterToken(f->token_file);
    if (!token.ok()) {
      FS_LOG_ERROR("{}", token.status().message());
      return 2;
    }
    JoinedWorkerOptions o;
    o.coordinator = f->join;
    o.token = *token;
    o.model_dir = f->model;
    o.advertise = f->advertise;
    return f->rejoin ? SuperviseJoinedWorker(o) : RunJoinedWorker(o);
  };
}

}  // namespace failsafe
