#include <cstring>

#include "comm/communicator.h"

namespace failsafe {

Status LocalCommunicator::AllGather(const void* send, size_t bytes, void* recv) {
  if (recv != send) std::memmove(recv, send, bytes);
  return Status::Ok();
}

}  // namespace failsafe
