// Row kernels that are not products, at the level's width: SiLU times the up
// projection, shifted exponentials, softmax rows, and bf16 rounding and
// pairing of activations.
// Part of the GEMM's kernel body: gemm_impl.h includes it once per
// instruction-set level, in order, inside an unnamed namespace; not a
// header of its own.
#pragma once

namespace failsafe::cpu {
namespace {

// A row's vectors, the last one partial (the same lanes' arithmetic).
void SiluMulRow(const float* g, const float* u, float* out, int n) {
  for (int i = 0; i < n; i += 16) {
    const int c = std::min(16, n - i);
    const V16 gv = LoadPart(g + i, c);
    StorePart(out + i, gv / (Splat(1.0f) + Exp(-gv)) * LoadPart(u + i, c), c);
  }
}

void ExpShifted(float* row, int n, float shift) {
  for (int i = 0; i < n; i += 16) {
    const int c = std::min(16, n - i);
    StorePart(row + i, Exp(LoadPart(row + i, c) - Splat(shift)), c);
  }
}

// RoundActivations' two passes at the level's width, in integer operations,
// so every level gives the same bits. dst[i] = RoundToBf16(src[i]), i < n,
// 16 at a time.
void RoundRowBf16(const float* src, float* dst, int n) {
  int i = 0;
  for (; i + 16 <= n; i += 16) StoreBits(dst + i, Bf16Bits(LoadBits(src + i)));
  for (; i < n; ++i) dst[i] = RoundToBf16(src[i]);
}

// words[w] = the bf16 of xs[2w] (low half) and of xs[2w + 1] (high half),
// w < n; xs holds values rounded to bf16 (their low halves are zero). 16
// words at a time.
void PackPairsRow(const float* xs, uint32_t* words, int64_t n) {
  int64_t w = 0;
  for (; w + 16 <= n; w += 16) {
    const U16 lo = LoadBits(xs + 2 * w), hi = LoadBits(xs + 2 * w + 16);
    StoreBits(words + w, (EvenLanes(lo, hi) >> 16) | (OddLanes(lo, hi) & 0xffff0000u));
  }
  for (; w < n; ++w) {
    uint32_t even, odd;
    std::memcpy(&even, &xs[2 * w], 4);
    std::memcpy(&odd, &xs[2 * w + 1], 4);
    words[w] = (even >> 16) | (odd & 0xffff0000u);
  }
}

// Lanes [0, count) of a vector: true (all ones), the others 0.
FS_INLINE I16 FirstLanes(int count) {
  const I16 lane{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  return lane < I16{} + count;
}

void SoftmaxRow(float* row, int width, int lo, int hi, float scale) {
  float* r = row + lo;
  const int n = hi - lo + 1;
  const V16 none = Splat(-__builtin_inff());
  V16 top = none;
  for (int i = 0; i < n; i += 16) {
    const int c = std::min(16, n - i);
    const V16 v = Select(FirstLanes(c), LoadPart(r + i, c) * Splat(scale), none);
    StorePart(r + i, v, c);
    top = Select(top < v, v, top);  // NaN never taken, as std::max(top, v) does
  }
  float mx = -__builtin_inff();
  for (int j = 0; j < 16; ++j) mx = std::max(mx, top[j]);
  ExpShifted(r, n, mx);
  V16 sums{};
  for (int i = 0; i < n; i += 16) sums += LoadPart(r + i, std::min(16, n - i));
  float lanes[16];
  Store(lanes, sums);
  for (int half = 8; half >= 1; half /= 2) {
    for (int j = 0; j < half; ++j) lanes[j] += lanes[j + half];
  }
  const V16 inv = Splat(1.0f / lanes[0]);
  for (int i = 0; i < n; i += 16) {
    const int c = std::min(16, n - i);
    StorePart(r + i, LoadPart(r + i, c) * inv, c);
  }
  std::fill(row, r, 0.0f);
  std::fill(r + n, row + width, 0.0f);
}

}  // namespace
}  // namespace failsafe::cpu
