// Messaging: waiting for the replies of many devices at once.
//
// A collection polls every pending device's channel and pidfd and blocks in
// poll(2) until something happens or the watch wants to look again: a reply
// is taken (a stale one, to an abandoned request, is dropped), a process
// that exited or a channel that broke means a dead device, and at the times
// the watch asks for, the watch decides which late devices are hung.
//
// Thread-safety: one thread drives a collection.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "engine/device_process.h"

namespace failsafe {

struct DeviceReply {
  int device = -1;
  Status status;  // the device's answer
  std::string body;
};

// A device a watch declares dead.
struct Verdict {
  int device = -1;
  std::string reason;
  int64_t failed_ns = 0;  // its last sign of life (MonotonicNanos), 0: unknown
  bool link = false;      // its link to the coordinator failed, not the device
};

class ReplyWatch {
 public:
  virtual ~ReplyWatch() = default;
  // When to call Check next (MonotonicNanos).
  virtual int64_t next_check_ns() const = 0;
  // Once next_check_ns has passed: which of the pending devices are dead.
  virtual std::vector<Verdict> Check(int64_t now_ns, const std::vector<int>& pending,
                                     const std::vector<int>& replied) = 0;
  // A device answered with a failure of its own (not an abort): its peers
  // must not wait for it in a collective.
  virtual void OnFailedReply(int device) {}
};

// Called for each device found dead during a collection.
using DeathHandler = std::function<void(const Verdict&)>;

// One reply from each listed device, in the order they came. Devices found
// dead (and declared so through `on_death`) have none.
std::vector<DeviceReply> CollectReplies(const std::vector<std::pair<int, DeviceProcess*>>& devices,
                                        ReplyWatch& watch, const DeathHandler& on_death);

}  // namespace failsafe
