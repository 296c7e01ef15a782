// The GEMM's kernels for one instruction-set level, and the limits the
// dispatcher (gemm.cc) and the kernels share. Internal to gemm.cc and the
// gemm_<level>.cc files, which build gemm_impl.h with their level's flags.
//
// Every level computes the same chain of fused multiply-adds per output
// element (gemm.h); they differ only in how many registers a tile holds.
//
// Thread-safety: the kernels are stateless; scratch is passed in by the
// caller (one buffer per thread).
#pragma once

#include <algorithm>
#include <cstdint>

#include "backend/cpu/gemm.h"

namespace failsafe::cpu {

inline constexpr int kDirectRows = 4;  // nt with at most this many rows: Direct
// nt on a blocked f32 weight, or a bf16 one by fused multiply-adds, with up
// to this many rows: Direct where a level has the registers
// (GemmKernels::wide_rows).
inline constexpr int kWideRows = 16;
inline constexpr int kStreamRows = 4;  // nn with at most this many rows: Stream
inline constexpr int kItemRows = 32;   // nn fixed-point items, at most this many rows: ItemPanels
inline constexpr int kStreamCols = 4096;  // accumulators of one Stream call (floats)
inline constexpr int kNR = 32;            // columns of a packed panel

// A blocked weight's items (GemmArgs::w_blocked16): rows of each, and its
// units, the blocks of 16 rows and the tail of each item in order (what
// threads share out in decode).
inline int BlockedItemRows(const GemmArgs& a) { return a.w_item_rows > 0 ? a.w_item_rows : a.n; }
inline int BlockedUnitsPerItem(const GemmArgs& a) { return (BlockedItemRows(a) + 15) / 16; }
// The first output column of unit u (u may be the number of units: n).
inline int BlockedUnitColumn(const GemmArgs& a, int u) {
  const int per = BlockedUnitsPerItem(a), rows = BlockedItemRows(a);
  return std::min(a.n, u / per * rows + u % per * 16);
}

// The operands as the kernels take them: GemmArgs, and with bf16 weights the
// activations of the bf16 chain (gemm.h), rounded to bf16 once per Gemm call
// and laid out in slots: the k-values of each chain (all of k, or one item of
// item_k in fixed-point mode) padded with a zero to an even count, so that
// every chain is whole pairs (slot 2p and 2p + 1 of a chain: its k-values
// 2p and 2p + 1). k-value kk of row i is at slot i * ldxs + XSlot(a, kk).
struct KernelArgs : GemmArgs {
  const float* xs = nullptr;     // the rounded values as f32 (exact)
  const uint32_t* xw = nullptr;  // dpbf16: the same as bf16, two slots per word (even low)
  int64_t ldxs = 0;              // slots per row (even)
  int chain_k = 0;               // k-values per chain
  // The slots of xs with each pair's two swapped (odd k-value first), for
  // the tiles over widened panels where GemmKernels::swapped_slots asks
  // for them (WidenedPanelRows); null elsewhere.
  const float* xsw = nullptr;
  bool dpbf16 = false;  // products by vdpbf16ps (avx512 level only)
  // DirectWide: the rows' activations (x, or with bf16 weights xs's slots)
  // k-major, slot kk of row i at xk[kk * m + i], once per Gemm call.
  const float* xk = nullptr;
  // How far on (bytes) decode's loads ask for their unit's next lines
  // (PrefetchAhead): Gemm sets DecodeAheadBytes().
  int ahead_bytes = 0;
};
// The slot of k-value kk in a row of KernelArgs::xs.
inline int64_t XSlot(const KernelArgs& a, int kk) {
  return static_cast<int64_t>(kk / a.chain_k) * ((a.chain_k + 1) & ~1) + kk % a.chain_k;
}

// The vectors of a blocked nt weight's register-tile panels: its items'
// blocks of 16 rows and tails, item after item, two vectors to a panel
// whatever item they are of, so that an item of an odd number of vectors
// leaves no panel half empty (only the weight's last panel may be one
// vector). Where tails are at most 8 rows, two items' tails share a
// vector: items 2P and 2P + 1 give the blocks of 2P, both tails, then the
// blocks of 2P + 1 (gate_up of 1b-llama, items of 88 rows: 11 full vectors
// per two items instead of 12, of which two half empty), except where
// vdpbf16ps reads the weight's bf16 pairs as they lie. A vector is up to
// two runs of rows (output columns), each k-major, its own width wide
// (Blocked16Index).
struct BlockedVector {
  int64_t at[2] = {0, 0};  // each run's first element, from w's start
  int width[2] = {0, 0};   // each run's rows (width[1] 0: one run)
  int col[2] = {0, 0};     // each run's first output column
};
inline bool BlockedTailsJoined(const KernelArgs& a) {
  const int rows = BlockedItemRows(a), t = rows % 16;
  return t > 0 && t <= 8 && a.n / rows >= 2 && !(a.wtype == DType::kBF16 && a.dpbf16);
}
inline int BlockedVectors(const KernelArgs& a) {
  const int rows = BlockedItemRows(a), items = a.n / rows, full = rows / 16, t = rows % 16;
  if (!BlockedTailsJoined(a)) return items * (full + (t > 0 ? 1 : 0));
  return items / 2 * (2 * full + 1) + items % 2 * (full + 1);
}
inline int BlockedPanels(const KernelArgs& a) { return (BlockedVectors(a) + 1) / 2; }
inline BlockedVector BlockedVectorAt(const KernelArgs& a, int v) {
  const int rows = BlockedItemRows(a), full = rows / 16, t = rows % 16;
  // Block b (or, b = full, the tail) of `item` as run r of `out`.
  auto run = [&a, rows, full, t](int item, int b, int r, BlockedVector* out) {
    out->col[r] = item * rows + 16 * b;
    out->at[r] = static_cast<int64_t>(out->col[r]) * a.k;
    out->width[r] = b < full ? 16 : t;
  };
  BlockedVector out;
  if (!BlockedTailsJoined(a)) {
    const int per = full + (t > 0 ? 1 : 0);
    run(v / per, v % per, 0, &out);
    return out;
  }
  const int per = 2 * full + 1, item = v / per * 2, u = v % per;
  if (u != full) {
    run(u < full ? item : item + 1, u < full ? u : u - full - 1, 0, &out);
  } else {
    run(item, full, 0, &out);
    if (item + 1 < a.n / rows) run(item + 1, full, 1, &out);
  }
  return out;
}

// Items [c, c + count) of a product in fixed-point items: a cut down to
// them. Their weights start c * item_k rows on (row-major [k, n], or given
// by rows), or c items of n * item_k elements on (column-blocked,
// GemmArgs::w_blocked16): the same place when ldw is n.
inline KernelArgs ItemsCut(const KernelArgs& a, int c, int count) {
  KernelArgs cut = a;
  const int kk0 = c * a.item_k;
  const int64_t esize = a.wtype == DType::kF32 ? 4 : 2;
  cut.k = count * a.item_k;
  cut.w = static_cast<const char*>(a.w) +
          static_cast<int64_t>(kk0) * (a.w_blocked16 ? a.n : a.ldw) * esize;
  cut.x = a.x + kk0;
  if (a.w_rows) cut.w_rows = a.w_rows + kk0;
  if (a.xs) cut.xs = a.xs + XSlot(a, kk0);
  if (a.xsw) cut.xsw = a.xsw + XSlot(a, kk0);
  if (a.xw) cut.xw = a.xw + XSlot(a, kk0) / 2;
  return cut;
}

// Item c of a column-blocked weight in fixed-point items as the blocked nt
// weight [n, item_k] it is, whose products in fixed-point mode are the
// item's.
inline KernelArgs ColumnBlockedItem(const KernelArgs& a, int c) {
  KernelArgs one = ItemsCut(a, c, 1);
  one.nt = true;
  one.w_item_rows = 0;
  return one;
}

struct GemmKernels {
  int tile_rows;  // rows of a register tile over a packed panel
  // nt, a.m <= kDirectRows: output columns [j0, j1) (blocked: j0, j1 at
  // the start of a unit, BlockedUnitColumn).
  void (*direct)(const KernelArgs& a, int j0, int j1);
  // nn, a.m <= kStreamRows: columns [c0, c0 + cols), cols <= kStreamCols / a.m.
  // scratch: StreamScratchFloats() floats.
  void (*stream)(const KernelArgs& a, int c0, int cols, float* scratch);
  // Any shape: the columns of panel `panel` (kNR columns from kNR * panel;
  // blocked nt: BlockedPanels of them, BlockedVectorAt), every row. packed:
  // PanelScratchFloats(a) floats.
  void (*panel)(const KernelArgs& a, int panel, float* packed);
  // nn in fixed-point items (a.w not by rows): block of columns after
  // block (ItemBlockCols), every item of a in turn, its weight rows in the
  // block packed into `packed` (ItemScratchFloats(a) floats), then every
  // row's tiles over its panels.
  void (*item_panels)(const KernelArgs& a, float* packed);
  // nn in fixed-point items on a column-blocked bf16 weight, its pairs read
  // where they lie, by vdpbf16ps (a.dpbf16) or widened for fused
  // multiply-adds (item_k even): panels [p0, p1), each 32 columns of two
  // whole blocks of 16, panel after panel, every row and every item. Its
  // tiles are built for AVX512_BF16, so it runs only on CPUs that have it.
  // Null at the levels without it (never asked there).
  void (*column_panels)(const KernelArgs& a, int p0, int p1);
  // nn in fixed-point items on a column-blocked weight by fused
  // multiply-adds: panel `panel` (32 columns of two whole blocks of 16),
  // every item's blocks widened into `packed` (PanelScratchFloats(a)
  // floats), then every row's tiles over all of k.
  void (*column_widened)(const KernelArgs& a, int panel, float* packed);
  // Elementwise, the same bits on every level (Exp in simd.h):
  // out[i] = g[i] / (1 + exp(-g[i])) * u[i] for i < n.
  void (*silu_mul)(const float* g, const float* u, float* out, int n);
  // row[i] = exp(row[i] - shift) for i < n.
  void (*exp_shifted)(float* row, int n, float shift);
  // Softmax of row[lo, hi] times scale, in place (SoftmaxRow in kernels.h).
  void (*softmax)(float* row, int width, int lo, int hi, float scale);
  // dst[i] = RoundToBf16(src[i]) for i < n.
  void (*round_bf16)(const float* src, float* dst, int n);
  // words[w] = the bf16 of xs[2w] (low half) and of xs[2w + 1] (high half),
  // w < n, from xs rounded to bf16 (KernelArgs::xw from xs).
  void (*pack_pairs)(const float* xs, uint32_t* words, int64_t n);
  // nt on a blocked f32 weight, or a bf16 one by fused multiply-adds, with
  // more rows than kDirectRows, up to this many: `direct` too, each block
  // read once for all the rows (DirectWide). 0 at the levels without the
  // registers for them.
  int wide_rows = 0;
  // Whether bf16 weights widened into packed panels take the f32 chain's
  // tiles over the activations' swapped slots (KernelArgs::xsw) where more
  // rows than a register tile's use a panel.
  bool swapped_slots = false;
};

// The scratch of GemmKernels::panel and column_widened: a packed panel of
// a.k k-values, and with swapped slots the same in the chains' slots.
inline int64_t PanelScratchFloats(const KernelArgs& a) {
  int64_t rows = a.k;
  if (a.xsw) rows += a.k + a.k / a.chain_k + 1;
  return rows * kNR;
}

inline constexpr int64_t StreamScratchFloats() {
  return int64_t{kStreamRows} * (kStreamCols + 16) + 16;
}

// The columns of one block of GemmKernels::item_panels: as many whole
// panels as make an item's packed panels (f32, or bf16 pairs for vdpbf16ps)
// about 32 KiB, what a first-level cache holds (a Zen 5, 16 rows: 1.3-1.6x
// the rate of whole rows at a time on the o projection, the same on down).
inline int ItemBlockCols(const KernelArgs& a) {
  const int64_t per_col = int64_t{(a.item_k + 1) & ~1} * (a.dpbf16 ? 2 : 4);
  const int64_t panels = std::max<int64_t>(1, (int64_t{32} << 10) / (per_col * kNR));
  return static_cast<int>(std::min<int64_t>(panels * kNR, a.n));
}
inline int64_t ItemScratchFloats(const KernelArgs& a) {
  return int64_t{(a.item_k + 1) & ~1} * ((ItemBlockCols(a) + kNR - 1) / kNR) * kNR;
}

const GemmKernels& GemmKernelsGeneric();
// Whether vdpbf16ps computes the bf16 chain's pairs bit for bit on this CPU
// (a probe on fixed operands; false without AVX512_BF16).
bool Dpbf16MatchesChain();
// vdpbf16ps's throughput on this core over that of a fused multiply-add of
// 16 floats (both measured, a fraction of a millisecond; 0 without
// AVX512_BF16). One vdpbf16ps does the work of two fused multiply-adds and
// the widening of their operands.
double Dpbf16PerFma();
const GemmKernels& GemmKernelsAvx2();
const GemmKernels& GemmKernelsAvx512();

}  // namespace failsafe::cpu
