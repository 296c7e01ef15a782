// The GEMM's instruction-set levels and weight types against each other: the
// same chains of fused multiply-adds, so bit for bit the same results.
#include "backend/cpu/gemm.h"

#include <gtest/gtest.h>
#include <xmmintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <optional>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/kernels.h"
#include "common/fixed_point.h"
#include "common/rng.h"

namespace failsafe::cpu {
namespace {

std::vector<float> Random(size_t n, uint64_t seed) {
  Rng r(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(r.Normal());
  return v;
}

// The levels this CPU runs (the generic one always).
std::vector<CpuIsa> Levels() {
  std::vector<CpuIsa> out;
  for (CpuIsa isa : {CpuIsa::kGeneric, CpuIsa::kAvx2, CpuIsa::kAvx512})
    if (CpuSupports(HostCpuFeatures(), isa)) out.push_back(isa);
  return out;
}

// vdpbf16ps off with one thread, on (where it computes the chain) with two,
// Gemm's own choice by rows and CPU with three.
std::optional<bool> Dpbf16ByThreads(int threads) {
  if (threads == 3) return std::nullopt;
  return threads >= 2;
}

struct Case {
  bool nt;
  int m, n, k;
  GemmOut out;
  int item_k;  // kFixedItems
};

// Output of one Gemm call: y as float bits, or the fixed-point sums.
std::vector<int64_t> RunGemm(const Case& c, const std::vector<float>& x, const void* w, DType wtype,
                             CpuIsa isa, int threads, bool blocked = false, int item_rows = 0,
                             std::optional<bool> dpbf16 = true) {
  GemmArgs a;
  a.dpbf16 = dpbf16;
  a.x = x.data();
  a.ldx = c.k + 1;
  a.w = w;
  a.wtype = wtype;
  a.ldw = c.nt ? c.k : c.n;
  a.nt = c.nt;
  a.m = c.m;
  a.n = c.n;
  a.k = c.k;
  a.out = c.out;
  a.threads = threads;
  a.isa = isa;
  a.item_k = c.item_k;
  a.w_blocked16 = blocked;
  a.w_item_rows = item_rows;
  const int64_t ld = c.n + 3;
  std::vector<float> y = Random(static_cast<size_t>(c.m) * ld, 99);
  std::vector<int64_t> acc(static_cast<size_t>(c.m) * ld, 12345);
  a.y = y.data();
  a.ldy = ld;
  a.acc = acc.data();
  a.ldacc = ld;
  Gemm(a);
  if (c.out == GemmOut::kFixedItems) return acc;
  std::vector<int64_t> bits(y.size());
  for (size_t i = 0; i < y.size(); ++i) {
    uint32_t u;
    std::memcpy(&u, &y[i], 4);
    bits[i] = u;
  }
  return bits;
}

// Shapes that reach every path: few rows of nt (direct) and nn (stream),
// register tiles with row and column tails, k with and without a tail of 16.
std::vector<Case> Cases() {
  std::vector<Case> out;
  for (bool nt : {true, false}) {
    for (int m : {1, 3, 4, 5, 11, 33}) {
      for (auto [n, k] :
           {std::pair{40, 37}, std::pair{48, 57}, std::pair{97, 64}, std::pair{130, 160}}) {
        out.push_back({nt, m, n, k, GemmOut::kStore, 0});
        out.push_back({nt, m, n, k, GemmOut::kAccumulate, 0});
      }
      if (!nt) {
        out.push_back({nt, m, 70, 96, GemmOut::kFixedItems, 32});
        out.push_back({nt, m, 37, 99, GemmOut::kFixedItems, 33});  // odd items: bf16 pads each
        out.push_back({nt, m, 130, 99, GemmOut::kFixedItems, 33});
        // Enough work for two threads: with up to kItemRows rows they share
        // out the items.
        if (m <= 11) out.push_back({nt, m, 300, 990, GemmOut::kFixedItems, 33});
        if (m == 11) {
          out.push_back({nt, m, 64, 66, GemmOut::kFixedItems, 33});  // whole panels
          // Several blocks of columns (ItemBlockCols) at every level.
          out.push_back({nt, m, 1100, 99, GemmOut::kFixedItems, 33});
        }
      }
    }
  }
  return out;
}

TEST(GemmLevels, EveryLevelComputesTheSameChains) {
  const auto levels = Levels();
  ASSERT_GE(levels.size(), 1u);
  for (const Case& c : Cases()) {
    auto x = Random(static_cast<size_t>(c.m) * (c.k + 1), 1);
    auto w = Random(static_cast<size_t>(c.n) * c.k, 2);
    const auto want = RunGemm(c, x, w.data(), DType::kF32, CpuIsa::kGeneric, 1);
    for (CpuIsa isa : levels) {
      for (int threads : {1, 2, 3}) {
        EXPECT_EQ(RunGemm(c, x, w.data(), DType::kF32, isa, threads), want)
            << CpuIsaName(isa) << " nt=" << c.nt << " m=" << c.m << " n=" << c.n << " k=" << c.k
            << " out=" << static_cast<int>(c.out) << " threads=" << threads;
      }
    }
  }
}

// f16 weights give exactly what their f32 values give, on every level.
TEST(GemmLevels, F16WeightsComputeTheChainsOfTheirF32Values) {
  for (const Case& c : Cases()) {
    auto x = Random(static_cast<size_t>(c.m) * (c.k + 1), 3);
    auto w = Random(static_cast<size_t>(c.n) * c.k, 4);
    std::vector<uint16_t> w16(w.size());
    std::vector<float> widened(w.size());
    for (size_t i = 0; i < w.size(); ++i) {
      w16[i] = FloatToHalf(w[i]);
      widened[i] = HalfToFloat(w16[i]);
    }
    // Values the f16 conversion must get right: subnormals, zero signs, large.
    const uint16_t special[] = {0x0001, 0x03ff, 0x8000, 0x8001, 0x7bff, 0xfbff, 0x0400};
    for (size_t i = 0; i < std::size(special) && i * 7 < w16.size(); ++i) {
      w16[i * 7] = special[i];
      widened[i * 7] = HalfToFloat(special[i]);
    }
    const auto want = RunGemm(c, x, widened.data(), DType::kF32, CpuIsa::kGeneric, 1);
    for (CpuIsa isa : Levels()) {
      EXPECT_EQ(RunGemm(c, x, w16.data(), DType::kF16, isa, 2), want)
          << CpuIsaName(isa) << " nt=" << c.nt << " m=" << c.m << " n=" << c.n << " k=" << c.k;
    }
  }
}

// The bf16 chain (gemm.h) by hand, element by element: x rounded to bf16,
// each chain (k, or an item) in pairs from its start, a lone last value
// after a zero pair, odd before even, denormals flushed (MXCSR DAZ and FTZ
// around scalar fused multiply-adds). w: the bf16 weights' values, [n, k]
// (nt) or [k, n]. The same output as RunGemm's.
std::vector<int64_t> Bf16Chains(const Case& c, const std::vector<float>& x,
                                const std::vector<float>& w) {
  const int64_t ld = c.n + 3;
  std::vector<float> y = Random(static_cast<size_t>(c.m) * ld, 99);
  std::vector<int64_t> acc(static_cast<size_t>(c.m) * ld, 12345);
  const int chain = c.out == GemmOut::kFixedItems ? c.item_k : c.k;
  auto weight = [&](int j, int kk) {
    return c.nt ? w[static_cast<size_t>(j) * c.k + kk] : w[static_cast<size_t>(kk) * c.n + j];
  };
  const unsigned saved = _mm_getcsr();
  _mm_setcsr(saved | 0x8040);
  for (int i = 0; i < c.m; ++i) {
    for (int j = 0; j < c.n; ++j) {
      float& out = y[static_cast<size_t>(i * ld + j)];
      for (int k0 = 0; k0 < c.k; k0 += chain) {
        float s = c.out == GemmOut::kAccumulate ? out : 0.0f;
        for (int kk = k0; kk < k0 + chain; kk += 2) {
          const bool lone = kk + 1 == k0 + chain;
          const float xo =
              lone ? 0.0f : RoundToBf16(x[static_cast<size_t>(i) * (c.k + 1) + kk + 1]);
          s = std::fma(xo, lone ? 0.0f : weight(j, kk + 1), s);
          s = std::fma(RoundToBf16(x[static_cast<size_t>(i) * (c.k + 1) + kk]), weight(j, kk), s);
        }
        if (c.out == GemmOut::kFixedItems) {
          int64_t& a = acc[static_cast<size_t>(i * ld + j)];
          a = AddFixed(a, ToFixed(s));
        } else {
          out = s;
        }
      }
    }
  }
  _mm_setcsr(saved);
  if (c.out == GemmOut::kFixedItems) return acc;
  std::vector<int64_t> bits(y.size());
  for (size_t i = 0; i < y.size(); ++i) {
    uint32_t u;
    std::memcpy(&u, &y[i], 4);
    bits[i] = u;
  }
  return bits;
}

// bf16 weights take the bf16 chain on every path, level, thread count and
// number of rows, with vdpbf16ps and without: a row's result is that chain
// whatever the batch (batch invariance) and the same bits everywhere.
TEST(GemmLevels, Bf16WeightsComputeTheBf16ChainEverywhere) {
  for (const Case& c : Cases()) {
    auto x = Random(static_cast<size_t>(c.m) * (c.k + 1), 3);
    auto w = Random(static_cast<size_t>(c.n) * c.k, 4);
    std::vector<uint16_t> w16(w.size());
    std::vector<float> values(w.size());
    for (size_t i = 0; i < w.size(); ++i) {
      w16[i] = FloatToBFloat16(w[i]);
      values[i] = BFloat16ToFloat(w16[i]);
    }
    const auto want = Bf16Chains(c, x, values);
    for (CpuIsa isa : Levels()) {
      for (int threads : {1, 2, 3}) {
        for (std::optional<bool> dp :
             {std::optional<bool>(false), std::optional<bool>(true), std::optional<bool>()}) {
          EXPECT_EQ(RunGemm(c, x, w16.data(), DType::kBF16, isa, threads, false, 0, dp), want)
              << CpuIsaName(isa) << " nt=" << c.nt << " m=" << c.m << " n=" << c.n << " k=" << c.k
              << " out=" << static_cast<int>(c.out) << " threads=" << threads
              << " dpbf16=" << (dp ? (*dp ? "on" : "off") : "default");
        }
      }
    }
  }
}

// Denormals, tiny products, signed zeros and infinities: flushed and
// propagated alike on every path (activations and weights near 2^-63, whose
// products and sums cross 2^-126).
TEST(GemmLevels, Bf16ChainFlushesDenormalsAlikeEverywhere) {
  Rng r(17);
  auto tiny = [&r] {
    const double e = -70.0 + 14.0 * r.Uniform();
    return static_cast<float>((r.Uniform() < 0.5 ? -1 : 1) * std::ldexp(1.0 + r.Uniform(), e));
  };
  for (const Case& c :
       {Case{true, 3, 40, 37, GemmOut::kStore, 0}, Case{true, 11, 97, 64, GemmOut::kAccumulate, 0},
        Case{true, 16, 40, 37, GemmOut::kStore, 0}, Case{true, 6, 97, 64, GemmOut::kAccumulate, 0},
        Case{false, 2, 48, 57, GemmOut::kStore, 0}, Case{false, 33, 130, 160, GemmOut::kStore, 0},
        Case{false, 5, 37, 99, GemmOut::kFixedItems, 33},
        Case{false, 11, 130, 99, GemmOut::kFixedItems, 33},
        Case{false, 11, 300, 990, GemmOut::kFixedItems, 33},
        Case{false, 1, 130, 99, GemmOut::kFixedItems, 33},
        Case{false, 1, 300, 990, GemmOut::kFixedItems, 33}}) {
    std::vector<float> x(static_cast<size_t>(c.m) * (c.k + 1));
    for (auto& v : x) v = tiny();
    std::vector<uint16_t> w16(static_cast<size_t>(c.n) * c.k);
    std::vector<float> values(w16.size());
    for (size_t i = 0; i < w16.size(); ++i) {
      w16[i] = FloatToBFloat16(tiny());
      if (i % 13 == 0) w16[i] = static_cast<uint16_t>(0x0001 + i % 0x7f);  // denormal
      if (i % 29 == 0) w16[i] = 0x8000;                                    // -0
      values[i] = BFloat16ToFloat(w16[i]);
    }
    x[5] = 1e-41f;  // a denormal activation
    x[7] = INFINITY;
    const auto want = Bf16Chains(c, x, values);
    // nt weights also blocked (one item), as the engine holds them: decode's
    // and batched decode's direct kernels (DirectWide) read them.
    std::vector<uint16_t> blocked(w16.size());
    for (size_t e = 0; e < w16.size(); ++e) {
      const int r = static_cast<int>(e / c.k), kk = static_cast<int>(e % c.k);
      blocked[Blocked16Index(r, kk, c.n, c.k, DType::kBF16)] = w16[e];
    }
    for (CpuIsa isa : Levels()) {
      for (bool dp : {false, true}) {
        EXPECT_EQ(RunGemm(c, x, w16.data(), DType::kBF16, isa, 2, false, 0, dp), want)
            << CpuIsaName(isa) << " nt=" << c.nt << " m=" << c.m << " dpbf16=" << dp;
        if (!c.nt) continue;
        EXPECT_EQ(RunGemm(c, x, blocked.data(), DType::kBF16, isa, 1, true, 0, dp), want)
            << CpuIsaName(isa) << " blocked, m=" << c.m << " dpbf16=" << dp;
      }
    }
  }
}

// Many items whose sums near 2^53 in the fixed-point unit: each is exact on
// every path, whether a level's split sums take a value whole or split it
// (AVX2's FixedSplitAdd takes whole values only below a bound that keeps
// its double lanes exact for that many items: the register tiles of m = 33
// sum all 100 items at once, fewer rows an item at a time). Each row: 99
// items of one large value (just under the bound for 100 items, or twice
// it), one of a value whose fixed-point form is 1.
TEST(GemmLevels, ManyLargeItemsSumExactly) {
  const int item_k = 2, items = 100, k = item_k * items;
  const float tiny = std::ldexp(1.5f, -32);                    // ToFixed: 1
  for (const float large : {16256.0f, 32512.0f, -16256.0f}) {  // all exact in bf16
    for (int m : {5, 11, 33}) {
      for (int n : {32, 37}) {
        const Case c{false, m, n, k, GemmOut::kFixedItems, item_k};
        std::vector<float> x(static_cast<size_t>(m) * (k + 1), 0.0f);
        std::vector<float> w(static_cast<size_t>(k) * n, 1.0f);
        std::vector<uint16_t> w16(w.size(), FloatToBFloat16(1.0f));
        std::vector<int64_t> want(static_cast<size_t>(m) * (n + 3), 12345);
        for (int i = 0; i < m; ++i) {
          for (int it = 0; it < items; ++it) {
            const float v = it == (i * 7) % items ? tiny : large;
            x[static_cast<size_t>(i) * (k + 1) + it * item_k + (i + it) % item_k] = v;
            for (int j = 0; j < n; ++j) {
              int64_t& s = want[static_cast<size_t>(i) * (n + 3) + j];
              s = AddFixed(s, ToFixed(v));
            }
          }
        }
        for (CpuIsa isa : Levels()) {
          EXPECT_EQ(RunGemm(c, x, w.data(), DType::kF32, isa, 1), want)
              << CpuIsaName(isa) << " f32 large=" << large << " m=" << m << " n=" << n;
          EXPECT_EQ(RunGemm(c, x, w16.data(), DType::kBF16, isa, 2, false, 0, false), want)
              << CpuIsaName(isa) << " bf16 large=" << large << " m=" << m << " n=" << n;
        }
      }
    }
  }
}

// vdpbf16ps computes the bf16 chain's pairs bit for bit on CPUs that have it
// (the start-up probe, Dpbf16MatchesChain), so the avx512 level uses it.
TEST(GemmLevels, Dpbf16IsUsedWhereItComputesTheChain) {
  if (!HostCpuFeatures().avx512_bf16) {
    EXPECT_FALSE(GemmDpbf16For(CpuIsa::kAvx512));
    GTEST_SKIP() << "no AVX512_BF16 on this CPU";
  }
  EXPECT_TRUE(GemmDpbf16For(CpuIsa::kAvx512)) << HostCpuFeatures().model;
  EXPECT_FALSE(GemmDpbf16For(CpuIsa::kAvx2));
  EXPECT_FALSE(GemmDpbf16For(CpuIsa::kGeneric));
}

TEST(RoundToBf16, RoundsToNearestEvenAndKeepsNan) {
  auto bits = [](float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
  };
  auto from = [](uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  };
  EXPECT_EQ(bits(RoundToBf16(from(0x3f808000))), 0x3f800000u);  // tie to even (down)
  EXPECT_EQ(bits(RoundToBf16(from(0x3f818000))), 0x3f820000u);  // tie to even (up)
  EXPECT_EQ(bits(RoundToBf16(from(0x3f808001))), 0x3f810000u);
  EXPECT_EQ(bits(RoundToBf16(from(0x7f7fffff))), 0x7f800000u);  // overflows to infinity
  EXPECT_EQ(bits(RoundToBf16(-0.0f)), 0x80000000u);
  EXPECT_TRUE(std::isnan(RoundToBf16(from(0x7f800001))));  // a NaN whose payload is low
  EXPECT_EQ(bits(RoundToBf16(INFINITY)), 0x7f800000u);
  for (uint32_t u = 0x3f800000; u < 0x3f800000 + 70000; u += 7)
    EXPECT_EQ(BFloat16ToFloat(FloatToBFloat16(from(u))), RoundToBf16(from(u)));
}

// v as element `at` of a weight of type t at base.
void Put(DType t, float v, unsigned char* base, int64_t at) {
  const size_t esize = t == DType::kF32 ? 4 : 2;
  const uint16_t h = t == DType::kBF16 ? FloatToBFloat16(v) : FloatToHalf(v);
  std::memcpy(base + static_cast<size_t>(at) * esize,
              t == DType::kF32 ? static_cast<const void*>(&v) : &h, esize);
}

// The weight w (row-major) as bytes of type t twice: row-major, and with
// element e at stored(e). Exactly the weight's bytes, nothing after them, so
// that a read past the end would be caught by sanitizers.
struct TwoLayouts {
  std::vector<unsigned char> rows, stored;
};
template <typename Stored>
TwoLayouts InTwoLayouts(DType t, const std::vector<float>& w, Stored stored) {
  const size_t esize = t == DType::kF32 ? 4 : 2;
  TwoLayouts out{std::vector<unsigned char>(w.size() * esize),
                 std::vector<unsigned char>(w.size() * esize)};
  for (size_t e = 0; e < w.size(); ++e) {
    Put(t, w[e], out.rows.data(), static_cast<int64_t>(e));
    Put(t, w[e], out.stored.data(), stored(static_cast<int64_t>(e)));
  }
  return out;
}

// Weights stored blocked (read where they lie): items of any number of rows,
// each in blocks of 16 rows and a tail, k-major. The same chains as the
// row-major layout, every level, every weight type, one thread or two.
TEST(GemmLevels, BlockedWeightsComputeTheSameChains) {
  struct Items {
    int rows, count;  // item_rows (0: one item of `rows`), items
  };
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (int m : {1, 2, 4, 5, 9, 12, 16, 40}) {
      for (int k : {1, 37, 64, 100}) {
        // Panels across items (BlockedVectorAt), with more rows than
        // decode's: tails of up to 8 rows two to a vector (88, 24, 5, 100);
        // tails of more alone (76, 12, 25: 9 rows), a panel starting at one
        // (76); odd blocks per item, no tail (80); one item narrower than a
        // block (12).
        for (Items it : {Items{16, 1}, Items{48, 1}, Items{160, 1}, Items{88, 3}, Items{24, 2},
                         Items{5, 7}, Items{44, 1}, Items{100, 2}, Items{40, 120}, Items{76, 3},
                         Items{12, 5}, Items{80, 3}, Items{25, 3}, Items{12, 1}, Items{88, 24}}) {
          // More blocks than decode takes in one batch (kQuarterUnits: 240
          // and 120 tails), once per weight type.
          if (it.count == 120 && (m != 1 || k != 37)) continue;
          // Enough work for decode's few rows to be shared out over the
          // threads (each starting its batches inside an item), once, and
          // for batched decode's (DirectWide).
          if (it.count == 24 && ((m != 4 && m != 16) || k != 100)) continue;
          for (GemmOut out : {GemmOut::kStore, GemmOut::kAccumulate}) {
            const int n = it.rows * it.count;
            const Case c{true, m, n, k, out, 0};
            auto x = Random(static_cast<size_t>(m) * (k + 1), 7);
            auto w = Random(static_cast<size_t>(n) * k, 8);
            const auto [rows, blocked] = InTwoLayouts(t, w, [&](int64_t e) {
              const int64_t r = e / k, kk = e % k, item = r / it.rows;
              return item * it.rows * k + Blocked16Index(r % it.rows, kk, it.rows, k, t);
            });
            const auto want = RunGemm(c, x, rows.data(), t, CpuIsa::kGeneric, 1);
            for (CpuIsa isa : Levels()) {
              for (int threads : {1, 2, 3}) {
                EXPECT_EQ(RunGemm(c, x, blocked.data(), t, isa, threads, true,
                                  it.count > 1 ? it.rows : 0, Dpbf16ByThreads(threads)),
                          want)
                    << CpuIsaName(isa) << " type " << static_cast<int>(t) << " m=" << m << " items "
                    << it.count << "x" << it.rows << " k=" << k << " threads=" << threads;
              }
            }
          }
        }
      }
    }
  }
}

// [k, n] weights in fixed-point items stored column-blocked (each item as
// its transpose, blocked): the same sums as the row-major layout, every
// level, every weight type, one thread or two, with and without vdpbf16ps.
TEST(GemmLevels, ColumnBlockedItemsComputeTheSameSums) {
  struct Shape {
    int n, item_k, items;
  };
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (int m : {1, 2, 4, 5, 9, 33, 40}) {
      // Odd and even items; columns in whole panels, with a last lone block,
      // with a tail.
      for (Shape sh : {Shape{16, 1, 3}, Shape{37, 7, 2}, Shape{130, 33, 3}, Shape{64, 64, 4},
                       Shape{48, 10, 3}, Shape{130, 44, 3}, Shape{300, 33, 30}}) {
        if (sh.n == 300 && m > 9) continue;  // enough for two threads already
        const int n = sh.n, k = sh.item_k * sh.items;
        const Case c{false, m, n, k, GemmOut::kFixedItems, sh.item_k};
        auto x = Random(static_cast<size_t>(m) * (k + 1), 11);
        auto w = Random(static_cast<size_t>(k) * n, 12);
        const auto [rows, blocked] = InTwoLayouts(t, w, [&](int64_t e) {
          const int64_t kk = e / n, j = e % n, item = kk / sh.item_k;
          return item * n * sh.item_k + Blocked16Index(j, kk % sh.item_k, n, sh.item_k, t);
        });
        const auto want = RunGemm(c, x, rows.data(), t, CpuIsa::kGeneric, 1);
        for (CpuIsa isa : Levels()) {
          for (int threads : {1, 2, 3}) {
            EXPECT_EQ(
                RunGemm(c, x, blocked.data(), t, isa, threads, true, 0, Dpbf16ByThreads(threads)),
                want)
                << CpuIsaName(isa) << " type " << static_cast<int>(t) << " m=" << m << " n=" << n
                << " items " << sh.items << "x" << sh.item_k << " threads=" << threads;
          }
        }
      }
    }
  }
}

// Fixed-point items take each item's chain through ToFixed on every path:
// NaN counts as zero, infinities and sums past the limit are clamped to it,
// signed zeros and values below the fixed-point unit truncate toward zero,
// values either side of 2^19 (below it AVX2 converts eight lanes at once
// through double lanes) alone and among others. Each item's chain is one
// product (the other activations are zero), so its value is known; columns
// scale it by exact powers of two and signs. Row-major weights and
// column-blocked ones (read where they lie, decode's and batched decode's).
TEST(GemmLevels, FixedItemsTakeEachChainThroughToFixed) {
  const float specials[] = {NAN,
                            INFINITY,
                            -INFINITY,
                            kFixedLimit,
                            -kFixedLimit,
                            kFixedLimit * (1.0f + 1.0f / 128),
                            -kFixedLimit * 2,
                            1e30f,
                            -0.0f,
                            1e-41f,
                            std::ldexp(-1.0f, -32),
                            std::ldexp(1.5f, -33),
                            3.75f,
                            -1232.0f,
                            522240.0f,  // 2^19 - 2^11
                            -524288.0f,
                            528384.0f,   // 2^19 + 2^12
                            262144.0f};  // all exact in bf16, as its activations are
  const int n_specials = static_cast<int>(std::size(specials));
  const float col_scale[] = {1.0f, -1.0f, 0.5f, 2.0f, -0.25f};
  for (int m : {1, 5, 11, 16}) {
    for (int n : {16, 48, 37}) {
      const int item_k = 6, items = n_specials, k = item_k * items;  // every one in a row
      const Case c{false, m, n, k, GemmOut::kFixedItems, item_k};
      std::vector<float> x(static_cast<size_t>(m) * (k + 1), 0.0f);
      std::vector<float> w(static_cast<size_t>(k) * n);
      std::vector<uint16_t> w16(w.size());
      for (int kk = 0; kk < k; ++kk) {
        for (int j = 0; j < n; ++j) {
          w[static_cast<size_t>(kk) * n + j] = col_scale[(j + kk % item_k) % 5];
          w16[static_cast<size_t>(kk) * n + j] =
              FloatToBFloat16(w[static_cast<size_t>(kk) * n + j]);
        }
      }
      std::vector<int64_t> want(static_cast<size_t>(m) * (n + 3), 12345);
      for (int i = 0; i < m; ++i) {
        for (int it = 0; it < items; ++it) {
          const int kk = it * item_k + (i + it) % item_k;  // the item's one product
          const float v = specials[(i * items + it) % n_specials];
          x[static_cast<size_t>(i) * (k + 1) + kk] = v;
          for (int j = 0; j < n; ++j) {
            int64_t& s = want[static_cast<size_t>(i) * (n + 3) + j];
            s = AddFixed(s, ToFixed(v * w[static_cast<size_t>(kk) * n + j]));
          }
        }
      }
      TwoLayouts blocked[2];
      for (int b = 0; b < 2; ++b) {
        const DType t = b == 0 ? DType::kF32 : DType::kBF16;
        blocked[b] = InTwoLayouts(t, w, [&](int64_t e) {
          const int64_t kk = e / n, j = e % n, item = kk / item_k;
          return item * n * item_k + Blocked16Index(j, kk % item_k, n, item_k, t);
        });
      }
      for (CpuIsa isa : Levels()) {
        for (int threads : {1, 2, 3}) {
          EXPECT_EQ(RunGemm(c, x, w.data(), DType::kF32, isa, threads), want)
              << CpuIsaName(isa) << " f32 m=" << m << " n=" << n << " threads=" << threads;
          EXPECT_EQ(RunGemm(c, x, blocked[0].stored.data(), DType::kF32, isa, threads, true), want)
              << CpuIsaName(isa) << " f32 column-blocked m=" << m << " n=" << n
              << " threads=" << threads;
          for (bool dp : {false, true}) {
            EXPECT_EQ(RunGemm(c, x, w16.data(), DType::kBF16, isa, threads, false, 0, dp), want)
                << CpuIsaName(isa) << " bf16 m=" << m << " n=" << n << " threads=" << threads
                << " dpbf16=" << dp;
            EXPECT_EQ(
                RunGemm(c, x, blocked[1].stored.data(), DType::kBF16, isa, threads, true, 0, dp),
                want)
                << CpuIsaName(isa) << " bf16 column-blocked m=" << m << " n=" << n
                << " threads=" << threads << " dpbf16=" << dp;
          }
        }
      }
    }
  }
}

// Column-blocked bf16 items with denormals, tiny products, signed zeros and
// an infinity (as Bf16ChainFlushesDenormalsAlikeEverywhere, which takes
// row-major weights): the panels that read the pairs where they lie, by
// vdpbf16ps or widened, flush and clamp as the row-major chains do, on every
// choice of products and thread count.
TEST(GemmLevels, ColumnBlockedBf16ItemsFlushDenormalsAlike) {
  Rng r(23);
  auto tiny = [&r] {
    const double e = -70.0 + 14.0 * r.Uniform();
    return static_cast<float>((r.Uniform() < 0.5 ? -1 : 1) * std::ldexp(1.0 + r.Uniform(), e));
  };
  for (int m : {5, 11, 16}) {
    for (int item_k : {34, 64}) {
      const int n = 130, items = 3, k = item_k * items;
      const Case c{false, m, n, k, GemmOut::kFixedItems, item_k};
      std::vector<float> x(static_cast<size_t>(m) * (k + 1));
      for (auto& v : x) v = tiny();
      x[5] = 1e-41f;  // a denormal activation
      x[7] = INFINITY;
      std::vector<float> w(static_cast<size_t>(k) * n);
      for (size_t i = 0; i < w.size(); ++i) {
        w[i] = BFloat16ToFloat(FloatToBFloat16(tiny()));
        if (i % 13 == 0) w[i] = BFloat16ToFloat(static_cast<uint16_t>(0x0001 + i % 0x7f));
        if (i % 29 == 0) w[i] = -0.0f;
      }
      const auto [rows, blocked] = InTwoLayouts(DType::kBF16, w, [&](int64_t e) {
        const int64_t kk = e / n, j = e % n, item = kk / item_k;
        return item * n * item_k + Blocked16Index(j, kk % item_k, n, item_k, DType::kBF16);
      });
      const auto want = RunGemm(c, x, rows.data(), DType::kBF16, CpuIsa::kGeneric, 1);
      for (CpuIsa isa : Levels()) {
        for (int threads : {1, 2}) {
          for (std::optional<bool> dp :
               {std::optional<bool>(false), std::optional<bool>(true), std::optional<bool>()}) {
            EXPECT_EQ(RunGemm(c, x, blocked.data(), DType::kBF16, isa, threads, true, 0, dp), want)
                << CpuIsaName(isa) << " m=" << m << " item_k=" << item_k << " threads=" << threads
                << " dpbf16=" << (dp ? (*dp ? "on" : "off") : "default");
          }
        }
      }
    }
  }
}

// The blocked layout gives every element its own place within its block
// (rows / 16 blocks of 16 rows, then a tail of rows % 16), no padding; bf16
// holds k-values kk, kk + 1 (kk even) of a row in one 32-bit lane, at the
// place f32 holds kk's values.
TEST(Blocked16Layout, EveryElementHasItsPlaceAndBf16PairsKValues) {
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (int k : {1, 2, 7, 64}) {
      for (int n : {16, 32, 44, 88, 5, 500}) {
        const int full = n / 16 * 16;
        std::vector<int> seen(static_cast<size_t>(n) * k, 0);
        for (int r = 0; r < n; ++r) {
          const int64_t width = r < full ? 16 : n - full;
          const int64_t start = (r < full ? r / 16 * 16 : full) * int64_t{k};
          const int64_t q = r < full ? r % 16 : r - full;
          for (int kk = 0; kk < k; ++kk) {
            const int64_t at = Blocked16Index(r, kk, n, k, t);
            ASSERT_GE(at, start);
            ASSERT_LT(at, start + width * k);
            ++seen[static_cast<size_t>(at)];
            const bool paired = t == DType::kBF16 && !(k % 2 == 1 && kk == k - 1);
            if (paired) {
              EXPECT_EQ(at, start + (kk & ~1) * width + 2 * q + kk % 2)
                  << r << " " << kk << " " << k;
            } else {
              EXPECT_EQ(at, start + kk * width + q);
            }
          }
        }
        for (int c : seen) ASSERT_EQ(c, 1);
      }
    }
  }
}

