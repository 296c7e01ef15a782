#include "comm/abort_signal.h"

#include <atomic>
#include <new>

#include "comm/futex.h"
#include "common/clock.h"

namespace failsafe {

namespace {

constexpr uint64_t kMagic = 0x4653414252543031ULL;  // "FSABRT01"

struct Header {
  uint64_t magic;
  alignas(64) std::atomic<uint32_t> raised;
  std::atomic<uint32_t> generation;  // the futex word
};

}  // namespace

Result<AbortSignal> AbortSignal::Create() {
  AbortSignal s;
  FS_ASSIGN_OR_RETURN(s.region_, ShmRegion::Create("failsafe-abort", sizeof(Header)));
  auto* h = new (s.region_.data()) Header();
  h->magic = kMagic;
  h->raised.store(0);
  h->generation.store(0);
  return s;
}

Result<AbortSignal> AbortSignal::Map(int fd) {
  AbortSignal s;
  FS_ASSIGN_OR_RETURN(s.region_, ShmRegion::Map(fd));
  if (s.region_.size() < sizeof(Header) ||
      static_cast<const Header*>(s.region_.data())->magic != kMagic) {
    return InvalidArgument("not an abort signal region");
  }
  return s;
}

void AbortSignal::Raise() const {
  auto* h = static_cast<Header*>(region_.data());
  h->raised.store(1);
  h->generation.fetch_add(1);
  FutexWakeAll(&h->generation);
}

bool AbortSignal::raised() const {
  return static_cast<const Header*>(region_.data())->raised.load() != 0;
}

uint32_t AbortSignal::generation() const {
  return static_cast<const Header*>(region_.data())->generation.load();
}

bool AbortSignal::WaitChange(uint32_t seen, int64_t timeout_ns) const {
  auto* h = static_cast<Header*>(region_.data());
  const int64_t until = timeout_ns >= 0 ? MonotonicNanos() + timeout_ns : 0;
  while (h->generation.load() == seen) {
    if (timeout_ns < 0) {
      FutexWait(&h->generation, seen);
      continue;
    }
    const int64_t left = until - MonotonicNanos();
    if (left <= 0) break;
    FutexWait(&h->generation, seen, left);
  }
  return raised();
}

void AbortSignal::Wake() const {
  auto* h = static_cast<Header*>(region_.data());
  h->generation.fetch_add(1);
  FutexWakeAll(&h->generation);
}

}  // namespace failsafe
