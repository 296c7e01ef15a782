// Lane helpers of the GEMM's kernels: the pair layout of bf16 chains, partial
// loads and stores, weight rows, and the in-register 16 x 16 transpose.
// Part of the GEMM's kernel body: gemm_impl.h includes it once per
// instruction-set level, in order, inside an unnamed namespace; not a
// header of its own.
#pragma once

namespace failsafe::cpu {
namespace {

// Whether the kernels take W's k-values in pairs, two per 32-bit lane
// widened in-lane: bf16, as its blocked layout holds them (Blocked16Pairs and
// Blocked16Index in backend/backend.h) and as a row of [n, k] holds two
// neighbours.
template <typename W>
constexpr bool kPairs = std::is_same_v<W, BF16>;

// The bf16 chain's activations of row i from k-value kk's slot on
// (KernelArgs::xs): the chain's pair (kk + 2p, kk + 2p + 1) at slots 2p, 2p + 1
// when kk starts a pair.
FS_INLINE const float* XsRow(const KernelArgs& a, int i, int kk) {
  return a.xs + i * a.ldxs + XSlot(a, kk);
}

// The first `count` (1 to 16) floats at p, the other lanes 0; and their
// store: a whole vector when count is 16, never touching memory past them.
FS_INLINE V16 LoadPart(const float* p, int count) {
  if (count == 16) return Load(p);
#if defined(__AVX512F__)
  return reinterpret_cast<V16>(_mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << count) - 1), p));
#else
  float tmp[16] = {};
  for (int j = 0; j < count; ++j) tmp[j] = p[j];
  return Load(tmp);
#endif
}
FS_INLINE void StorePart(float* p, V16 v, int count) {
  if (count == 16) return Store(p, v);
#if defined(__AVX512F__)
  _mm512_mask_storeu_ps(p, static_cast<__mmask16>((1u << count) - 1), reinterpret_cast<__m512>(v));
#else
  for (int j = 0; j < count; ++j) p[j] = v[j];
#endif
}

// Row r of w (nt: an output column; nn: a k-value) in its element type W.
template <typename W>
FS_INLINE const W* WRow(const KernelArgs& a, int r) {
  if (a.w_rows) return reinterpret_cast<const W*>(a.w_rows[r]);
  return static_cast<const W*>(a.w) + static_cast<int64_t>(r) * a.ldw;
}

// Rows x and y (B apart) of the recursive block transpose's round B:
// lanes 0-15 of the shuffles pick from x, 16-31 from y.
template <int B, typename V, int... L>
FS_INLINE void SwapRows(V* x, V* y, std::integer_sequence<int, L...>) {
  const V a = *x, c = *y;
  *x = Shuffle<((L & B) ? 16 + (L - B) : L)...>(a, c);
  *y = Shuffle<((L & B) ? 16 + L : L + B)...>(a, c);
}

// One round of the recursive block transpose: swaps the off-diagonal B x B
// blocks of every 2B x 2B block.
template <int B, typename V>
FS_INLINE void SwapBlocks(V r[16]) {
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) {
    if (i & B) continue;
    SwapRows<B>(&r[i], &r[i + B], std::make_integer_sequence<int, 16>());
  }
}

// r[i][l] becomes r[l][i] (16 float or 32-bit integer lanes; bits move
// unchanged).
template <typename V>
FS_INLINE void Transpose16(V r[16]) {
  SwapBlocks<8>(r);
  SwapBlocks<4>(r);
  SwapBlocks<2>(r);
  SwapBlocks<1>(r);
}

}  // namespace
}  // namespace failsafe::cpu
