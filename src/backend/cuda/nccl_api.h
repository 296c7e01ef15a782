// The NCCL calls FailSafe makes (nccl_group.cc), as a table of entry
// points: NCCL's own, loaded at run time, or over the emulated GPU an
// emulation of them between processes (emulation/nccl.cc).
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

namespace failsafe::cuda {

struct NcclApi {
  ncclResult_t (*GetVersion)(int* version);
  ncclResult_t (*GetUniqueId)(ncclUniqueId* id);
  ncclResult_t (*CommInitRankConfig)(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank,
                                     ncclConfig_t* config);
  ncclResult_t (*CommGetAsyncError)(ncclComm_t comm, ncclResult_t* error);
  ncclResult_t (*CommAbort)(ncclComm_t comm);
  ncclResult_t (*AllReduce)(const void* send, void* recv, size_t count, ncclDataType_t type,
                            ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
  ncclResult_t (*AllGather)(const void* send, void* recv, size_t count, ncclDataType_t type,
                            ncclComm_t comm, cudaStream_t stream);
  const char* (*GetErrorString)(ncclResult_t result);
  const char* (*GetLastError)(ncclComm_t comm);
  // Null where the library has none (NCCL older than 2.28, 2.27).
  ncclResult_t (*CommRevoke)(ncclComm_t comm, int flags);
  ncclResult_t (*CommShrink)(ncclComm_t comm, int* excluded, int count, ncclComm_t* newcomm,
                             ncclConfig_t* config, int flags);
};

#ifdef FAILSAFE_CUDA_EMULATION
// The emulation's (emulation/nccl.cc).
const NcclApi* EmulatedNccl();
#endif

}  // namespace failsafe::cuda
