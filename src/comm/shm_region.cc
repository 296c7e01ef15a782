#include "comm/shm_region.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace failsafe {

Result<ShmRegion> ShmRegion::Create(const std::string& debug_name, size_t bytes) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  bytes = (std::max<size_t>(bytes, 1) + page - 1) / page * page;
  int fd = ::memfd_create(debug_name.c_str(), MFD_CLOEXEC);
  if (fd < 0) return Internal("memfd_create({}): {}", debug_name, std::strerror(errno));
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    int e = errno;
    ::close(fd);
    return Internal("ftruncate({} bytes): {}", bytes, std::strerror(e));
  }
  return Map(fd);
}

Result<ShmRegion> ShmRegion::Map(int fd) {
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    return Internal("fstat on shared memory fd: {}", std::strerror(e));
  }
  void* p =
      ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    int e = errno;
    ::close(fd);
    return Internal("mmap of shared memory: {}", std::strerror(e));
  }
  ShmRegion r;
  r.data_ = p;
  r.size_ = static_cast<size_t>(st.st_size);
  r.fd_ = fd;
  return r;
}

ShmRegion& ShmRegion::operator=(ShmRegion&& o) noexcept {
  if (this != &o) {
    this->~ShmRegion();
    data_ = o.data_;
    size_ = o.size_;
    fd_ = o.fd_;
    o.data_ = nullptr;
    o.size_ = 0;
    o.fd_ = -1;
  }
  return *this;
}

ShmRegion::~ShmRegion() {
  if (data_) ::munmap(data_, size_);
  if (fd_ >= 0) ::close(fd_);
  data_ = nullptr;
  fd_ = -1;
}

}  // namespace failsafe
