// The main loop of a worker process: one device. It serves requests from the
// coordinator on `control_fd` until told to shut down or the coordinator goes
// away, and returns the process exit code.
#pragma once

namespace failsafe {

int RunWorker(int control_fd);

}  // namespace failsafe
