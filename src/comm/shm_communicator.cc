#include "comm/shm_communicator.h"

#include <algorithm>
#include <cstring>

#include "comm/futex.h"
#include "common/check.h"
#include "common/clock.h"
#include "common/ordered_sums.h"

namespace failsafe {

namespace {

constexpr uint64_t kMagic = 0x4653434f4d4d3031ULL;  // "FSCOMM01"

}  // namespace

struct ShmCommunicator::Header {
  uint64_t magic;
  uint32_t members;
  uint32_t reserved;
  uint64_t slot_bytes;
  alignas(64) std::atomic<uint32_t> aborted;
  alignas(64) std::atomic<uint32_t> arrived;
  alignas(64) std::atomic<uint32_t> generation;
};

static constexpr size_t kHeaderBytes = 256;

Result<ShmRegion> ShmCommunicator::CreateRegion(int members, size_t slot_bytes) {
  if (members < 1) return InvalidArgument("a group needs at least one member");
  slot_bytes = (slot_bytes + 63) / 64 * 64;
  // header | 2 buffers x members slots | result area
  const size_t bytes = kHeaderBytes + (2 * static_cast<size_t>(members) + 1) * slot_bytes;
  FS_ASSIGN_OR_RETURN(ShmRegion r, ShmRegion::Create("failsafe-comm", bytes));
  auto* h = new (r.data()) Header();
  h->magic = kMagic;
  h->members = static_cast<uint32_t>(members);
  h->slot_bytes = slot_bytes;
  h->aborted.store(0);
  h->arrived.store(0);
  h->generation.store(0);
  return r;
}

void ShmCommunicator::AbortRegion(const ShmRegion& region) {
  auto* h = static_cast<Header*>(region.data());
  h->aborted.store(1, std::memory_order_release);
  h->generation.fetch_add(1, std::memory_order_acq_rel);
  FutexWakeAll(&h->generation);
}

bool ShmCommunicator::IsAborted(const ShmRegion& region) {
  return static_cast<Header*>(region.data())->aborted.load(std::memory_order_acquire) != 0;
}

ShmCommunicator::ShmCommunicator(ShmRegion region, int rank, int64_t timeout_ms)
    : region_(std::move(region)), rank_(rank), timeout_ms_(timeout_ms) {
  static_assert(sizeof(Header) <= kHeaderBytes);
  FS_CHECK(header()->magic == kMagic);
  size_ = static_cast<int>(header()->members);
  slot_bytes_ = header()->slot_bytes;
  FS_CHECK(rank_ >= 0 && rank_ < size_);
}

char* ShmCommunicator::Slot(int buffer, int member) const {
  return static_cast<char*>(region_.data()) + kHeaderBytes +
         (static_cast<size_t>(buffer) * size_ + static_cast<size_t>(member)) * slot_bytes_;
}

float* ShmCommunicator::ResultArea() const {
  return reinterpret_cast<float*>(static_cast<char*>(region_.data()) + kHeaderBytes +
                                  2 * static_cast<size_t>(size_) * slot_bytes_);
}

Status ShmCommunicator::Barrier() {
  Header* h = header();
  if (h->aborted.load(std::memory_order_acquire)) return Aborted("collective group was aborted");
  const uint32_t gen = h->generation.load(std::memory_order_acquire);
  if (h->arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == static_cast<uint32_t>(size_)) {
    h->arrived.store(0, std::memory_order_relaxed);
    h->generation.fetch_add(1, std::memory_order_acq_rel);
    FutexWakeAll(&h->generation);
  } else {
    const int64_t deadline = MonotonicNanos() + timeout_ms_ * 1000000;
    while (h->generation.load(std::memory_order_acquire) == gen) {
      const int64_t left = deadline - MonotonicNanos();
      if (left <= 0) {
        AbortRegion(region_);
        return DeadlineExceeded("collective did not complete within {} ms", timeout_ms_);
      }
      FutexWait(&h->generation, gen, left);
    }
  }
  if (h->aborted.load(std::memory_order_acquire)) return Aborted("collective group was aborted");
  return Status::Ok();
}

Status ShmCommunicator::Await(const std::function<Result<bool>()>& done) {
  return PollUntil(
      done, timeout_ms_, [this] { return IsAborted(region_); }, [this] { AbortRegion(region_); });
}

Status ShmCommunicator::AllReduceSum(float* data, size_t count) { return Reduce(data, count); }

Status ShmCommunicator::AllReduceSum(int64_t* data, size_t count) { return Reduce(data, count); }

template <typename T>
Status ShmCommunicator::Reduce(T* data, size_t count) {
  if (size_ == 1)
    return header()->aborted.load() ? Aborted("collective group was aborted") : Status::Ok();
  if (count * sizeof(T) * size_ > kScatterThresholdBytes &&
      count >= static_cast<size_t>(size_) * 16) {
    return ReduceScatterGather(data, count);
  }
  return ReduceDirect(data, count);
}

template <typename T>
Status ShmCommunicator::ReduceDirect(T* data, size_t count) {
  const size_t chunk = slot_bytes_ / sizeof(T);
  const T* slots[64];
  FS_CHECK(size_ <= 64);
  for (size_t off = 0; off < count; off += chunk) {
    const size_t n = std::min(chunk, count - off);
    const int buf = static_cast<int>(ops_++ & 1);
    std::memcpy(Slot(buf, rank_), data + off, n * sizeof(T));
    FS_RETURN_IF_ERROR(Barrier());
    for (int m = 0; m < size_; ++m) slots[m] = reinterpret_cast<const T*>(Slot(buf, m));
    SumInOrder(slots, size_, 0, n, data + off);
  }
  return Status::Ok();
}

template <typename T>
Status ShmCommunicator::ReduceScatterGather(T* data, size_t count) {
  const size_t chunk = slot_bytes_ / sizeof(T);
  const T* slots[64];
  FS_CHECK(size_ <= 64);
  T* result = reinterpret_cast<T*>(ResultArea());
  for (size_t off = 0; off < count; off += chunk) {
    const size_t n = std::min(chunk, count - off);
    const int buf = static_cast<int>(ops_++ & 1);
    std::memcpy(Slot(buf, rank_), data + off, n * sizeof(T));
    FS_RETURN_IF_ERROR(Barrier());
    size_t b, e;
    ScatterPiece<T>(n, size_, rank_, &b, &e);
    for (int m = 0; m < size_; ++m) slots[m] = reinterpret_cast<const T*>(Slot(buf, m));
    SumInOrder(slots, size_, b, e, result);
    FS_RETURN_IF_ERROR(Barrier());
    std::memcpy(data + off, result, n * sizeof(T));
  }
  return Status::Ok();
}

Status ShmCommunicator::AllGather(const void* send, size_t bytes, void* recv) {
  auto* out = static_cast<char*>(recv);
  const auto* in = static_cast<const char*>(send);
  for (size_t off = 0; off < bytes || (bytes == 0 && off == 0); off += slot_bytes_) {
    const size_t n = std::min(slot_bytes_, bytes - off);
    const int buf = static_cast<int>(ops_++ & 1);
    if (n) std::memcpy(Slot(buf, rank_), in + off, n);
    FS_RETURN_IF_ERROR(Barrier());
    for (int m = 0; m < size_; ++m) {
      if (n) std::memcpy(out + static_cast<size_t>(m) * bytes + off, Slot(buf, m), n);
    }
    if (bytes == 0) break;
  }
  return Status::Ok();
}

}  // namespace failsafe
