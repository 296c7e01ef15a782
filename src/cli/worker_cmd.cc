#include "cli/commands.h"
#include "worker/worker_main.h"

namespace failsafe {

CommandFn RegisterWorker(CLI::App& app) {
  auto fd = std::make_shared<int>(3);
  app.add_option("--fd", *fd, "control channel descriptor")->capture_default_str();
  app.group("Internal");  // started by the coordinator
  return [fd] { return RunWorker(*fd); };
}

}  // namespace failsafe
