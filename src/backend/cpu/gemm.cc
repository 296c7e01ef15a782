// Gemm's dispatcher: picks the instruction-set level's kernels
// (gemm_kernels.h), shares the work out over threads (units of whole
// columns, so no element is split; or, for fixed-point sums with few rows,
// whole items; a faster thread taking over a slower one's tail,
// unit_shares.h) and owns the per-thread scratch. Built for any x86-64.
#include "backend/cpu/gemm.h"

#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "backend/cpu/gemm_kernels.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/simd.h"
#include "backend/cpu/unit_shares.h"
#include "common/check.h"
#include "common/fixed_point.h"

namespace failsafe::cpu {

namespace {

const GemmKernels& KernelsFor(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAvx512:
      return GemmKernelsAvx512();
    case CpuIsa::kAvx2:
      return GemmKernelsAvx2();
    case CpuIsa::kGeneric:
      break;
  }
  return GemmKernelsGeneric();
}

float* Scratch(int64_t floats) {
  thread_local std::vector<float> scratch;
  if (static_cast<int64_t>(scratch.size()) < floats) scratch.resize(floats);
  return scratch.data();
}

// The bf16 chain's activations (KernelArgs::xs, xw) of a call on this
// thread: x rounded once, in the chains' slots. Rows are independent: from
// 2^14 values (8 rows of 2048: batched decode's too) they are shared out
// over `threads`.
void RoundActivations(KernelArgs* ka, const GemmKernels& kern, int threads) {
  thread_local std::vector<float> xs;
  thread_local std::vector<uint32_t> xw;
  thread_local std::vector<float> xsw;
  ka->chain_k = ka->out == GemmOut::kFixedItems ? ka->item_k : ka->k;
  const int chains = ka->k / ka->chain_k, padded = (ka->chain_k + 1) & ~1;
  ka->ldxs = static_cast<int64_t>(chains) * padded;  // even
  const size_t slots = static_cast<size_t>(ka->m * ka->ldxs);
  if (xs.size() < slots) xs.resize(slots);
  if (ka->dpbf16 && xw.size() < slots / 2) xw.resize(slots / 2);
  ka->xs = xs.data();
  ka->xw = ka->dpbf16 ? xw.data() : nullptr;
  const bool swapped = kern.swapped_slots && !ka->dpbf16 && ka->m > kern.tile_rows;
  if (swapped && xsw.size() < slots) xsw.resize(slots);
  ka->xsw = swapped ? xsw.data() : nullptr;
  const KernelArgs& a = *ka;
  float* const xs_out = xs.data();
  uint32_t* const xw_out = xw.data();
  float* const xsw_out = xsw.data();
  auto rows = [&a, &kern, xs_out, xw_out, xsw_out](int i0, int i1) {
    for (int i = i0; i < i1; ++i) {
      const float* x = a.x + static_cast<int64_t>(i) * a.ldx;
      float* row = xs_out + static_cast<int64_t>(i) * a.ldxs;
      for (int c = 0; c < a.k / a.chain_k; ++c) {
        float* dst = row + static_cast<int64_t>(c) * ((a.chain_k + 1) & ~1);
        const float* src = x + static_cast<int64_t>(c) * a.chain_k;
        kern.round_bf16(src, dst, a.chain_k);
        if ((a.chain_k & 1) != 0) dst[a.chain_k] = 0.0f;
      }
      if (a.dpbf16) kern.pack_pairs(row, xw_out + static_cast<int64_t>(i) * a.ldxs / 2, a.ldxs / 2);
      if (a.xsw) {
        float* sw = xsw_out + static_cast<int64_t>(i) * a.ldxs;
        for (int64_t s = 0; s < a.ldxs; s += 2) {
          sw[s] = row[s + 1];
          sw[s + 1] = row[s];
        }
      }
    }
  };
  if (threads > 1 && static_cast<int64_t>(a.m) * a.k >= (1 << 14)) {
#pragma omp parallel num_threads(threads)
    {
      auto [i0, i1] = Piece(a.m, omp_get_num_threads(), omp_get_thread_num());
      rows(i0, i1);
    }
  } else {
    rows(0, a.m);
  }
}

// nn in fixed-point items: threads take runs of whole items (UnitShares)
// rather than of columns, so each reads whole weight rows, one run of
// memory, instead of a part of every row. Each thread's items go to its own sums
// (thread 0's straight to a.acc), which are then added column range by
// column range: fixed-point addition is exact in any grouping, so the bits
// are the same. work(mine) runs a thread's items, `mine` being a cut down to
// them.
template <typename Work>
void SplitItems(const KernelArgs& a, int threads, int items, Work work) {
  thread_local std::vector<int64_t> partials;
  const int64_t sums = static_cast<int64_t>(a.m) * a.n;
  if (static_cast<int64_t>(partials.size()) < (threads - 1) * sums)
    partials.resize((threads - 1) * sums);
  int64_t* const others = partials.data();
  UnitShares shares(items, threads);
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    KernelArgs mine = a;
    if (t > 0) {
      mine.acc = others + (t - 1) * sums;
      mine.ldacc = a.n;
      std::memset(mine.acc, 0, sizeof(int64_t) * sums);
    }
    shares.Run(t, [&](int i0, int i1) { work(ItemsCut(mine, i0, i1 - i0)); });
#pragma omp barrier
    const auto [c0, c1] = Piece(a.n, nt, t);
    for (int i = 0; i < a.m; ++i) {
      int64_t* dst = a.acc + i * a.ldacc;
      for (int p = 0; p + 1 < nt; ++p) {
        const int64_t* src = others + p * sums + static_cast<int64_t>(i) * a.n;
        for (int c = c0; c < c1; ++c) dst[c] = AddFixed(dst[c], src[c]);
      }
    }
  }
}

