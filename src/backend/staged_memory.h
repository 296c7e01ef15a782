// Host memory that a DeviceMemory user must treat as device memory the host
// does not address (host_memory() false), as a GPU's: what the device model
// and ItemMatrix do for a GPU (items staged on the host, then copied in),
// run on the CPU by tests and benchmarks. Copies are memcpy.
//
// With an arena, allocations are handed out from it in turn, its pages
// touched up front (device memory costs the host no page faults), and taken
// back all at once (Reset); without one, each is operator new's.
#pragma once

#include <cstring>
#include <new>
#include <vector>

#include "backend/backend.h"

namespace failsafe {

class StagedMemory final : public DeviceMemory {
 public:
  explicit StagedMemory(size_t arena_bytes = 0) : arena_(arena_bytes, 1) {}
  void Reset() { used_ = 0; }

  bool host_memory() const override { return false; }
  void* Allocate(size_t bytes) override {
    if (arena_.empty()) return ::operator new(bytes);
    const size_t at = used_;
    used_ += (bytes + 255) / 256 * 256;
    if (used_ > arena_.size()) throw std::bad_alloc();
    return arena_.data() + at;
  }
  void Free(void* p, size_t) override {
    if (arena_.empty()) ::operator delete(p);
  }
  void CopyToDevice(void* dst, const void* src, size_t bytes) override {
    std::memcpy(dst, src, bytes);
  }
  void CopyToHost(void* dst, const void* src, size_t bytes) override {
    std::memcpy(dst, src, bytes);
  }
  void CopyToHost2D(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                    size_t rows) override {
    for (size_t r = 0; r < rows; ++r)
      std::memcpy(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(src) + r * spitch,
                  width);
  }
  void CopyOnDevice(void* dst, const void* src, size_t bytes) override {
    std::memcpy(dst, src, bytes);
  }
  void SetZero(void* dst, size_t bytes) override { std::memset(dst, 0, bytes); }
  void BackgroundCopyToHost(void* dst, const void* src, size_t bytes) override {
    std::memcpy(dst, src, bytes);
  }
  void BackgroundCopyToDevice(void* dst, const void* src, size_t bytes) override {
    std::memcpy(dst, src, bytes);
  }
  void Synchronize() override {}

 private:
  std::vector<unsigned char> arena_;
  size_t used_ = 0;
};

}  // namespace failsafe
