#include "backend/peer_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

namespace failsafe {

namespace {

constexpr uint32_t kMagic = 0x4d504653;  // "FSPM"
constexpr size_t kBootIdChars = sizeof(PeerHandleHead::boot_id);

struct Handle {
  PeerHandleHead head;
  uint64_t dev;
  uint64_t ino;
  char share[FdShare::kMaxNameChars];
};

}  // namespace

const std::string& HostBootId() {
  static const std::string id = [] {
    std::ifstream in("/proc/sys/kernel/random/boot_id");
    std::string s;
    std::getline(in, s);
    return s.size() == kBootIdChars ? s : std::string();
  }();
  return id;
}

Result<PeerHandleHead> MakePeerHandleHead(uint32_t magic, uint64_t bytes) {
  if (HostBootId().size() != kBootIdChars)
    return Unavailable("this host does not say which boot it is");
  PeerHandleHead h{};
  h.magic = magic;
  std::memcpy(h.boot_id, HostBootId().data(), kBootIdChars);
  h.bytes = bytes;
  return h;
}

Status CheckPeerHandleHead(const PeerHandleHead& h, size_t bytes) {
  if (HostBootId().size() != kBootIdChars ||
      std::memcmp(h.boot_id, HostBootId().data(), kBootIdChars) != 0) {
    return Unavailable("peer memory of another host");
  }
  if (h.bytes < bytes)
    return InvalidArgument("peer memory of {} bytes, {} asked for", h.bytes, bytes);
  return Status::Ok();
}

std::string ShareName(const char (&field)[FdShare::kMaxNameChars]) {
  return std::string(field, ::strnlen(field, sizeof(field)));
}

void SetShareName(char (&field)[FdShare::kMaxNameChars], const std::string& name) {
  std::memset(field, 0, sizeof(field));
  std::memcpy(field, name.data(), std::min(name.size(), sizeof(field)));
}

Result<HostPeerMemory> AllocateHostPeerMemory(size_t bytes) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t size = (std::max<size_t>(bytes, 1) + page - 1) / page * page;
  // Peers fetch it from this process's share, never by inheritance.
  int fd = ::memfd_create("failsafe-peer", MFD_CLOEXEC);
  if (fd < 0) return Internal("memfd_create: {}", std::strerror(errno));
  struct stat st;
  if (::ftruncate(fd, static_cast<off_t>(size)) != 0 || ::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    return Internal("peer memory of {} bytes: {}", size, std::strerror(e));
  }
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    const int e = errno;
    ::close(fd);
    return Internal("mmap of peer memory: {}", std::strerror(e));
  }
  auto share = FdShare::Serve(fd);
  ::close(fd);  // the share holds its own, and the mapping the memory
  auto head = MakePeerHandleHead(kMagic, size);
  if (!share.ok() || !head.ok()) {
    ::munmap(p, size);
    return share.ok() ? head.status() : share.status();
  }
  Handle h{};
  h.head = *head;
  h.dev = static_cast<uint64_t>(st.st_dev);
  h.ino = static_cast<uint64_t>(st.st_ino);
  SetShareName(h.share, (*share)->name());
  HostPeerMemory m;
  m.data = p;
  m.bytes = size;
  m.share = std::move(*share);
  m.handle.assign(reinterpret_cast<const char*>(&h), sizeof(h));
  return m;
}

void FreeHostPeerMemory(HostPeerMemory& m) {
  m.share.reset();
  if (m.data) ::munmap(m.data, m.bytes);
  m = HostPeerMemory();
}

Result<void*> OpenHostPeerMemory(const std::string& handle, size_t bytes) {
  Handle h;
  if (handle.size() != sizeof(h)) return InvalidArgument("not a host peer-memory handle");
  std::memcpy(&h, handle.data(), sizeof(h));
  if (h.head.magic != kMagic) return InvalidArgument("not a host peer-memory handle");
  FS_RETURN_IF_ERROR(CheckPeerHandleHead(h.head, bytes));
  const std::string name = ShareName(h.share);
  FS_ASSIGN_OR_RETURN(const int fd, FetchSharedFd(name));
  struct stat st;
  if (::fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_dev) != h.dev ||
      static_cast<uint64_t>(st.st_ino) != h.ino) {
    ::close(fd);
    return Unavailable("{} no longer shares the peer's memory", name);
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int e = errno;
  ::close(fd);  // the mapping keeps the memory
  if (p == MAP_FAILED) return Internal("mmap of {}'s memory: {}", name, std::strerror(e));
  return p;
}

void CloseHostPeerMemory(void* p, size_t bytes) {
  if (p) ::munmap(p, bytes);
}

}  // namespace failsafe