// A chain computed by hand: the reference every level must equal.
TEST(GemmLevels, ARowIsOneFmaChainOverK) {
  const int m = 9, n = 35, k = 41;
  auto x = Random(static_cast<size_t>(m) * k, 5);
  auto w = Random(static_cast<size_t>(n) * k, 6);
  for (CpuIsa isa : Levels()) {
    std::vector<float> y(static_cast<size_t>(m) * n);
    GemmArgs a;
    a.x = x.data();
    a.ldx = k;
    a.w = w.data();
    a.ldw = k;
    a.m = m;
    a.n = n;
    a.k = k;
    a.y = y.data();
    a.ldy = n;
    a.isa = isa;
    Gemm(a);
    for (int i = 0; i < m; ++i) {
      for (int j = 0; j < n; ++j) {
        float s = 0;
        for (int kk = 0; kk < k; ++kk) s = std::fma(x[i * k + kk], w[j * k + kk], s);
        ASSERT_EQ(y[i * n + j], s) << CpuIsaName(isa) << " " << i << "," << j;
      }
    }
  }
}

// Rows given by pointer (attention's keys and values in their pages, each
// row anywhere): every level computes each output's chain over k as
// ARowIsOneFmaChainOverK, for nt (scores) and nn (weighted values), from
// zero or onto y, with rows of up to and past the sizes the kernels stage,
// and with more rows than decode's (prefill's panels). Rows of bf16 (a bf16
// KV cache) take the same f32 chain over their widened values: x is not
// rounded and a subnormal weight is not flushed.
TEST(GemmLevels, RowsGivenByPointerComputeTheSameChains) {
  for (DType wtype : {DType::kF32, DType::kBF16}) {
    const bool bf16 = wtype == DType::kBF16;
    for (bool nt : {true, false}) {
      for (int m : {1, 2, 3, 4, 7, 19}) {
        for (auto [n, k] : {std::pair{16, 64}, std::pair{40, 37}, std::pair{33, 8}, std::pair{7, 5},
                            std::pair{21, 256}, std::pair{18, 300}}) {
          for (bool accumulate : {false, true}) {
            const int rows = nt ? n : k, cols = nt ? k : n;
            auto x = Random(static_cast<size_t>(m) * (k + 2), 11);
            // Each row in a slot of its own, the slots in a shuffled order.
            const int64_t slot = cols + 5;
            auto pool = Random(static_cast<size_t>(rows) * slot, 12);
            std::vector<uint16_t> pool16(pool.size());
            for (size_t e = 0; e < pool.size(); ++e) {
              uint32_t b;
              std::memcpy(&b, &pool[e], 4);
              // Every seventh a subnormal bf16, else the value rounded.
              b = e % 7 == 1 ? (e % 2 ? 0x00010000u : 0x80050000u) : Bf16Bits(b);
              pool16[e] = static_cast<uint16_t>(b >> 16);
              if (bf16) std::memcpy(&pool[e], &b, 4);  // the widened value
            }
            std::vector<int> order(rows);
            std::iota(order.begin(), order.end(), 0);
            std::shuffle(order.begin(), order.end(), std::mt19937(rows));
            std::vector<const float*> ptr(rows), given(rows);
            for (int r = 0; r < rows; ++r) {
              ptr[r] = pool.data() + order[r] * slot + 1;
              given[r] = bf16 ? reinterpret_cast<const float*>(pool16.data() + order[r] * slot + 1)
                              : ptr[r];
            }
            auto y0 = Random(static_cast<size_t>(m) * (n + 3), 13);
            std::vector<float> want = y0;
            for (int i = 0; i < m; ++i) {
              for (int j = 0; j < n; ++j) {
                float s = accumulate ? want[i * (n + 3) + j] : 0.0f;
                for (int kk = 0; kk < k; ++kk) {
                  const float wv = nt ? ptr[j][kk] : ptr[kk][j];
                  s = std::fma(x[i * (k + 2) + kk], wv, s);
                }
                want[i * (n + 3) + j] = s;
              }
            }
            for (CpuIsa isa : Levels()) {
              std::vector<float> y = y0;
              GemmArgs a;
              a.x = x.data();
              a.ldx = k + 2;
              a.w_rows = given.data();
              a.wtype = wtype;
              a.nt = nt;
              a.m = m;
              a.n = n;
              a.k = k;
              a.out = accumulate ? GemmOut::kAccumulate : GemmOut::kStore;
              a.y = y.data();
              a.ldy = n + 3;
              a.isa = isa;
              Gemm(a);
              for (size_t e = 0; e < y.size(); ++e) {
                ASSERT_EQ(y[e], want[e])
                    << DTypeName(wtype) << " " << CpuIsaName(isa) << " nt=" << nt << " m=" << m
                    << " n=" << n << " k=" << k << " acc=" << accumulate << " at " << e;
              }
            }
          }
        }
      }
    }
  }
}

