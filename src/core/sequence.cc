#include "core/sequence.h"

namespace failsafe {

const char* FinishReasonName(FinishReason r) {
  switch (r) {
    case FinishReason::kNone:
      return "none";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kAborted:
      return "abort";
    case FinishReason::kError:
      return "error";
  }
  return "?";
}

}  // namespace failsafe
