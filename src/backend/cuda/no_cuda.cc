// Builds without the CUDA toolkit: the CUDA backend is absent, and asking
// for it is an error the caller reports.
#include "backend/backend.h"

namespace failsafe {

Result<std::unique_ptr<Backend>> MakeCudaBackend(const CudaBackendOptions&) {
  return FailedPrecondition(
      "this build of FailSafe has no CUDA backend (configure it where nvcc is on the PATH)");
}

bool CudaBackendBuilt() { return false; }

}  // namespace failsafe
