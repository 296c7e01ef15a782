// Host memory as a backend's device memory (backend.h: HostMemory).
#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <new>

#include "backend/backend.h"

namespace failsafe {
namespace {

constexpr size_t kHugePage = 2u << 20;

class HostMemoryImpl final : public DeviceMemory {
 public:
  bool host_memory() const override { return true; }

  // Large buffers (weights, the KV pool) are mapped lazily with transparent
  // huge pages: decode streams every weight byte each step, and 4 KiB pages
  // would cost TLB misses; a KV pool sized for the worst case commits only
  // what is written.
  void* Allocate(size_t bytes) override {
    bytes = std::max<size_t>(bytes, 1);
    if (bytes >= kHugePage) {
      void* p = ::mmap(nullptr, Mapped(bytes), PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (p == MAP_FAILED) throw std::bad_alloc();
      ::madvise(p, Mapped(bytes), MADV_HUGEPAGE);
      return p;
    }
    void* p = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
    if (!p) throw std::bad_alloc();
    return p;
  }
  void Free(void* p, size_t bytes) override {
    if (!p) return;
    bytes = std::max<size_t>(bytes, 1);
    if (bytes >= kHugePage) {
      ::munmap(p, Mapped(bytes));
    } else {
      std::free(p);
    }
  }
  void CopyToDevice(void* dst, const void* src, size_t bytes) override {
    if (bytes) std::memmove(dst, src, bytes);
  }
  void CopyToHost(void* dst, const void* src, size_t bytes) override {
    if (bytes) std::memmove(dst, src, bytes);
  }
  void CopyToHost2D(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                    size_t rows) override {
    for (size_t r = 0; r < rows; ++r) {
      std::memcpy(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(src) + r * spitch,
                  width);
    }
  }
  void CopyOnDevice(void* dst, const void* src, size_t bytes) override {
    if (bytes) std::memmove(dst, src, bytes);
  }
  void SetZero(void* dst, size_t bytes) override {
    if (bytes) std::memset(dst, 0, bytes);
  }
  void BackgroundCopyToHost(void* dst, const void* src, size_t bytes) override {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void BackgroundCopyToDevice(void* dst, const void* src, size_t bytes) override {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void Synchronize() override {}

 private:
  static size_t Mapped(size_t bytes) { return (bytes + kHugePage - 1) / kHugePage * kHugePage; }
};

}  // namespace

DeviceMemory& HostMemory() {
  static HostMemoryImpl memory;
  return memory;
}

}  // namespace failsafe
