// SIGTERM and SIGINT for the long-running commands (serve, router): the main
// thread blocks until one comes, whatever the other threads are doing.
#pragma once

#include <cstdint>
#include <functional>

#include "common/status.h"

namespace failsafe {

// Installs the handlers; call once, before the signals matter.
Status InstallSignalPipe();
// Blocks until a signal (or a value given to PostSignal) arrives; returns it.
int WaitForSignal();
// Wakes WaitForSignal with `value` (async-signal-safe).
void PostSignal(int value);

// What a drain thread posts when it is over.
constexpr int kDrained = 0x7f;

// Blocks until SIGTERM or SIGINT, then runs drain(timeout in ms) on a thread
// of its own, so that a second signal runs `stop` at once (which must cut
// the drain short). Returns what `drain` returned (requests cut short).
int DrainOnSignal(double drain_timeout_s, const std::function<int(int64_t)>& drain,
                  const std::function<void()>& stop);

}  // namespace failsafe
