// Host memory that other processes of this host map by a handle
// (Backend::AllocatePeerMemory on the CPU backend), and the host's
// identity that both the CPU and the CUDA backend put in their handles, so
// that a handle from another host is refused rather than misread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/fd_share.h"
#include "common/status.h"

namespace failsafe {

// This boot of this host: /proc/sys/kernel/random/boot_id (36 characters),
// or an empty string where the system does not say.
const std::string& HostBootId();

// What every peer-memory handle (a backend's kind of it) begins with.
struct PeerHandleHead {
  uint32_t magic;    // the kind
  char boot_id[36];  // HostBootId() of the owner's host
  uint64_t bytes;    // the allocation's
};
// A head for this host; an error where the host does not say its boot.
Result<PeerHandleHead> MakePeerHandleHead(uint32_t magic, uint64_t bytes);
// Whether a peer of this host may open `h` for `bytes`: an error for
// another host's or a smaller allocation.
Status CheckPeerHandleHead(const PeerHandleHead& h, size_t bytes);
// The FdShare name a handle carries (NUL-padded), and back.
std::string ShareName(const char (&field)[FdShare::kMaxNameChars]);
void SetShareName(char (&field)[FdShare::kMaxNameChars], const std::string& name);

// A memfd of `bytes` mapped here, shared by an FdShare; the handle names
// the share, and the memfd's inode (checked on open). A peer's mapping
// keeps the memory when this process dies.
struct HostPeerMemory {
  void* data = nullptr;
  size_t bytes = 0;
  std::unique_ptr<FdShare> share;  // holds the memfd
  std::string handle;
};
Result<HostPeerMemory> AllocateHostPeerMemory(size_t bytes);
void FreeHostPeerMemory(HostPeerMemory& m);
// Another process's memory by its handle (the memfd fetched from its
// share, checked to be the same inode on the same host), mapped
// read-write; unmapped by CloseHostPeerMemory(p, bytes).
Result<void*> OpenHostPeerMemory(const std::string& handle, size_t bytes);
void CloseHostPeerMemory(void* p, size_t bytes);

}  // namespace failsafe
