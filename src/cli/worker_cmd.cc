#include "cli/commands.h"
#include "common/log.h"
#include "worker/cluster_protocol.h"
#include "worker/worker_main.h"

namespace failsafe {

CommandFn RegisterWorker(CLI::App& app) {
  struct Flags {
    int fd = 3;
    std::string join, token_file, model, advertise;
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
    return RunJoinedWorker(o);
  };
}

}  // namespace failsafe