// DirectWide's activations (KernelArgs::xk) of a call on this thread: each
// row's chain values (x, or with bf16 weights its slots in xs, an odd k's
// padding zero with them) k-major, shared by the threads.
void PackKMajor(KernelArgs* ka) {
  thread_local std::vector<float> xk;
  const bool slots = ka->wtype == DType::kBF16;
  const int64_t per_row = slots ? ka->ldxs : ka->k, ld = slots ? ka->ldxs : ka->ldx;
  const float* x = slots ? ka->xs : ka->x;
  xk.resize(static_cast<size_t>(per_row * ka->m));
  for (int i = 0; i < ka->m; ++i) {
    for (int64_t kk = 0; kk < per_row; ++kk) xk[kk * ka->m + i] = x[i * ld + kk];
  }
  ka->xk = xk.data();
}

// nn in fixed-point items on a column-blocked weight (GemmArgs::w_blocked16):
// item c is a blocked nt weight of its own, [n, item_k] at w + c * n *
// item_k, whose products the nt kernels take in fixed-point mode (the same
// chains). Threads take ranges of columns (units of 16 with few rows, else
// panels of 32); every column is one thread's, so no sums are split.
//  - Few rows: the direct kernel, item after item over a thread's columns
//    (each item's part of them one run of memory).
//  - More: panel after panel (those of two whole blocks of 16), every item
//    in one call: bf16 with even items on a CPU with AVX512_BF16, its pairs
//    read where they lie as a packed panel's are, by vdpbf16ps or widened;
//    else every item's blocks widened into one packed panel over all of k.
//  - The rest item after item over blocks of panels whose sums (m x 32 per
//    panel) stay in the second-level cache while every item adds to them.
void ColumnBlockedItems(const KernelArgs& a, const GemmKernels& kern, int threads) {
  const int items = a.k / a.item_k;
  const bool direct = a.m <= kDirectRows;
  const int units = direct ? (a.n + 15) / 16 : (a.n + kNR - 1) / kNR;
  const int block = std::max(1, (128 << 10) / (a.m * kNR * 8));
  // bf16 pairs read where they lie (by vdpbf16ps or widened for fused
  // multiply-adds): their tiles carry AVX512_BF16 as a target, so only CPUs
  // that have it take them.
  const bool pairs = a.wtype == DType::kBF16 && a.item_k % 2 == 0 &&
                     kern.column_panels != nullptr && HostCpuFeatures().avx512_bf16;
  const int whole_panels = a.n / 16 * 16 / kNR;
  auto run = [&](int u0, int u1) {
    if (direct) return kern.direct(a, 16 * u0, std::min(a.n, 16 * u1));
    float* packed = Scratch(pairs ? static_cast<int64_t>(a.item_k) * kNR : PanelScratchFloats(a));
    const int w1 = std::clamp(whole_panels, u0, u1);
    if (u0 < w1 && pairs) kern.column_panels(a, u0, w1);
    if (!pairs) {
      for (int p = u0; p < w1; ++p) kern.column_widened(a, p, packed);
    }
    for (int b0 = w1; b0 < u1; b0 += block) {
      const int b1 = std::min(u1, b0 + block);
      for (int c = 0; c < items; ++c) {
        const KernelArgs one = ColumnBlockedItem(a, c);
        for (int p = b0; p < b1; ++p) kern.panel(one, p, packed);
      }
    }
  };
  // Few rows: each item's part of a chunk is one run of memory, as long as
  // the chunk (a 16-column unit of an FFN shard's item: 1.4 KB of bf16), so
  // a piece is taken whole (in eighths: bf16 decode's down projection at
  // batch 1, 0.62-0.64x).
  ShareOut(units, threads, run, direct ? 1 : kUnitShareTakes);
}

}  // namespace

