// The CPU backend's matrix multiply, batch-invariant by construction.
//
// Every output element is one chain of fused multiply-adds over k in
// increasing order, starting from 0 (from y when accumulating; from 0 for
// each item in fixed-point mode), whatever m, the other rows, the element's
// place in the matrix and the thread count. No path (register tile, row or
// column tail, few rows or many, weights as [n, k] or [k, n]) changes that
// chain.
//
// Layout: with many rows, register tiles of rows x 32 columns (8 rows with
// AVX-512, 3 with AVX2) run over a panel of 32 columns of weights packed
// k-major (the [n, k] layout of Hugging Face Linear weights is transposed
// 16 x 16 block by block; blocked weights, w_blocked16, are k-major
// already). With few rows the weights are read once as they lie: blocked
// [n, k] one vector per 16 rows and k-value (an item's tail of fewer rows in
// the first lanes of a vector), row-major [n, k] sixteen rows at a time,
// transposed in registers; [k, n] row after row into accumulators that stay
// in cache. A column-blocked [k, n] weight in fixed-point items is the
// blocked nt weight of each item, taken by the same kernels item after item.
// Threads take whole column ranges; on a row-major [k, n] weight in
// fixed-point mode with few rows, whole items instead (their exact sums are
// added after: the same bits).
//
// Weights may be f32, bf16 or f16 (wtype): 16-bit values are widened exactly
// to f32 in registers. f32 and f16 weights take the f32 chain: activations
// and accumulation in f32, the chain their f32 copy would give. bf16 weights
// take the bf16 chain, that of PyTorch's bf16 inference and of vdpbf16ps
// (AVX512_BF16), in which every product is exact:
//   - the activations are rounded to bf16 (to nearest, ties to even) once
//     per call;
//   - a chain's k-values (all of k; in fixed-point mode each item of item_k)
//     are taken in pairs from its first, a last lone value paired with a
//     zero, and each pair (k, k + 1) as acc = fma(x[k + 1], w[k + 1], acc),
//     then acc = fma(x[k], w[k], acc): odd before even;
//   - every operation reads denormal inputs as zero and flushes denormal
//     results to zero (after rounding, with an unbounded exponent).
// This is exactly what vdpbf16ps computes per pair (the Intel SDM's
// definition; checked on the CPU at start-up, Dpbf16MatchesChain), so with
// it the avx512 level takes one instruction per pair where the others take
// two fused multiply-adds under MXCSR's DAZ and FTZ (set only while a bf16
// kernel runs). NaN payloads are not part of the chain: a NaN stays a NaN.
//
// The kernels are built once per instruction-set level (gemm_avx512.cc,
// gemm_avx2.cc, gemm_generic.cc: AVX-512 F/BW/VL/DQ, AVX2 with FMA and F16C,
// any x86-64) and the best the CPU supports is chosen at start-up
// (cpu_features.h). Every level computes the same chains, so the levels
// agree bit for bit; tests force each one through GemmArgs::isa.
//
// So a row's result depends only on that row and the weights: a request gets
// the same logits whatever it is batched with, however its prompt is
// chunked, and whether its KV was computed in a prefill or in decode steps.
//
// Rows of w may also be given as pointers (w_rows), for paged operands: the
// keys and values of attention, f32 or bf16 (a bf16 KV cache), both taken
// by the f32 chain.
//
// Thread-safety: Gemm may run on several threads at once (its scratch is per
// thread).
#pragma once

#include <cstdint>
#include <optional>

#include "backend/cpu_features.h"
#include "model/safetensors.h"

