#include "server/respawn.h"

#include <algorithm>

#include "common/log.h"

namespace failsafe {

RespawnPolicy::RespawnPolicy(const RespawnOptions& options, int num_devices)
    : options_(options), devices_(num_devices) {
  for (Device& d : devices_) d.backoff_ns = options_.backoff_ms * 1000000;
}

void RespawnPolicy::Observe(const std::vector<int>& alive, int64_t now_ns) {
  const int64_t window_ns = options_.crash_loop_window_ms * 1000000;
  for (size_t i = 0; i < devices_.size(); ++i) {
    Device& d = devices_[i];
    const bool now_alive = std::count(alive.begin(), alive.end(), static_cast<int>(i)) > 0;
    if (d.alive && !now_alive) {
      ++d.record.deaths;
      Failure(d, static_cast<int>(i), now_ns);
    }
    if (now_alive && !d.alive) {
      // Back by other means (an operator's restore).
      d.record.pending = false;
      d.alive_since_ns = now_ns;
    }
    d.alive = now_alive;
    // Alive a whole window: the next death starts the backoff afresh.
    if (d.alive && now_ns - d.alive_since_ns >= window_ns) {
      d.backoff_ns = options_.backoff_ms * 1000000;
    }
  }
}

void RespawnPolicy::Failure(Device& d, int device, int64_t now_ns) {
  const int64_t window_ns = options_.crash_loop_window_ms * 1000000;
  d.failures.push_back(now_ns);
  while (!d.failures.empty() && now_ns - d.failures.front() > window_ns) d.failures.pop_front();
  if (static_cast<int>(d.failures.size()) > options_.crash_loop_limit) {
    if (!d.record.crash_looping) {
      FS_LOG_ERROR(
          "device {} died or failed to start {} times within {} s: crash-looping, not started "
          "again until restored by hand",
          device, d.failures.size(), options_.crash_loop_window_ms / 1000);
    }
    d.record.crash_looping = true;
    d.record.pending = false;
    return;
  }
  if (!options_.enabled || d.record.crash_looping) return;
  d.record.pending = true;
  d.record.next_ns = now_ns + d.backoff_ns;
  d.backoff_ns = std::min(2 * d.backoff_ns, options_.max_backoff_ms * 1000000);
}

std::vector<int> RespawnPolicy::Due(int64_t now_ns) const {
  std::vector<int> out;
  for (size_t i = 0; i < devices_.size(); ++i) {
    const RespawnRecord& r = devices_[i].record;
    if (r.pending && !devices_[i].alive && now_ns >= r.next_ns) out.push_back(static_cast<int>(i));
  }
  return out;
}

int64_t RespawnPolicy::NextDueNs() const {
  int64_t next = -1;
  for (const Device& d : devices_) {
    if (d.record.pending && !d.alive && (next < 0 || d.record.next_ns < next)) {
      next = d.record.next_ns;
    }
  }
  return next;
}

void RespawnPolicy::Started(int device, int64_t now_ns) {
  Device& d = devices_[device];
  ++d.record.respawns;
  d.record.pending = false;
  d.record.last_error.clear();
  d.alive = true;
  d.alive_since_ns = now_ns;
}

void RespawnPolicy::StartFailed(int device, const std::string& why, bool counts, int64_t now_ns) {
  Device& d = devices_[device];
  d.record.last_error = why;
  if (!counts) {
    // Nothing to start it with yet (or its link is still being measured):
    // look again after the shortest backoff.
    if (options_.enabled && !d.record.crash_looping) d.record.pending = true;
    d.record.next_ns = now_ns + options_.backoff_ms * 1000000;
    return;
  }
  ++d.record.failed_starts;
  Failure(d, device, now_ns);
}

void RespawnPolicy::Reset(int device, bool alive, int64_t now_ns) {
  Device& d = devices_[device];
  d.failures.clear();
  d.backoff_ns = options_.backoff_ms * 1000000;
  d.record.crash_looping = false;
  d.record.pending = false;
  d.record.last_error.clear();
  d.alive = alive;
  d.alive_since_ns = now_ns;
}

}  // namespace failsafe
