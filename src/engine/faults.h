// Failure injection for offline runs: when to kill which device (for real,
// SIGKILL) and when to take it back.
//
// Specs (repeatable --fail):
//   device=3@step=40   kill device 3 during step 40
//   device=3@t=2.5s    kill device 3 once the emulated clock passes 2.5 s
//   rejoin=3@t=6s      start a new process for device 3 and take it back
//   rejoin=3@step=90
//   trace=FILE         availability events "ms,add|remove,node" (the
//                      availability traces' format); node names map to
//                      device ids (numbers as they are, others in order of
//                      first appearance)
#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace failsafe {

struct FaultEvent {
  bool rejoin = false;  // false: kill
  int device = 0;
  int at_step = -1;  // >= 0: at this step
  double at_s = -1;  // >= 0: at this emulated time
};

// Parses specs and checks them against `num_devices`: a device that does not
// exist, a rejoin of a live device or a kill of a dead one is an error.
Result<std::vector<FaultEvent>> ParseFaults(const std::vector<std::string>& specs, int num_devices,
                                            double time_scale = 1.0);

// A seeded chaos schedule: every `step_gap` steps on average, kill a random
// live device (keeping at least `min_alive`) or bring a dead one back; at the
// end every dead device rejoins.
std::vector<FaultEvent> ChaosSchedule(uint64_t seed, int num_devices, int min_alive, int events,
                                      int step_gap);

}  // namespace failsafe
