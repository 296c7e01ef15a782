// Packing [k, n] weights into panels for the register tiles.
// Part of the GEMM's kernel body: gemm_impl.h includes it once per
// instruction-set level, in order, inside an unnamed namespace; not a
// header of its own.
#pragma once

namespace failsafe::cpu {
namespace {

// Packing a panel of [k, n] weights reads one or two cache lines per row,
// rows a whole row apart: a stride the hardware prefetchers do not follow,
// so every read waited on memory. Each row's read asks for the same columns
// kPackAhead rows further down (batched decode's o and down projections
// about a third faster).
inline constexpr int kPackAhead = 16;
template <typename W>
FS_INLINE void PrefetchPackRows(const KernelArgs& a, int kk, int rows, int j0) {
  if (a.w_rows || kk + kPackAhead + rows > a.k) return;
  for (int r = 0; r < rows; ++r) {
    const W* p = WRow<W>(a, kk + kPackAhead + r) + j0;
    __builtin_prefetch(p);
    if constexpr (sizeof(W) == 4) __builtin_prefetch(p + 16);  // 32 columns: two lines
  }
}

// Packs columns [j0, j0 + cols) of w k-major into out[k][32], widened to f32.
template <typename W>
void Pack(const KernelArgs& a, int j0, int cols, float* out) {
  if (!a.nt) {
    for (int kk = 0; kk < a.k; ++kk) {
      PrefetchPackRows<W>(a, kk, 1, j0);
      float* dst = out + static_cast<int64_t>(kk) * kNR;
      const W* src = WRow<W>(a, kk) + j0;
      int c = 0;
      for (; c + 16 <= cols; c += 16) Store(dst + c, Load(src + c));
      for (; c < cols; ++c) dst[c] = Widen(src[c]);
      std::memset(dst + cols, 0, sizeof(float) * (kNR - cols));
    }
    return;
  }
  // w is [n, k]: transpose 16 columns x 16 k-values at a time.
  for (int jb = 0; jb < kNR; jb += 16) {
    const W* wr[16];
    for (int q = 0; q < 16; ++q) wr[q] = jb + q < cols ? WRow<W>(a, j0 + jb + q) : nullptr;
    int kb = 0;
    if constexpr (kPairs<W>) {  // lanes of two k-values, as DirectNT
      for (; kb + 32 <= a.k; kb += 32) {
        I16 r[16];
#pragma GCC unroll 16
        for (int q = 0; q < 16; ++q) r[q] = wr[q] ? LoadLanes(wr[q] + kb) : I16{};
        Transpose16(r);
#pragma GCC unroll 16
        for (int t = 0; t < 16; ++t) {
          V16 even, odd;
          WidenPair(r[t], &even, &odd);
          Store(out + static_cast<int64_t>(kb + 2 * t) * kNR + jb, even);
          Store(out + static_cast<int64_t>(kb + 2 * t + 1) * kNR + jb, odd);
        }
      }
    }
    for (; kb + 16 <= a.k; kb += 16) {
      V16 r[16];
#pragma GCC unroll 16
      for (int q = 0; q < 16; ++q) r[q] = wr[q] ? Load(wr[q] + kb) : V16{};
      Transpose16(r);
#pragma GCC unroll 16
      for (int t = 0; t < 16; ++t) Store(out + static_cast<int64_t>(kb + t) * kNR + jb, r[t]);
    }
    for (; kb < a.k; ++kb) {
      float* dst = out + static_cast<int64_t>(kb) * kNR + jb;
      for (int q = 0; q < 16; ++q) dst[q] = wr[q] ? Widen(wr[q][kb]) : 0.0f;
    }
  }
}

}  // namespace
}  // namespace failsafe::cpu
