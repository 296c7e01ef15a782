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

// A memfd of `bytes` mapped here, shared by an FdShare; the handle names
// the share, and the memfd's inode (checked on open). A peer's mapping
// keeps the memory when this process dies.
struct HostPeerMemory {
  void* data = nullptr;
  size_t bytes = 0;
  int fd = -1;
  std::unique_ptr<FdShare> share;
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
