// Shared memory backed by a memfd: created by one process (the coordinator),
// mapped by others from the file descriptor (passed over a Channel). No names
// in /dev/shm; the memory lives while any process maps it or holds the fd.
#pragma once

#include <cstddef>
#include <string>

#include "common/status.h"

namespace failsafe {

class ShmRegion {
 public:
  // Creates a zero-filled region of `bytes` (rounded up to a page).
  static Result<ShmRegion> Create(const std::string& debug_name, size_t bytes);
  // Maps an existing region from its fd (takes ownership of the fd).
  static Result<ShmRegion> Map(int fd);

  ShmRegion() = default;
  ShmRegion(ShmRegion&& o) noexcept { *this = std::move(o); }
  ShmRegion& operator=(ShmRegion&& o) noexcept;
  ShmRegion(const ShmRegion&) = delete;
  ShmRegion& operator=(const ShmRegion&) = delete;
  ~ShmRegion();

  void* data() const { return data_; }
  size_t size() const { return size_; }
  int fd() const { return fd_; }
  bool valid() const { return data_ != nullptr; }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
  int fd_ = -1;
};

}  // namespace failsafe
