// Sums of several arrays taken element by element in a fixed order, the
// sums every collective gives: floats added in order, each addition
// rounded (so every member, and every way of moving the data, gets the
// same bits); fixed-point partial sums (fixed_point.h) added as AddFixed,
// wrapping, where order does not matter.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "common/fixed_point.h"

namespace failsafe {

namespace ordered_sums_internal {

template <typename T>
struct Lanes;
template <>
struct Lanes<float> {
  typedef float V __attribute__((vector_size(64), aligned(4)));
  static V Add(V a, V b) { return a + b; }
  static float Add(float a, float b) { return a + b; }
};
template <>
struct Lanes<int64_t> {
  // AddFixed, lane by lane (unsigned lanes wrap as it does).
  typedef uint64_t V __attribute__((vector_size(64), aligned(8)));
  static V Add(V a, V b) { return a + b; }
  static int64_t Add(int64_t a, int64_t b) { return AddFixed(a, b); }
};

}  // namespace ordered_sums_internal

// out[i] = ((srcs[0][i] + srcs[1][i]) + ...) + srcs[n - 1][i], for i in
// [begin, end); 64 bytes of lanes at a time. T: float or int64_t.
template <typename T>
void SumInOrder(const T* const* srcs, int n, size_t begin, size_t end, T* out) {
  using L = ordered_sums_internal::Lanes<T>;
  constexpr size_t kLanes = 64 / sizeof(T);
  size_t i = begin;
  for (; i + kLanes <= end; i += kLanes) {
    typename L::V acc;
    std::memcpy(&acc, srcs[0] + i, 64);
    for (int m = 1; m < n; ++m) {
      typename L::V v;
      std::memcpy(&v, srcs[m] + i, 64);
      acc = L::Add(acc, v);
    }
    std::memcpy(out + i, &acc, 64);
  }
  for (; i < end; ++i) {
    T acc = srcs[0][i];
    for (int m = 1; m < n; ++m) acc = L::Add(acc, srcs[m][i]);
    out[i] = acc;
  }
}

// Member `rank`'s piece [*begin, *end) of n elements of T shared out among
// `members` for a reduce-scatter: whole 64-byte lines, n / members rounded
// up before the lines, so that the pieces together cover n (the last ones
// may be short or empty).
template <typename T>
void ScatterPiece(size_t n, int members, int rank, size_t* begin, size_t* end) {
  const size_t lanes = 64 / sizeof(T), m = static_cast<size_t>(members);
  const size_t per = ((n + m - 1) / m + lanes - 1) / lanes * lanes;
  *begin = per * static_cast<size_t>(rank) < n ? per * static_cast<size_t>(rank) : n;
  *end = *begin + per < n ? *begin + per : n;
}

}  // namespace failsafe