namespace failsafe::cpu {

enum class GemmOut {
  kStore,       // y = x w
  kAccumulate,  // y += x w
  kFixedItems,  // nn only: acc += ToFixed(x w) for each item of item_k consecutive k-values
};

// Rows given by pointers (GemmArgs::w_rows: attention's keys and values in
// their pages) lie in short runs far apart, which the hardware prefetchers
// do not follow: each read waited on memory. The kernels ask for the rows
// this far ahead, whole (decode attention over a 512-position context,
// failsafe_bench_attention: 1.3-1.9x on one thread, 1.5-1.6x on two;
// docs/CPU_PERFORMANCE.md). The first rows of a product are the caller's to
// ask for (PrefetchAttentionStart, kernels.h).
inline constexpr int kRowsAheadNT = 32;  // nt (scores): two blocks of 16 keys
inline constexpr int kRowsAheadNN = 16;  // nn (weighted values): two groups of 8 values
// Those asked for this close arrive one run at a time: further ahead, the
// rows are asked for into the second-level cache only, so that several runs
// are on their way at once (a core reads runs of 4 KiB in a random order at
// 9 GB/s asking for each two runs ahead into its first-level cache, 15 GB/s
// asking eight runs ahead into its second; decode attention at a 2,048
// position context, 1.5 ms a layer on one thread before, 0.7 after: docs/
// CPU_PERFORMANCE.md).
inline constexpr int kRowsFarNT = 48;
inline constexpr int kRowsFarNN = 48;

struct GemmArgs {
  const float* x = nullptr;  // [m, k], row stride ldx
  int64_t ldx = 0;
  const void* w = nullptr;  // nt: [n, k]; nn: [k, n]; row stride ldw (elements of wtype)
  int64_t ldw = 0;
  DType wtype = DType::kF32;
  // If set, row r of w (nt: r < n; nn: r < k), f32 or bf16 (wtype); bf16
  // rows take the f32 chain over their widened values (x not rounded,
  // nothing flushed): the same bits as f32 rows holding those values.
  const float* const* w_rows = nullptr;
  // w is blocked: output columns in blocks of 16, k-major (backend/backend.h,
  // Blocked16Index; ldw unused). The kernels read it as it lies, without
  // transposing or packing, and never past its end.
  //  - nt: items of w_item_rows rows (0: one item of n rows; n a multiple of
  //    it) one after another, w_item_rows * k elements each, row r of item i
  //    at kk at w + i * w_item_rows * k + Blocked16Index(r, kk, w_item_rows, k).
  //  - nn, fixed-point items only (column-blocked): each item of item_k
  //    k-values as its transpose, [n, item_k], blocked; w[kk, j] of item c
  //    (kk in it) at w + c * n * item_k + Blocked16Index(j, kk - c * item_k,
  //    n, item_k). w_item_rows unused.
  bool w_blocked16 = false;
  int w_item_rows = 0;
  bool nt = true;
  int m = 0, n = 0, k = 0;
  GemmOut out = GemmOut::kStore;
  float* y = nullptr;  // [m, n], row stride ldy (kStore, kAccumulate)
  int64_t ldy = 0;
  int64_t* acc = nullptr;  // [m, n] fixed point, row stride ldacc (kFixedItems)
  int64_t ldacc = 0;
  int item_k = 0;  // kFixedItems: k is a multiple of it
  int threads = 1;
  // The kernels' instruction-set level; unset: GemmIsa(). A level the CPU
  // lacks is lowered to the best it has.
  std::optional<CpuIsa> isa;
  // bf16 weights: whether products are taken by vdpbf16ps (same results
  // either way); true: where GemmDpbf16For(level) allows; unset: there for
  // decode's few rows (kDirectRows) and plain products of up to
  // kDpbf16Rows, elsewhere only where GemmDpbf16TilesFor(level). Unset or
  // false, nt products on blocked weights of up to kWideRows rows are taken
  // by fused multiply-adds, each block read once for all the rows, where
  // vdpbf16ps does not outrun them in register tiles (DirectWide).
  std::optional<bool> dpbf16;
};

void Gemm(const GemmArgs& a);

// The level Gemm uses by default: the best this CPU supports, at most
// FAILSAFE_CPU_ISA's where that is set.
CpuIsa GemmIsa();
// The level Gemm runs for `requested` on this CPU (lowered if unsupported).
CpuIsa GemmIsaFor(std::optional<CpuIsa> requested);
// Rows of the register tile at that level (for reports).
int GemmTileRows(CpuIsa isa);
// Whether Gemm at that level takes the bf16 chain's products by vdpbf16ps:
// the level is avx512, the CPU has AVX512_BF16 and the instruction computes
// the chain bit for bit (checked once, on fixed operands).
bool GemmDpbf16For(CpuIsa isa);
// Bytes on that decode's loads ask for their weight's next lines: chosen by
// the CPU's family (measured), or FAILSAFE_DECODE_AHEAD.
int DecodeAheadBytes();
// Whether f32 [k, n] weights in fixed-point items (o and down) are held
// column-blocked, each item as its blocked transpose (as bf16's always are),
// rather than as rows streamed through accumulators: chosen by the CPU's
// family (measured), or FAILSAFE_F32_COLUMN_BLOCKED=0/1.
bool F32ColumnBlocked();
// Whether, by default, products with more rows than batched decode's
// (register tiles, compute bound) take vdpbf16ps too: where
// GemmDpbf16For(isa) and the instruction, measured at start-up, runs at
// least 3/8 as fast as a fused multiply-add.
bool GemmDpbf16TilesFor(CpuIsa isa);
// vdpbf16ps's throughput over a 16-float fused multiply-add's, as measured
// once on this CPU; 0 where GemmDpbf16For(kAvx512) is false.
double GemmDpbf16PerFma();
// GemmDpbf16TilesFor's bound on GemmDpbf16PerFma.
inline constexpr double kDpbf16TilesFrom = 0.375;
// Plain bf16 products (not fixed-point items) with at most this many rows
// take vdpbf16ps by default wherever it computes the chain (GemmDpbf16For);
// more only where GemmDpbf16TilesFor. Their tiles widen a 16-bit weight
// into a panel once for all rows: on a Xeon whose vdpbf16ps runs at a
// quarter of a fused multiply-add's rate, 16 rows are still 1.2-1.5x as
// fast by it on qkv and gate_up, 32 rows mixed.
inline constexpr int kDpbf16Rows = 16;
// Twelve independent chains of `iters` 16-float fused multiply-adds, so
// that their time is the instruction's throughput, not its latency (for
// measuring peaks; only on CPUs with AVX-512 F); the same of vdpbf16ps
// (only with AVX512_BF16).
float Avx512FmaChains(int64_t iters);
// The same by the generic level's fused multiply-add (the ceiling of its f32
// kernels; any CPU), and by its bf16 chain's step (FmaBf16, simd.h).
float GenericFmaChains(int64_t iters);
float GenericBf16Chains(int64_t iters);
float Avx512Dpbf16Chains(int64_t iters);

// x rounded to bf16 (to nearest, ties to even; a NaN stays a NaN), as f32.
float RoundToBf16(float x);

}  // namespace failsafe::cpu
