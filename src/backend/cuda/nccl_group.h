// Collectives between GPUs by NCCL (Backend::DeviceGroup), loaded at run
// time: a program built here runs where NCCL is missing (its groups then
// stage through the host or read peer memory), and uses the machine's own
// NCCL where there is one (FAILSAFE_NCCL_LIBRARY names the file, else
// libnccl.so.2 on the library path). FAILSAFE_NCCL=0 turns it off.
//
// Communicators are nonblocking (ncclConfig_t.blocking = 0): no call waits
// for a peer. An operation is on the compute stream (Enqueued) once
// ncclCommGetAsyncError no longer says ncclInProgress: the next may start,
// and work that reads its result be queued, without waiting for the GPU.
// A join, or the operations started, are finished once that is so and an
// event recorded after the last on the compute stream has completed; the
// caller polls that (Done) under its group's deadline and abort, and ends
// a group whose peer died or hangs with ncclCommAbort (never
// ncclCommDestroy, which can wait for the dead peer).
//
// Where NCCL has ncclCommRevoke and ncclCommShrink (2.28 and later), a
// group whose operation failed is revoked rather than aborted (its
// operations end, its communicator stays), and the survivors' next group
// is shrunk from it (DeviceGroup::Shrink): no new id, no bootstrap through
// member 0's socket. NCCL publishes the shrunk communicator from its own
// thread as the shrink's join ends, so the new group owns the parent and
// the slot NCCL writes until then; the parent is aborted (never destroyed)
// once the new group has joined, or, where the join fails, before the new
// communicator (its abort ends the shrink's join). FAILSAFE_NCCL_SHRINK=0
// turns shrinking off (a new id every time).
//
// A group whose join is abandoned (a member died or failed before it
// finished) leaves, in the member that made its id, NCCL's bootstrap root
// thread waiting for the members that never came: NCCL has no call that
// ends it (one thread and one listening socket per such failure).
//
// Over the emulated GPU (emulation/), the same code runs against an
// emulation of these NCCL calls between processes (emulation/nccl.cc).
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <string>

#include "backend/backend.h"

namespace failsafe::cuda {

// FAILSAFE_NCCL_APART=1: each device process joins as if on a host of its
// own (NCCL_HOSTID), so that members sharing one GPU may form a group, over
// NCCL's network transport: a test of NCCL's joins, operations and aborts
// on a machine with one GPU, never a deployment's setting.
bool NcclApart();

// Sets NCCL's environment before any thread reads it (CudaBackend::Init):
// every connection made when a group forms; with NcclApart, the settings
// for hosts apart on one host.
void PrepareNcclEnvironment();

// Whether NCCL is loaded (loading it at the first call); where not, why.
bool NcclLoaded(std::string* why);

// A new group id (ncclGetUniqueId's bytes).
Result<std::string> NewNcclGroupId();

// Starts joining group `id` as `rank` of `size` on the current GPU, `gpu`
// (a shrink of the group binds to it again); its operations go on `stream`.
Result<std::unique_ptr<Backend::DeviceGroup>> JoinNcclGroup(const std::string& id, int rank,
                                                            int size, cudaStream_t stream, int gpu);

}  // namespace failsafe::cuda
