// Exact sums of float contributions, in fixed point: 32 fractional bits in
// an int64. Integer addition is associative, so a sum of contributions comes
// out the same whatever their order or grouping: the partial sums of head
// groups and FFN shards are the same however the plan spreads them over
// devices, and the all-reduce adds them without rounding.
//
// A contribution is clamped to +-2^24 (far beyond any activation) and
// truncated to a multiple of 2^-32 (about 2.3e-10): finer than float
// precision for any value above 2^-8, and the result is rounded to float once,
// at the end. NaN counts as 0.
#pragma once

#include <cstdint>

namespace failsafe {

inline constexpr float kFixedOne = 4294967296.0f;  // 2^32: the value 1.0
inline constexpr float kFixedLimit = 16777216.0f;  // 2^24: contributions are clamped to +-this

inline int64_t ToFixed(float v) {
  if (!(v == v)) v = 0;
  v = v < -kFixedLimit ? -kFixedLimit : (v > kFixedLimit ? kFixedLimit : v);
  return static_cast<int64_t>(v * kFixedOne);  // exact scaling, then truncation
}

inline float FromFixed(int64_t s) { return static_cast<float>(static_cast<double>(s) / kFixedOne); }

// Wrapping addition (no undefined behaviour; sums never come near the range).
inline int64_t AddFixed(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
}

}  // namespace failsafe
