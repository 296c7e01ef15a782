#include "backend/sampling.h"

#include <cmath>
#include <vector>

#include "common/rng.h"

namespace failsafe {

int DrawSorted(const float* logits, const int* ids, int keep, const SamplingParams& p,
               uint64_t counter) {
  thread_local std::vector<double> prob;
  prob.resize(keep);
  const double inv_t = 1.0 / p.temperature;
  const double mx = logits[0];
  double sum = 0;
  for (int i = 0; i < keep; ++i) {
    prob[i] = std::exp((logits[i] - mx) * inv_t);
    sum += prob[i];
  }
  if (p.min_p > 0.0f) {
    // prob[0] is the most likely token's (exp(0) = 1).
    int n = 1;
    while (n < keep && prob[n] >= p.min_p) ++n;
    keep = n;
    sum = 0;
    for (int i = 0; i < keep; ++i) sum += prob[i];
  }
  if (p.top_p < 1.0f) {
    double cum = 0;
    int n = 0;
    while (n < keep) {
      cum += prob[n] / sum;
      ++n;
      if (cum >= p.top_p) break;
    }
    keep = n;
    sum = 0;
    for (int i = 0; i < keep; ++i) sum += prob[i];
  }
  double u = ToUnitDouble(HashCombine(p.seed, counter)) * sum;
  for (int i = 0; i < keep; ++i) {
    u -= prob[i];
    if (u < 0) return ids[i];
  }
  return ids[keep - 1];
}

}  // namespace failsafe
