// Whole panels and items of every weight layout: bf16 pairs, column-blocked
// panels, packed panels and item panels, each run over the register tiles.
// Part of the GEMM's kernel body: gemm_impl.h includes it once per
// instruction-set level, in order, inside an unnamed namespace; not a
// header of its own.
#pragma once

namespace failsafe::cpu {
namespace {

#if defined(__AVX512F__)
// The first `cols` (up to 32) columns' mask.
inline __mmask32 ColumnMask(int cols) {
  return cols >= 32 ? ~__mmask32{0} : (__mmask32{1} << cols) - 1;
}

// 32 columns of rows `even` and `odd` (nullptr: a padding slot, zero) as
// two vectors of pairs at dst: lane q of the first holds column q of each
// (even low), of the second column 16 + q.
inline void StorePairs(const BF16* even, const BF16* odd, __mmask32 mask, BF16* dst) {
  typedef int16_t S32 __attribute__((vector_size(64)));
  auto idx = [](int base) {
    S32 v;
    for (int q = 0; q < 16; ++q) {
      v[2 * q] = static_cast<int16_t>(base + q);
      v[2 * q + 1] = static_cast<int16_t>(32 + base + q);
    }
    return reinterpret_cast<__m512i>(v);
  };
  const __m512i e = _mm512_maskz_loadu_epi16(mask, even);
  const __m512i o = odd ? _mm512_maskz_loadu_epi16(mask, odd) : _mm512_setzero_si512();
  _mm512_storeu_si512(dst, _mm512_permutex2var_epi16(e, idx(0), o));
  _mm512_storeu_si512(dst + 32, _mm512_permutex2var_epi16(e, idx(16), o));
}

// Columns [j0, j0 + cols) of a bf16 [k, n] weight packed in pairs for
// vdpbf16ps (Panel::slot_pairs): for each pair of the chains' slots, rows kk
// and kk + 1 interleaved (kk's value in the low half of each lane; zero for
// a padding slot), 16 columns per vector, two vectors (32 columns) per pair.
inline void PackPairsNN(const KernelArgs& a, int j0, int cols, BF16* out) {
  const __mmask32 mask = ColumnMask(cols);
  const int padded = (a.chain_k + 1) & ~1;
  for (int c = 0; c < a.k / a.chain_k; ++c) {
    for (int s = 0; s < padded; s += 2) {
      const int kk = c * a.chain_k + s;
      PrefetchPackRows<BF16>(a, kk, 2, j0);
      StorePairs(WRow<BF16>(a, kk) + j0, s + 1 < a.chain_k ? WRow<BF16>(a, kk + 1) + j0 : nullptr,
                 mask, out + (static_cast<int64_t>(c) * padded + s) / 2 * 64);
    }
  }
}
#endif

// Panel `panel` of a column-blocked bf16 weight in fixed-point items (nn,
// GemmArgs::w_blocked16; item_k even, the panel's columns whole blocks of
// 16), every row and every item by vdpbf16ps: each item's two blocks are
// its pairs as packing would lay them (Panel::slot_pairs), read where they
// lie, items Panel::item_step apart.
#if defined(__AVX512F__)
inline void ColumnBlockedPanel(const KernelArgs& a, int panel) {
  const int j0 = panel * kNR, cols = std::min(kNR, a.n - j0);
  const BF16* b0 = static_cast<const BF16*>(a.w) + static_cast<int64_t>(j0) * a.item_k;
  Panel<BF16> p{b0, cols > 16 ? b0 + 16 * static_cast<int64_t>(a.item_k) : b0, 16, cols};
  p.slot_pairs = true;
  p.item_step = static_cast<int64_t>(a.n) * a.item_k;
  PanelRows<true>(a, j0, p);
}

// GemmKernels::column_panels. (Item after item, each over all the panels,
// which reads each item's part of them as one run of memory, was slower:
// every item then adds to every row's sums of all the panels.)
inline void ColumnBlockedPanels(const KernelArgs& a, int p0, int p1) {
  for (int p = p0; p < p1; ++p) ColumnBlockedPanel(a, p);
}
#endif

// Panel `panel` of a column-blocked weight in fixed-point items (nn,
// GemmArgs::w_blocked16), its 32 columns two whole blocks of 16 in every
// item, by fused multiply-adds: each item's two blocks widened into one
// packed panel over all of k, item after item (k-value kk at packed + kk *
// kNR, as Pack lays out a row-major weight's panel), then every row's
// tiles over it, every item in one pass (GemmKernels::column_widened).
// Item after item, each over the panel alone, stored and reloaded every
// row's sums once per item: 0.6x at 512 rows.
template <typename W>
void ColumnWidenedPanel(const KernelArgs& a, int panel, float* packed) {
  const int j0 = panel * kNR;
  const W* w = static_cast<const W*>(a.w);
  for (int c = 0; c < a.k / a.item_k; ++c) {
    const W* b0 = w + (static_cast<int64_t>(c) * a.n + j0) * a.item_k;
    float* dst = packed + static_cast<int64_t>(c) * a.item_k * kNR;
    WidenBlock(b0, a.item_k, dst);
    WidenBlock(b0 + 16 * static_cast<int64_t>(a.item_k), a.item_k, dst + 16);
  }
  WidenedPanelRows<W>(a, j0, Panel<float>{packed, packed + 16, kNR, kNR});
}

template <typename W>
void PackedPanel(const KernelArgs& a, int panel, float* packed) {
  if (a.w_blocked16) return BlockedPanel<W>(a, panel, packed);
  const int j0 = panel * kNR, cols = std::min(kNR, a.n - j0);
#if defined(__AVX512F__)
  if constexpr (kPairs<W>) {
    if (a.dpbf16 && !a.nt) {
      BF16* pairs = reinterpret_cast<BF16*>(packed);
      PackPairsNN(a, j0, cols, pairs);
      Panel<BF16> p{pairs, pairs + 32, 32, cols};
      p.slot_pairs = true;
      PanelRows<true>(a, j0, p);
      return;
    }
  }
#endif
  Pack<W>(a, j0, cols, packed);
  WidenedPanelRows<W>(a, j0, Panel<float>{packed, packed + 16, kNR, cols});
}

// nn in fixed-point items with more rows than Stream takes (batched
// decode's o and down projections): a block of columns at a time
// (ItemBlockCols), item after item, the item's weight rows in the block read
// as runs of memory into every panel's layout in `packed`, where the tiles
// of all the rows then find them in the first-level cache. Packing a panel
// over all of k instead reads a line or two per weight row, rows a whole row
// apart; an item's whole rows at once (no blocks) packed more than the
// second-level cache holds for the o projection's items of 64 rows.
//
// Each row's read also asks for the same columns of the next row (pair):
// rows of 2 or 4 KiB are streams too short for the hardware prefetchers to
// learn (bf16 batch-16 o and down projections about 15% faster on a Zen 5).
//
// The layout of one item's panels: f32, panel P's k-value kk at
// packed + (P * item_k + kk) * kNR; bf16 for vdpbf16ps, panel P's pairs
// (Panel::slot_pairs) at packed + P * padded * kNR halves, padded the
// item's slots.

// A panel's columns (kNR) of a weight row into the cache.
template <typename W>
FS_INLINE void PrefetchColumns(const W* p) {
  __builtin_prefetch(p);
  if constexpr (sizeof(W) * kNR > 64) __builtin_prefetch(p + 64 / sizeof(W));
}

template <typename W>
void PackItemRows(const KernelArgs& one, float* packed) {
  const int panels = (one.n + kNR - 1) / kNR, last = one.n - (panels - 1) * kNR;
  for (int kk = 0; kk < one.k; ++kk) {
    const W* src = WRow<W>(one, kk);
    const W* next = kk + 1 < one.k ? WRow<W>(one, kk + 1) : nullptr;
    for (int P = 0; P < panels; ++P, src += kNR) {
      if (next) PrefetchColumns(next + P * kNR);
      float* dst = packed + (static_cast<int64_t>(P) * one.k + kk) * kNR;
      if (P + 1 < panels || last == kNR) {
        Store(dst, Load(src));
        Store(dst + 16, Load(src + 16));
        continue;
      }
      int c = 0;
      for (; c + 16 <= last; c += 16) Store(dst + c, Load(src + c));
      for (; c < last; ++c) dst[c] = Widen(src[c]);
      std::memset(dst + last, 0, sizeof(float) * (kNR - last));
    }
  }
}

#if defined(__AVX512F__)
// The same for vdpbf16ps: rows kk and kk + 1 of each pair of slots
// interleaved as PackPairsNN does, a padding slot's row zero.
inline void PackItemPairs(const KernelArgs& one, BF16* packed) {
  const int panels = (one.n + kNR - 1) / kNR, last = one.n - (panels - 1) * kNR;
  const int padded = (one.k + 1) & ~1;
  for (int s = 0; s < padded; s += 2) {
    const BF16* even = WRow<BF16>(one, s);
    const BF16* odd = s + 1 < one.k ? WRow<BF16>(one, s + 1) : nullptr;
    BF16* dst = packed + static_cast<int64_t>(s) * kNR;
    const bool ahead = s + 3 < one.k;  // the next pair's rows
    for (int P = 0; P < panels; ++P, dst += static_cast<int64_t>(padded) * kNR) {
      if (ahead) {
        PrefetchColumns(even + 2 * one.ldw + P * kNR);
        PrefetchColumns(odd + 2 * one.ldw + P * kNR);
      }
      StorePairs(even + P * kNR, odd ? odd + P * kNR : nullptr,
                 ColumnMask(P + 1 < panels ? kNR : last), dst);
    }
  }
}
#endif

// Columns [0, a.n) (ItemBlockCols at most), item after item.
template <typename W>
void ItemPanelsBlock(const KernelArgs& a, float* packed) {
  const int panels = (a.n + kNR - 1) / kNR;
  for (int c = 0; c < a.k / a.item_k; ++c) {
    const KernelArgs one = ItemsCut(a, c, 1);
#if defined(__AVX512F__)
    if constexpr (kPairs<W>) {
      if (a.dpbf16) {
        BF16* pairs = reinterpret_cast<BF16*>(packed);
        const int padded = (a.item_k + 1) & ~1;
        PackItemPairs(one, pairs);
        for (int P = 0; P < panels; ++P) {
          const BF16* b0 = pairs + static_cast<int64_t>(P) * padded * kNR;
          Panel<BF16> p{b0, b0 + 32, 32, std::min(kNR, a.n - P * kNR)};
          p.slot_pairs = true;
          PanelRows<true>(one, P * kNR, p);
        }
        continue;
      }
    }
#endif
    PackItemRows<W>(one, packed);
    for (int P = 0; P < panels; ++P) {
      const float* b0 = packed + static_cast<int64_t>(P) * one.k * kNR;
      PanelRows<kPairs<W>>(one, P * kNR,
                           Panel<float>{b0, b0 + 16, kNR, std::min(kNR, a.n - P * kNR)});
    }
  }
}

template <typename W>
void ItemPanels(const KernelArgs& a, float* packed) {
  const int block = ItemBlockCols(a);
  for (int j0 = 0; j0 < a.n; j0 += block) {
    KernelArgs cols = a;
    cols.n = std::min(block, a.n - j0);
    cols.w = static_cast<const W*>(a.w) + j0;
    cols.acc = a.acc + j0;
    ItemPanelsBlock<W>(cols, packed);
  }
}

}  // namespace
}  // namespace failsafe::cpu