float RoundToBf16(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  b = Bf16Bits(b);
  std::memcpy(&x, &b, 4);
  return x;
}

namespace {

// AMD family 25: Zen 3 and Zen 4, the memory behaviour DecodeAheadBytes and
// F32ColumnBlocked were measured for (a Zen 4).
bool AmdFamily25() {
  const CpuFeatures& f = HostCpuFeatures();
  return f.vendor == "AuthenticAMD" && f.family == 25;
}

}  // namespace

int DecodeAheadBytes() {
  // How many lines a core keeps in flight decides how far ahead pays: on a
  // Zen 4 (family 25, model 17), bf16 decode at batch 1 read its blocks at
  // 1.1-1.6x the rate asking 512 bytes ahead against 2 KiB, at the avx2 and
  // avx512 levels (docs/CPU_PERFORMANCE.md, "Zen 4"); family 25 is also
  // Zen 3 (not measured). 2 KiB elsewhere (a Zen 5: a quarter faster than
  // none; a Xeon). FAILSAFE_DECODE_AHEAD sets it.
  static const int bytes = [] {
    if (const char* env = std::getenv("FAILSAFE_DECODE_AHEAD")) {
      return std::clamp(std::atoi(env), 0, 1 << 16);
    }
    return AmdFamily25() ? 512 : 2048;
  }();
  return bytes;
}

bool F32ColumnBlocked() {
  // On a Zen 4 (family 25, model 17), f32 o and down projections at batch 1
  // on one thread read 26-30 GB/s column-blocked against 20-22 streaming
  // rows, at the avx2 and avx512 levels, and run as fast or faster at 16,
  // 64 and 512 rows (docs/CPU_PERFORMANCE.md, "Zen 4, the avx2 level's item
  // sums"); family 25 is also Zen 3 (not measured). Elsewhere rows stream
  // at the bandwidth (a Zen 5: "Zen 5, decode's reads").
  static const bool blocked = [] {
    if (const char* env = std::getenv("FAILSAFE_F32_COLUMN_BLOCKED")) return std::atoi(env) != 0;
    return AmdFamily25();
  }();
  return blocked;
}

bool GemmDpbf16For(CpuIsa isa) {
  static const bool matches = HostCpuFeatures().avx512_bf16 &&
                              GemmIsaFor(CpuIsa::kAvx512) == CpuIsa::kAvx512 &&
                              Dpbf16MatchesChain();
  return isa == CpuIsa::kAvx512 && matches;
}

bool GemmDpbf16TilesFor(CpuIsa isa) {
  // Register tiles over many rows are compute bound: vdpbf16ps pays where
  // it runs at least 3/8 as fast as a fused multiply-add (3/4 of the two it
  // replaces; the widening they need makes up the rest). Zen 4 and 5 run it
  // as fast as one; an Emerald Rapids Xeon a quarter as fast, where 512-row
  // products by fused multiply-adds are up to 1.75x as fast
  // (docs/CPU_PERFORMANCE.md, "Xeon, bf16 tiles by fused multiply-adds").
  return GemmDpbf16For(isa) && GemmDpbf16PerFma() >= kDpbf16TilesFrom;
}

double GemmDpbf16PerFma() {
  static const double ratio = GemmDpbf16For(CpuIsa::kAvx512) ? Dpbf16PerFma() : 0;
  return ratio;
}

