// Timing: what a step cost, per device and in total, from the devices' own
// measurements (their step replies).
#pragma once

#include <cstdint>
#include <vector>

#include "engine/executor.h"
#include "engine/reply_collector.h"

namespace failsafe {

// Fills `timing` from every active device's step reply (bodies of
// ForwardStats) and the step's wall time.
Status BuildStepTiming(const std::vector<DeviceReply>& replies, int64_t wall_ns,
                       StepTiming* timing);

}  // namespace failsafe
