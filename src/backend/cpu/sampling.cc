#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "backend/cpu/kernels.h"
#include "backend/sampling.h"

namespace failsafe::cpu {

int Sample(const float* logits, int vocab, const SamplingParams& p, uint64_t counter) {
  if (vocab <= 0) return -1;
  if (p.temperature <= 0.0f || p.top_k == 1) {
    int best = 0;
    float best_key = SampleKey(logits[0]);
    for (int i = 1; i < vocab; ++i) {
      const float key = SampleKey(logits[i]);
      if (key > best_key) {  // lowest id wins ties
        best = i;
        best_key = key;
      }
    }
    return best;
  }
  // Candidates sorted by logit, descending; ties by id.
  thread_local std::vector<int> idx;
  idx.resize(vocab);
  std::iota(idx.begin(), idx.end(), 0);
  auto cmp = [&](int a, int b) {
    const float ka = SampleKey(logits[a]), kb = SampleKey(logits[b]);
    return ka != kb ? ka > kb : a < b;
  };
  int keep = vocab;
  if (p.top_k > 0 && p.top_k < vocab) {
    keep = p.top_k;
    std::partial_sort(idx.begin(), idx.begin() + keep, idx.end(), cmp);
  } else {
    std::sort(idx.begin(), idx.end(), cmp);
  }
  thread_local std::vector<float> sorted;
  sorted.resize(keep);
  for (int i = 0; i < keep; ++i) sorted[i] = SampleKey(logits[idx[i]]);
  return DrawSorted(sorted.data(), idx.data(), keep, p, counter);
}

}  // namespace failsafe::cpu