TEST(GemmLevels, AnUnsupportedLevelIsLoweredToTheBest) {
  EXPECT_EQ(GemmIsaFor(std::nullopt), GemmIsa());
  EXPECT_EQ(GemmIsaFor(CpuIsa::kGeneric), CpuIsa::kGeneric);
  // The best is at most AVX-512 (FAILSAFE_CPU_ISA caps only the default).
  EXPECT_EQ(GemmIsaFor(CpuIsa::kAvx512), BestCpuIsa(HostCpuFeatures()));
  EXPECT_LE(GemmIsa(), BestCpuIsa(HostCpuFeatures()));
  EXPECT_TRUE(CpuSupports(HostCpuFeatures(), GemmIsaFor(CpuIsa::kAvx2)));
  EXPECT_GE(GemmTileRows(GemmIsa()), GemmTileRows(CpuIsa::kGeneric));
}

// The exponential of SiLU and softmax: the same bits on every level, within
// 2 ulp of exp, and the edges (overflow, subnormal results, NaN) as said.
TEST(ExpLevels, EveryLevelComputesTheSameExpWithin2Ulp) {
  std::vector<float> x;
  for (double v = -90.0; v <= 90.0; v += 0.0037) x.push_back(static_cast<float>(v));
  Rng r(23);
  for (int i = 0; i < 20000; ++i) x.push_back(static_cast<float>(-30.0 + 60.0 * r.Uniform()));
  for (float v : {0.0f, -0.0f, 1e-30f, -1e-30f, 88.72f, 88.73f, -87.33f, -87.34f, -104.0f, 1e30f,
                  -1e30f, INFINITY, -INFINITY, NAN})
    x.push_back(v);
  x.push_back(1.0f);  // an odd length: a partial vector at the end
  std::vector<float> want;
  for (CpuIsa isa : Levels()) {
    std::vector<float> got = x;
    ExpShifted(got.data(), static_cast<int>(got.size()), 0.0f, isa);
    if (want.empty()) {
      want = got;
      for (size_t i = 0; i < x.size(); ++i) {
        const double e = std::exp(static_cast<double>(x[i]));
        if (std::isnan(x[i])) {
          EXPECT_TRUE(std::isnan(got[i]));
        } else if (x[i] > 88.7228391f) {
          EXPECT_EQ(got[i], INFINITY) << x[i];
        } else if (x[i] < -87.3365479f) {
          EXPECT_EQ(got[i], 0.0f) << x[i];
        } else {
          EXPECT_LE(std::abs(got[i] - e),
                    2.0 * std::abs(std::nextafter(static_cast<float>(e), INFINITY) -
                                   static_cast<float>(e)))
              << "exp(" << x[i] << ")";
        }
      }
      continue;
    }
    for (size_t i = 0; i < x.size(); ++i) {
      uint32_t a, b;
      std::memcpy(&a, &want[i], 4);
      std::memcpy(&b, &got[i], 4);
      EXPECT_TRUE(a == b || (std::isnan(want[i]) && std::isnan(got[i])))
          << CpuIsaName(isa) << " exp(" << x[i] << ")";
    }
  }
  // SiLU times the up projection, likewise.
  std::vector<float> g(x.begin(), x.begin() + 1001), u(1001);
  for (size_t i = 0; i < u.size(); ++i) u[i] = static_cast<float>(r.Uniform() * 4 - 2);
  std::vector<float> first;
  for (CpuIsa isa : Levels()) {
    std::vector<float> out(g.size());
    SiluMulRow(g.data(), u.data(), out.data(), static_cast<int>(g.size()), isa);
    if (first.empty()) {
      first = out;
      for (size_t i = 0; i < g.size(); ++i) {
        const double want_i = g[i] / (1.0 + std::exp(-static_cast<double>(g[i]))) * u[i];
        EXPECT_NEAR(out[i], want_i, 1e-6 * (1 + std::abs(want_i))) << g[i];
      }
    } else {
      EXPECT_EQ(std::memcmp(first.data(), out.data(), 4 * out.size()), 0) << CpuIsaName(isa);
    }
  }
}