CpuIsa GemmIsa() {
  // FAILSAFE_CPU_ISA (avx512, avx2, generic) caps the level: an AVX-512
  // machine then runs every kernel as one without it would (the parity tests
  // at the avx2 level, end to end).
  static const CpuIsa isa = [] {
    CpuIsa best = BestCpuIsa(HostCpuFeatures());
    if (const char* env = std::getenv("FAILSAFE_CPU_ISA")) {
      const std::optional<CpuIsa> cap = ParseCpuIsa(env);
      FS_CHECK_MSG(cap.has_value(), "FAILSAFE_CPU_ISA is one of avx512, avx2, generic");
      best = std::min(best, *cap);
    }
    return best;
  }();
  return isa;
}

CpuIsa GemmIsaFor(std::optional<CpuIsa> requested) {
  if (!requested) return GemmIsa();
  const CpuFeatures& f = HostCpuFeatures();
  CpuIsa isa = *requested;
  while (isa != CpuIsa::kGeneric && !CpuSupports(f, isa))
    isa = static_cast<CpuIsa>(static_cast<int>(isa) - 1);
  return isa;
}

int GemmTileRows(CpuIsa isa) { return KernelsFor(isa).tile_rows; }

void SiluMulRow(const float* g, const float* u, float* out, int n, std::optional<CpuIsa> isa) {
  KernelsFor(GemmIsaFor(isa)).silu_mul(g, u, out, n);
}

void ExpShifted(float* row, int n, float shift, std::optional<CpuIsa> isa) {
  KernelsFor(GemmIsaFor(isa)).exp_shifted(row, n, shift);
}

void RoundRowToBf16(const float* src, float* dst, int n, std::optional<CpuIsa> isa) {
  KernelsFor(GemmIsaFor(isa)).round_bf16(src, dst, n);
}

void PackBf16Pairs(const float* xs, uint32_t* words, int64_t n, std::optional<CpuIsa> isa) {
  KernelsFor(GemmIsaFor(isa)).pack_pairs(xs, words, n);
}

void SoftmaxRow(float* row, int width, int lo, int hi, float scale, std::optional<CpuIsa> isa) {
  KernelsFor(GemmIsaFor(isa)).softmax(row, width, lo, hi, scale);
}

