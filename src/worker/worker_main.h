// The main loop of a worker process: one device. It serves requests from the
// coordinator on `control_fd` until told to shut down or the coordinator goes
// away, and returns the process exit code.
#pragma once

#include <string>

namespace failsafe {

int RunWorker(int control_fd);

// A device on another host: joins the coordinator at `coordinator` (HOST:PORT)
// over TCP and serves it until it shuts the device down (exit code 0) or goes
// away (1). A refusal (wrong token, another build) is logged and exits 1.
struct JoinedWorkerOptions {
  std::string coordinator;
  std::string token;
  std::string model_dir;  // the model on this host; empty: the coordinator's path
  std::string advertise;  // the address gloo peers dial; empty: the route to the coordinator
};
int RunJoinedWorker(const JoinedWorkerOptions& options);

}  // namespace failsafe