// Rounding activations to bf16 at every level: as RoundToBf16 bit for bit
// (ties to even, NaN quiet with its payload's upper bits, overflow to
// infinity, subnormals rounded like the rest), and the pairs packed from it.
TEST(RoundLevels, EveryLevelRoundsAsRoundToBf16AndPacksThePairs) {
  std::vector<uint32_t> bits = {0x3f808000u, 0x3f818000u, 0x3f807fffu, 0x3f808001u, 0x7f7fffffu,
                                0xff7fffffu, 0x7f800000u, 0xff800000u, 0x7f800001u, 0xff812345u,
                                0x7fc00000u, 0x00008000u, 0x00018000u, 0x807fffffu, 0x80000000u,
                                0x00000000u, 0x00000001u};
  Rng r(31);
  for (int i = 0; i < 3000; ++i)
    bits.push_back(static_cast<uint32_t>(r.Below(1u << 31)) * 2 + (i & 1));
  std::vector<float> x(bits.size());
  std::memcpy(x.data(), bits.data(), 4 * bits.size());
  const int n = static_cast<int>(x.size()) - 1;  // odd: a tail past the vectors
  for (CpuIsa isa : Levels()) {
    std::vector<float> xs(n + 1, 0.0f);
    RoundRowToBf16(x.data(), xs.data(), n, isa);
    for (int i = 0; i < n; ++i) {
      const float want = RoundToBf16(x[i]);
      uint32_t a, b;
      std::memcpy(&a, &want, 4);
      std::memcpy(&b, &xs[i], 4);
      ASSERT_EQ(a, b) << CpuIsaName(isa) << " bits " << std::hex << bits[i];
    }
    std::vector<uint32_t> words((n + 1) / 2);
    PackBf16Pairs(xs.data(), words.data(), static_cast<int64_t>(words.size()), isa);
    for (size_t w = 0; w < words.size(); ++w) {
      uint32_t even, odd;
      std::memcpy(&even, &xs[2 * w], 4);
      std::memcpy(&odd, &xs[2 * w + 1], 4);
      ASSERT_EQ(words[w], (even >> 16) | (odd & 0xffff0000u)) << CpuIsaName(isa) << " word " << w;
    }
  }
}