void Gemm(const GemmArgs& a) {
  if (a.m <= 0 || a.n <= 0) return;
  if (a.k <= 0) {
    if (a.out == GemmOut::kStore) {
      for (int i = 0; i < a.m; ++i)
        std::memset(a.y + static_cast<int64_t>(i) * a.ldy, 0, sizeof(float) * a.n);
    }
    return;
  }
  FS_CHECK_MSG(!a.w_blocked16 || !a.w_rows, "a blocked weight is not given by rows");
  FS_CHECK_MSG(!a.w_blocked16 || !a.nt || (a.w_item_rows >= 0 && a.n % BlockedItemRows(a) == 0),
               "a blocked nt weight has n a multiple of its item's rows");
  FS_CHECK_MSG(!a.w_blocked16 || a.nt || a.out == GemmOut::kFixedItems,
               "a blocked nn weight is multiplied in fixed-point items");
  FS_CHECK_MSG(a.out != GemmOut::kFixedItems || (!a.nt && a.item_k > 0 && a.k % a.item_k == 0),
               "fixed-point items are nn, with k a multiple of item_k");
  const CpuIsa isa = GemmIsaFor(a.isa);
  const GemmKernels& kern = KernelsFor(isa);
  KernelArgs ka;
  static_cast<GemmArgs&>(ka) = a;
  ka.ahead_bytes = DecodeAheadBytes();
  // Up to wide_rows rows of an nt product on a blocked weight read it once
  // for all of them (DirectWide): f32, and bf16 by fused multiply-adds (each
  // pair widened once for every row) unless vdpbf16ps is asked for (and runs
  // here) or, unset, outruns them in register tiles (GemmDpbf16TilesFor). On
  // a Xeon that runs vdpbf16ps at a quarter of their rate: 1.6-1.8x at 16
  // rows.
  const bool wide = a.nt && a.w_blocked16 && a.m > kDirectRows && a.m <= kern.wide_rows &&
                    (a.wtype == DType::kF32 ||
                     (a.wtype == DType::kBF16 &&
                      !(a.dpbf16 ? *a.dpbf16 && GemmDpbf16For(isa) : GemmDpbf16TilesFor(isa))));
  FS_CHECK_MSG(!a.w_rows || a.wtype != DType::kF16, "weights given by rows are f32 or bf16");
  // bf16 rows given by pointer take the f32 chain (BF16Wide): x as it is.
  const bool bf16_chain = a.wtype == DType::kBF16 && !a.w_rows;
  if (bf16_chain) {
    // Unset: by vdpbf16ps where few rows stream weights from memory
    // (decode), and in register tiles where it outruns fused multiply-adds
    // (GemmDpbf16TilesFor) or where the tiles' widening of a plain product's
    // weight is shared by too few rows to pay (up to kDpbf16Rows). Tiles of
    // fixed-point items widen each pair in registers for all their rows.
    const bool few = a.m <= kDirectRows || (a.out != GemmOut::kFixedItems && a.m <= kDpbf16Rows);
    ka.dpbf16 =
        !wide && (a.dpbf16 ? *a.dpbf16 : few || GemmDpbf16TilesFor(isa)) && GemmDpbf16For(isa);
  }
  const int64_t work = static_cast<int64_t>(a.m) * a.n * a.k;
  const int threads = work < (1 << 18) ? 1 : std::max(1, a.threads);
  if (bf16_chain) RoundActivations(&ka, kern, threads);
  if (wide) PackKMajor(&ka);
  if (!a.nt && a.w_blocked16) return ColumnBlockedItems(ka, kern, threads);
  // Threads take runs of whole output columns (UnitShares): no element is
  // split.
  if (a.nt && (a.m <= kDirectRows || wide)) {
    if (threads == 1) return kern.direct(ka, 0, a.n);
    // Units of 16 columns (blocked: the blocks and tails of the items).
    const int units =
        a.w_blocked16 ? a.n / BlockedItemRows(a) * BlockedUnitsPerItem(a) : (a.n + 15) / 16;
    return ShareOut(units, threads, [&](int u0, int u1) {
      if (a.w_blocked16) {
        kern.direct(ka, BlockedUnitColumn(a, u0), BlockedUnitColumn(a, u1));
      } else {
        kern.direct(ka, 16 * u0, std::min(a.n, 16 * u1));
      }
    });
  }
  if (!a.nt && a.m <= kStreamRows) {
    // Rows of weights stream by in long runs (what memory serves best), into
    // accumulators that stay in the first-level cache.
    const int max_cols = kStreamCols / a.m;
    const int blocks = (a.n + max_cols - 1) / max_cols;
    const int items = a.out == GemmOut::kFixedItems && !a.w_rows ? a.k / a.item_k : 0;
    if (threads > 1 && blocks < threads && items >= threads) {
      return SplitItems(ka, threads, items, [&kern, max_cols](const KernelArgs& mine) {
        for (int c0 = 0; c0 < mine.n; c0 += max_cols)
          kern.stream(mine, c0, std::min(max_cols, mine.n - c0), Scratch(StreamScratchFloats()));
      });
    }
    static_assert(kStreamCols / kStreamRows >= 16);
    const int step = max_cols / 16 * 16;  // blocks start on a 16-column unit
    auto run = [&](int u0, int u1) {
      for (int c0 = 16 * u0; c0 < std::min(a.n, 16 * u1); c0 += step)
        kern.stream(ka, c0, std::min({step, a.n - c0, 16 * u1 - c0}),
                    Scratch(StreamScratchFloats()));
    };
    return ShareOut((a.n + 15) / 16, threads, run, kUnitShareTakes, step / 16);
  }
  if (!a.nt && a.out == GemmOut::kFixedItems && !a.w_rows && a.m <= kItemRows) {
    // Each item's weight rows read whole (batched decode's o and down
    // projections), the threads taking whole items.
    const int items = a.k / a.item_k;
    auto work = [&kern](const KernelArgs& mine) {
      kern.item_panels(mine, Scratch(ItemScratchFloats(mine)));
    };
    if (threads > 1 && items >= threads) return SplitItems(ka, threads, items, work);
    return work(ka);
  }
  const int panels = a.w_blocked16 ? BlockedPanels(ka) : (a.n + kNR - 1) / kNR;
  auto run = [&](int p0, int p1) {
    float* packed = Scratch(PanelScratchFloats(ka));
    for (int p = p0; p < p1; ++p) kern.panel(ka, p, packed);
  };
  ShareOut(panels, threads, run);
}

}  // namespace failsafe::cpu
