// Blocking on a 32-bit word in memory that other processes may map (the
// collective groups' and the abort signal's generation counters): a waiter
// sleeps in the kernel instead of spinning.
//
// Thread-safety: both calls may be made from any thread of any process.
#pragma once

#include <atomic>
#include <cstdint>

namespace failsafe {

// Sleeps while *word == expected, until a wake-up or for at most timeout_ns
// nanoseconds (< 0: no limit). May return early (a spurious wake-up, a
// signal): callers re-check their condition in a loop.
void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, int64_t timeout_ns = -1);

// Wakes every thread sleeping on `word`, in any process.
void FutexWakeAll(std::atomic<uint32_t>* word);

}  // namespace failsafe
