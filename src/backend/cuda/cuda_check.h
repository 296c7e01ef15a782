// Checks on CUDA calls. A failed CUDA call in the backend is a broken
// device: the device process stops (FS_CHECK), and the engine recovers from
// it as from any other failed device.
#pragma once

#include <cuda_runtime.h>

#include "common/check.h"

#define FS_CUDA_CHECK(expr)                                                                \
  do {                                                                                     \
    const cudaError_t fs_cuda_err_ = (expr);                                               \
    FS_CHECK_MSG(fs_cuda_err_ == cudaSuccess, "CUDA error {} ({}) in {}",                  \
                 static_cast<int>(fs_cuda_err_), cudaGetErrorString(fs_cuda_err_), #expr); \
  } while (0)

namespace failsafe::cuda {

// An allocation's result: true where the device is out of memory (that
// error is not sticky, and is cleared), false on success; any other
// failure (a faulted device, whose error is sticky) stops the process as
// FS_CUDA_CHECK does.
inline bool OutOfDeviceMemory(cudaError_t e) {
  if (e == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    return true;
  }
  FS_CUDA_CHECK(e);
  return false;
}

}  // namespace failsafe::cuda
