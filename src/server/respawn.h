// When to start a dead device again (`serve --respawn`, on by default).
//
// A device found dead (killed, crashed, fenced for a hang, its link lost) is
// started again after a backoff: backoff_ms after its first death, doubling
// with each death or failed start that follows, up to max_backoff_ms, and
// back to backoff_ms once it has stayed alive for a crash-loop window. A
// device that died or failed to start more than crash_loop_limit times
// within crash_loop_window_ms is crash-looping: it is not started again
// until an operator restores it by hand (which clears its record). A device
// on another host can only come back when a worker has joined to be it; its
// attempts while none has do not count as failures.
//
// Thread-safety: none; the engine thread owns it.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

namespace failsafe {

struct RespawnOptions {
  bool enabled = false;
  int64_t backoff_ms = 250;
  int64_t max_backoff_ms = 30000;
  int crash_loop_limit = 5;
  int64_t crash_loop_window_ms = 60000;
};

// What /admin/status and /metrics show per device.
struct RespawnRecord {
  int deaths = 0;         // found dead, since start
  int respawns = 0;       // started again, since start
  int failed_starts = 0;  // starts that failed, since start
  bool pending = false;   // dead, and a start is due at next_ns
  int64_t next_ns = 0;
  bool crash_looping = false;  // given up on until restored by hand
  std::string last_error;      // of the last failed start
};

class RespawnPolicy {
 public:
  RespawnPolicy(const RespawnOptions& options, int num_devices);

  // The devices alive at now_ns: a device alive before and not now died.
  void Observe(const std::vector<int>& alive, int64_t now_ns);
  // Devices whose start is due.
  std::vector<int> Due(int64_t now_ns) const;
  // The earliest due start, or -1 if none is pending.
  int64_t NextDueNs() const;
  void Started(int device, int64_t now_ns);
  // `counts`: false for a remote device no worker has joined to be yet.
  void StartFailed(int device, const std::string& why, bool counts, int64_t now_ns);
  // Started or failed by hand: the record of deaths and the backoff restart.
  void Reset(int device, bool alive, int64_t now_ns);

  const RespawnRecord& record(int device) const { return devices_[device].record; }
  bool enabled() const { return options_.enabled; }

 private:
  struct Device {
    RespawnRecord record;
    bool alive = true;
    int64_t alive_since_ns = 0;
    int64_t backoff_ns = 0;
    std::deque<int64_t> failures;  // deaths and failed starts, within the window
  };
  // A death or a failed start at now_ns: the next start, or crash-looping.
  void Failure(Device& d, int device, int64_t now_ns);

  RespawnOptions options_;
  std::vector<Device> devices_;
};

}  // namespace failsafe