// Attention's softmax: within a few ulp of the exact one; the same bits on
// every level; and a query's terms give the same bits wherever [lo, hi]
// lies in the row (a decode's row starts at its first key, a prefill tile's
// further left), with everything outside it an exact zero.
TEST(SoftmaxLevels, EveryLevelAndEveryPlaceInTheRowGivesTheSameBits) {
  Rng r(29);
  for (int n : {1, 5, 16, 17, 40, 333}) {
    std::vector<float> terms(n);
    for (float& t : terms) t = static_cast<float>(r.Uniform() * 40 - 20);
    if (n > 4) terms[3] = -INFINITY;  // a key weighing exactly nothing
    const float scale = 0.125f;
    double top = -INFINITY, sum = 0;
    for (float t : terms) top = std::max(top, double(t * scale));
    for (float t : terms) sum += std::exp(double(t * scale) - top);
    std::vector<float> want;
    for (CpuIsa isa : Levels()) {
      for (int lo : {0, 1, 16, 23}) {
        const int width = lo + n + 7;
        std::vector<float> row(width, 99.0f);
        std::copy(terms.begin(), terms.end(), row.begin() + lo);
        SoftmaxRow(row.data(), width, lo, lo + n - 1, scale, isa);
        for (int i = 0; i < width; ++i) {
          if (i < lo || i >= lo + n) {
            EXPECT_EQ(row[i], 0.0f) << i;
          }
        }
        std::vector<float> got(row.begin() + lo, row.begin() + lo + n);
        if (want.empty()) {
          want = got;
          for (int i = 0; i < n; ++i) {
            const double p = std::exp(double(terms[i] * scale) - top) / sum;
            EXPECT_NEAR(got[i], p, 4e-7 * p + 1e-30) << "n " << n << " term " << i;
          }
        }
        EXPECT_EQ(std::memcmp(want.data(), got.data(), 4 * n), 0)
            << CpuIsaName(isa) << " n " << n << " lo " << lo;
      }
    }
  }
}

}  // namespace
}  // namespace failsafe::cpu
