#include "engine/step_timing.h"

#include <algorithm>
#include <climits>

#include "worker/protocol.h"

namespace failsafe {

Status BuildStepTiming(const std::vector<DeviceReply>& replies, int64_t wall_ns,
                       StepTiming* timing) {
  *timing = StepTiming();
  timing->wall_ns = wall_ns;
  std::vector<ForwardStats> stats(replies.size());
  size_t segments = SIZE_MAX;
  for (size_t i = 0; i < replies.size(); ++i) {
    WireReader r(replies[i].body);
    if (!DecodeStats(&r, &stats[i]))
      return Internal("device {}: malformed step reply", replies[i].device);
    segments = std::min(segments, stats[i].segment_cpu_ns.size());
    int64_t cpu = 0, wall = 0;
    for (int64_t ns : stats[i].segment_cpu_ns) cpu += ns;
    for (int64_t ns : stats[i].segment_wall_ns) wall += ns;
    timing->devices.push_back(replies[i].device);
    timing->device_compute_ns.push_back(cpu);
    timing->device_compute_wall_ns.push_back(wall);
    timing->device_attention_flops.push_back(stats[i].attention_flops);
    timing->device_ffn_flops.push_back(stats[i].ffn_flops);
    timing->device_kv_bytes.push_back(stats[i].kv_bytes);
  }
  if (segments == SIZE_MAX) segments = 0;
  for (size_t s = 0; s < segments; ++s) {
    int64_t slowest = 0;
    for (auto& st : stats) slowest = std::max(slowest, st.segment_cpu_ns[s]);
    timing->emulated_ns += slowest;
    timing->segment_max_ns.push_back(slowest);
  }
  return Status::Ok();
}

}  // namespace failsafe
