// A flag in shared memory that any process can raise to abort a collective
// group, and that the group's members can block on (a futex, never a spin).
// Groups whose transport cannot be interrupted from outside (gloo over TCP)
// give each member a watcher thread that waits for it and tears the member's
// connections down, so a pending collective fails at once instead of at its
// timeout. One signal per group (epoch): a raised signal stays raised.
//
// Thread-safety: every method may be called from any thread of any process
// that maps the region.
#pragma once

#include <cstdint>

#include "comm/shm_region.h"
#include "common/status.h"

namespace failsafe {

class AbortSignal {
 public:
  static Result<AbortSignal> Create();
  // Maps a signal from its fd (takes ownership of the fd).
  static Result<AbortSignal> Map(int fd);

  AbortSignal() = default;
  bool valid() const { return region_.valid(); }
  int fd() const { return region_.fd(); }

  void Raise() const;
  bool raised() const;
  // Changes on every Raise and Wake: a waiter reads it, checks its own
  // conditions, then waits for a change (no wake-up is lost in between).
  uint32_t generation() const;
  // Blocks until generation() differs from `seen` (or for at most
  // timeout_ns, if >= 0); returns raised().
  bool WaitChange(uint32_t seen, int64_t timeout_ns = -1) const;
  // Wakes every waiter without raising (a watcher that should stop).
  void Wake() const;

 private:
  ShmRegion region_;
};

}  // namespace failsafe
