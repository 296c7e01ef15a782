// The seeded draw every backend samples with, from candidates already
// sorted by logit (descending, equal logits by ascending id): temperature,
// then min-p and top-p over the first `keep` (top-k), then one draw from a hash of
// (seed, counter). The sums run in one order on the host, so a backend that
// sorts on its device draws the CPU backend's token exactly.
#pragma once

#include <cstdint>
#include <limits>

#include "backend/backend.h"

namespace failsafe {

// What every backend ranks a logit by: a NaN (a broken model's) as -inf, so
// that it is never chosen over a number, the order is a strict one (a sort
// by raw logits with NaNs in it is undefined), and every backend agrees.
inline float SampleKey(float logit) {
  return logit == logit ? logit : -std::numeric_limits<float>::infinity();
}

// logits[i] is the logit of ids[i], i < keep (keep >= 1).
int DrawSorted(const float* logits, const int* ids, int keep, const SamplingParams& p,
               uint64_t counter);

}  // namespace failsafe
