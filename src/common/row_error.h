// Test support: how far a row of logits is from a reference row.
#pragma once

#include <algorithm>
#include <cmath>

namespace failsafe {

// The largest absolute difference between `got` and `want` (n floats each)
// over the largest magnitude in `want`; 0 when the rows are equal. A NaN in
// `got` is not counted: compare the rows with std::equal for bit for bit.
inline double RowError(const float* got, const float* want, int n) {
  double num = 0, den = 0;
  for (int i = 0; i < n; ++i) {
    num = std::max(num, static_cast<double>(std::fabs(got[i] - want[i])));
    den = std::max(den, static_cast<double>(std::fabs(want[i])));
  }
  return num / den;
}

}  // namespace failsafe
