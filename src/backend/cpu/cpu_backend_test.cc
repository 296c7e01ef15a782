#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <set>
#include <vector>

#include "backend/backend.h"
#include "common/fixed_point.h"
#include "common/rng.h"

namespace failsafe {
namespace {

std::vector<float> Random(size_t n, uint64_t seed) {
  Rng r(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(r.Normal());
  return v;
}

float MaxRelErr(const std::vector<float>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    num = std::max(num, std::fabs(got[i] - want[i]));
    den = std::max(den, std::fabs(want[i]));
  }
  return static_cast<float>(num / den);
}

class LinearTest : public ::testing::TestWithParam<std::tuple<int, int, int, int>> {};

TEST_P(LinearTest, MatchesNaive) {
  auto [m, n, k, threads] = GetParam();
  auto be = MakeCpuBackend(threads);
  const int ldx = k + 3, ldy = n + 5;
  auto x = Random(static_cast<size_t>(m) * ldx, 1);
  auto w = Random(static_cast<size_t>(n) * k, 2);
  auto y0 = Random(static_cast<size_t>(m) * ldy, 3);
  for (bool acc : {false, true}) {
    // NT: w is [n, k]
    std::vector<float> y = y0;
    be->LinearNT(x.data(), ldx, w.data(), y.data(), ldy, m, n, k, acc);
    std::vector<float> got;
    std::vector<double> want;
    for (int i = 0; i < m; ++i) {
      for (int j = 0; j < n; ++j) {
        double s = acc ? y0[i * ldy + j] : 0.0;
        for (int kk = 0; kk < k; ++kk) s += double(x[i * ldx + kk]) * w[j * k + kk];
        got.push_back(y[i * ldy + j]);
        want.push_back(s);
      }
    }
    EXPECT_LT(MaxRelErr(got, want), 1e-5) << "NT acc=" << acc;
    // NN: w is [k, n]
    y = y0;
    be->LinearNN(x.data(), ldx, w.data(), y.data(), ldy, m, n, k, acc);
    got.clear();
    want.clear();
    for (int i = 0; i < m; ++i) {
      for (int j = 0; j < n; ++j) {
        double s = acc ? y0[i * ldy + j] : 0.0;
        for (int kk = 0; kk < k; ++kk) s += double(x[i * ldx + kk]) * w[kk * n + j];
        got.push_back(y[i * ldy + j]);
        want.push_back(s);
      }
    }
    EXPECT_LT(MaxRelErr(got, want), 1e-5) << "NN acc=" << acc;
    // Padding columns past n are untouched.
    for (int i = 0; i < m; ++i) {
      for (int j = n; j < ldy; ++j) ASSERT_EQ(y[i * ldy + j], y0[i * ldy + j]);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, LinearTest,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4, 5, 17),
                                            ::testing::Values(1, 7, 64, 301),
                                            ::testing::Values(1, 16, 37, 300),
                                            ::testing::Values(1, 2)));

// The batch-invariance contract (backend/cpu/gemm.h), written out in scalar
// code: whatever the rows around it and the threads, an element is one chain
// of fused multiply-adds over k.
float Chain(const float* x, const float* w, int64_t w_stride_k, int k, float init = 0.0f) {
  float acc = init;
  for (int kk = 0; kk < k; ++kk) acc = std::fma(x[kk], w[kk * w_stride_k], acc);
  return acc;
}

TEST(Linear, EveryRowIsItsOwnChainWhateverTheBatch) {
  const int n = 77, k = 203, m = 23;
  auto x = Random(static_cast<size_t>(m) * k, 11);
  auto w = Random(static_cast<size_t>(n) * k, 12);  // NT: [n, k]; NN: [k, n]
  for (int threads : {1, 2}) {
    auto be = MakeCpuBackend(threads);
    std::vector<float> all_nt(static_cast<size_t>(m) * n), all_nn(all_nt.size());
    be->LinearNT(x.data(), k, w.data(), all_nt.data(), n, m, n, k, false);
    be->LinearNN(x.data(), k, w.data(), all_nn.data(), n, m, n, k, false);
    for (int i = 0; i < m; ++i) {
      for (int j = 0; j < n; ++j) {
        ASSERT_EQ(all_nt[i * n + j], Chain(&x[i * k], &w[j * k], 1, k)) << i << "," << j;
        ASSERT_EQ(all_nn[i * n + j], Chain(&x[i * k], &w[j], n, k)) << i << "," << j;
      }
    }
    // The same rows alone and in other company.
    for (int rows : {1, 2, 3, 5, 9, 17}) {
      for (int i0 = 0; i0 + rows <= m; i0 += 7) {
        std::vector<float> y(static_cast<size_t>(rows) * n);
        be->LinearNT(&x[i0 * k], k, w.data(), y.data(), n, rows, n, k, false);
        for (size_t e = 0; e < y.size(); ++e) ASSERT_EQ(y[e], all_nt[i0 * n + e]);
        be->LinearNN(&x[i0 * k], k, w.data(), y.data(), n, rows, n, k, false);
        for (size_t e = 0; e < y.size(); ++e) ASSERT_EQ(y[e], all_nn[i0 * n + e]);
      }
    }
  }
}

// Fixed-point partial sums: each item's chain, truncated to 2^-32, summed
// exactly; the same however the items are grouped into calls.
TEST(Linear, FixedPartialSumsAreExactWhateverTheGrouping) {
  const int m = 6, n = 40, items = 7, item_k = 22, k = items * item_k;
  auto x = Random(static_cast<size_t>(m) * k, 21);
  auto w = Random(static_cast<size_t>(k) * n, 22);
  auto be = MakeCpuBackend(1);
  std::vector<int64_t> whole(static_cast<size_t>(m) * n, 0), split(whole.size(), 0);
  be->LinearNNFixed(x.data(), k, w.data(), whole.data(), n, m, n, k, item_k);
  // Items 4..6 first, then 0..3, in separate calls.
  be->LinearNNFixed(&x[4 * item_k], k, &w[4 * item_k * n], split.data(), n, m, n, 3 * item_k,
                    item_k);
  be->LinearNNFixed(x.data(), k, w.data(), split.data(), n, m, n, 4 * item_k, item_k);
  EXPECT_EQ(whole, split);
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      int64_t want = 0;
      for (int it = 0; it < items; ++it)
        want += ToFixed(Chain(&x[i * k + it * item_k], &w[it * item_k * n + j], n, item_k));
      ASSERT_EQ(whole[i * n + j], want);
    }
  }
  const float back = FromFixed(whole[0]);
  double exact = 0;
  for (int kk = 0; kk < k; ++kk) exact += double(x[kk]) * w[kk * n];
  EXPECT_NEAR(back, exact, 1e-4 * std::max(1.0, std::fabs(exact)));
}

// Reference attention for one head group over positions [0, end).
std::vector<double> NaiveAttention(const std::vector<float>& q, int ldq,
                                   const std::vector<float>& k, const std::vector<float>& v,
                                   int start, int tokens, int g, int hd, int window) {
  std::vector<double> out(static_cast<size_t>(tokens) * g * hd);
  for (int t = 0; t < tokens; ++t) {
    int pos = start + t;
    int lo = window > 0 ? std::max(0, pos - window + 1) : 0;
    for (int j = 0; j < g; ++j) {
      std::vector<double> s;
      double mx = -1e300;
      for (int p = lo; p <= pos; ++p) {
        double d = 0;
        for (int i = 0; i < hd; ++i) d += double(q[t * ldq + j * hd + i]) * k[p * hd + i];
        d /= std::sqrt(double(hd));
        s.push_back(d);
        mx = std::max(mx, d);
      }
      double sum = 0;
      for (auto& e : s) sum += e = std::exp(e - mx);
      for (int p = lo; p <= pos; ++p) {
        for (int i = 0; i < hd; ++i) out[(t * g + j) * hd + i] += s[p - lo] / sum * v[p * hd + i];
      }
    }
  }
  return out;
}

class AttentionTest : public ::testing::TestWithParam<std::tuple<int, int, int, int>> {};

TEST_P(AttentionTest, MatchesNaive) {
  auto [start, tokens, window, threads] = GetParam();
  const int g = 4, hd = 32, bs = 16;
  const int end = start + tokens;
  auto k = Random(static_cast<size_t>(end) * hd, 4);
  auto v = Random(static_cast<size_t>(end) * hd, 5);
  const int ldq = g * hd + 8;
  auto q = Random(static_cast<size_t>(tokens) * ldq, 6);
  // Scatter the earlier positions' K and V into pages in reverse order, to
  // check the page table is used; the tokens' own come as new_kv (each
  // row its key, its value, then padding), which attention stores first.
  const int blocks = (end + bs - 1) / bs;
  std::vector<std::vector<float>> store(blocks, std::vector<float>(2 * bs * hd, 0.0f));
  std::vector<float*> pages(blocks);
  for (int b = 0; b < blocks; ++b) pages[b] = store[blocks - 1 - b].data();
  for (int p = 0; p < start; ++p) {
    std::copy_n(&k[p * hd], hd, pages[p / bs] + (p % bs) * hd);
    std::copy_n(&v[p * hd], hd, pages[p / bs] + (bs + p % bs) * hd);
  }
  const int ld_new = 2 * hd + 5;
  std::vector<float> new_kv(static_cast<size_t>(tokens) * ld_new, 0.0f);
  for (int t = 0; t < tokens; ++t) {
    std::copy_n(&k[(start + t) * hd], hd, &new_kv[t * ld_new]);
    std::copy_n(&v[(start + t) * hd], hd, &new_kv[t * ld_new + hd]);
  }
  // A group held without query heads: its problem only stores.
  std::vector<std::vector<float>> other(blocks, std::vector<float>(2 * bs * hd, 0.0f));
  std::vector<float*> other_pages(blocks);
  for (int b = 0; b < blocks; ++b) other_pages[b] = other[b].data();
  std::vector<float> out(static_cast<size_t>(tokens) * g * hd, -1.0f);
  AttentionArgs a;
  a.q = q.data();
  a.ldq = ldq;
  a.out = out.data();
  a.ldo = g * hd;
  a.num_tokens = tokens;
  a.start_pos = start;
  a.group_size = g;
  a.head_dim = hd;
  a.pages = pages.data();
  a.new_kv = new_kv.data();
  a.ld_new_kv = ld_new;
  a.block_size = bs;
  a.sliding_window = window;
  a.scale = 1.0f / std::sqrt(float(hd));
  AttentionArgs only_store = a;
  only_store.group_size = 0;
  only_store.q = nullptr;
  only_store.out = nullptr;
  only_store.pages = other_pages.data();
  auto be = MakeCpuBackend(threads);
  be->Attention({a, only_store});
  auto want = NaiveAttention(q, ldq, k, v, start, tokens, g, hd, window);
  EXPECT_LT(MaxRelErr(out, want), 1e-5);
  for (int p = 0; p < end; ++p) {
    const float* page = other_pages[p / bs];
    for (int i = 0; i < hd; ++i) {
      ASSERT_EQ(page[(p % bs) * hd + i], p < start ? 0.0f : k[p * hd + i]) << p;
      ASSERT_EQ(page[(bs + p % bs) * hd + i], p < start ? 0.0f : v[p * hd + i]) << p;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionTest,
                         ::testing::Combine(::testing::Values(0, 5, 40),
                                            ::testing::Values(1, 3, 8, 70, 150),
                                            ::testing::Values(0, 24), ::testing::Values(1, 2)));

// A query's output is the same, bit for bit, whether it is computed alone
// (decode), in a small chunk or in one long prefill chunk.
TEST(Attention, AQueryGetsTheSameOutputWhateverItsChunk) {
  for (int window : {0, 37}) {
    const int g = 2, hd = 48, bs = 16, total = 150;
    auto k = Random(static_cast<size_t>(total) * hd, 31);
    auto v = Random(static_cast<size_t>(total) * hd, 32);
    auto q = Random(static_cast<size_t>(total) * g * hd, 33);
    const int blocks = (total + bs - 1) / bs;
    std::vector<std::vector<float>> store(blocks, std::vector<float>(2 * bs * hd));
    std::vector<float*> pages(blocks);
    for (int b = 0; b < blocks; ++b) pages[b] = store[b].data();
    for (int p = 0; p < total; ++p) {
      std::copy_n(&k[p * hd], hd, store[p / bs].data() + (p % bs) * hd);
      std::copy_n(&v[p * hd], hd, store[p / bs].data() + (bs + p % bs) * hd);
    }
    auto run = [&](int start, int tokens, float* out) {
      AttentionArgs a;
      a.q = &q[static_cast<size_t>(start) * g * hd];
      a.ldq = g * hd;
      a.out = out;
      a.ldo = g * hd;
      a.num_tokens = tokens;
      a.start_pos = start;
      a.group_size = g;
      a.head_dim = hd;
      a.pages = pages.data();
      a.block_size = bs;
      a.sliding_window = window;
      a.scale = 0.125f;
      MakeCpuBackend(1)->Attention({a});
    };
    std::vector<float> whole(static_cast<size_t>(total) * g * hd);
    run(0, total, whole.data());
    for (int chunk : {1, 3, 17, 70}) {
      std::vector<float> pieces(whole.size());
      for (int t = 0; t < total; t += chunk)
        run(t, std::min(chunk, total - t), &pieces[static_cast<size_t>(t) * g * hd]);
      ASSERT_EQ(pieces, whole) << "chunks of " << chunk << ", window " << window;
    }
  }
}

// bf16 pages: each key and value rounded to bf16 (to nearest, ties to even)
// as it is stored, and attention over them the same bits as over f32 pages
// holding the rounded values, at every level, in any chunk, on any threads.
TEST(Attention, Bf16PagesAttendAsF32PagesOfTheRoundedValues) {
  auto round = [](float x) { return BFloat16ToFloat(FloatToBFloat16(x)); };
  const int g = 4, hd = 64, bs = 16, total = 90;
  const int blocks = (total + bs - 1) / bs;
  auto k = Random(static_cast<size_t>(total) * hd, 41);
  auto v = Random(static_cast<size_t>(total) * hd, 42);
  auto q = Random(static_cast<size_t>(total) * g * hd, 43);
  const int ld_new = 2 * hd;
  std::vector<float> new_kv(static_cast<size_t>(total) * ld_new), rounded(new_kv.size());
  for (int p = 0; p < total; ++p) {
    std::copy_n(&k[p * hd], hd, &new_kv[p * ld_new]);
    std::copy_n(&v[p * hd], hd, &new_kv[p * ld_new + hd]);
  }
  for (size_t i = 0; i < new_kv.size(); ++i) rounded[i] = round(new_kv[i]);
  for (int window : {0, 24}) {
    for (CpuIsa isa : {CpuIsa::kGeneric, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
      for (int chunk : {1, 7, 90}) {
        for (int threads : {1, 2}) {
          // Pages in reverse order; f32 pages, then bf16 pages of half the size.
          std::vector<float> store32(static_cast<size_t>(blocks) * 2 * bs * hd);
          std::vector<uint16_t> store16(store32.size());
          std::vector<float*> pages32(blocks), pages16(blocks);
          for (int b = 0; b < blocks; ++b) {
            pages32[b] = store32.data() + static_cast<size_t>(blocks - 1 - b) * 2 * bs * hd;
            pages16[b] = reinterpret_cast<float*>(
                store16.data() + static_cast<size_t>(blocks - 1 - b) * 2 * bs * hd);
          }
          std::vector<float> out32(static_cast<size_t>(total) * g * hd);
          std::vector<float> out16(out32.size(), -1.0f);
          CpuBackendOptions o;
          o.threads = threads;
          o.isa = isa;
          auto be = MakeCpuBackend(o);
          for (int t = 0; t < total; t += chunk) {
            AttentionArgs a;
            a.q = &q[static_cast<size_t>(t) * g * hd];
            a.ldq = g * hd;
            a.ldo = g * hd;
            a.num_tokens = std::min(chunk, total - t);
            a.start_pos = t;
            a.group_size = g;
            a.head_dim = hd;
            a.ld_new_kv = ld_new;
            a.block_size = bs;
            a.sliding_window = window;
            a.scale = 0.125f;
            AttentionArgs f32 = a, b16 = a;
            f32.out = &out32[static_cast<size_t>(t) * g * hd];
            f32.pages = pages32.data();
            f32.new_kv = &rounded[static_cast<size_t>(t) * ld_new];
            b16.out = &out16[static_cast<size_t>(t) * g * hd];
            b16.pages = pages16.data();
            b16.new_kv = &new_kv[static_cast<size_t>(t) * ld_new];
            b16.kv_dtype = DType::kBF16;
            be->Attention({f32, b16});
          }
          ASSERT_EQ(out16, out32) << "window " << window << " " << CpuIsaName(isa) << " chunks of "
                                  << chunk << ", " << threads << " threads";
          for (size_t i = 0; i < store32.size(); ++i) {
            uint32_t b;
            std::memcpy(&b, &store32[i], 4);
            ASSERT_EQ(store16[i], b >> 16) << i;
          }
        }
      }
    }
  }
}

// A step's many problems, shared out over threads (each thread asking for
// the next problem's first keys and values): every problem's output and
// stored K and V are those it gets computed alone, on any thread count.
TEST(Attention, ManyProblemsOnAnyThreadsAsEachAlone) {
  const int hd = 40, bs = 16, problems = 37;
  struct Problem {
    std::vector<std::vector<float>> store;
    std::vector<float*> pages;
    std::vector<float> q, new_kv, out;
    AttentionArgs a;
  };
  // Problem i: its own pages; decode or a short chunk, after 0-120
  // positions, a window or none, 4 query heads or (every seventh) only
  // its store.
  auto make = [&](std::vector<Problem>* ps) {
    ps->assign(problems, {});
    for (int i = 0; i < problems; ++i) {
      Problem& p = (*ps)[i];
      const int start = (i * 53) % 121, tokens = i % 5 == 0 ? 6 : 1;
      const int g = i % 7 == 3 ? 0 : 4;
      const int blocks = (start + tokens + bs - 1) / bs;
      p.store.resize(blocks);
      for (int b = 0; b < blocks; ++b) p.store[b] = Random(2 * bs * hd, 100 + i * 64 + b);
      for (int b = 0; b < blocks; ++b) p.pages.push_back(p.store[blocks - 1 - b].data());
      p.q = Random(static_cast<size_t>(tokens) * 4 * hd, 10000 + i);
      p.new_kv = Random(static_cast<size_t>(tokens) * 2 * hd, 20000 + i);
      p.out.assign(static_cast<size_t>(tokens) * 4 * hd, -1.0f);
      AttentionArgs& a = p.a;
      a.q = g > 0 ? p.q.data() : nullptr;
      a.ldq = 4 * hd;
      a.out = g > 0 ? p.out.data() : nullptr;
      a.ldo = 4 * hd;
      a.num_tokens = tokens;
      a.start_pos = start;
      a.group_size = g;
      a.head_dim = hd;
      a.pages = p.pages.data();
      a.new_kv = p.new_kv.data();
      a.ld_new_kv = 2 * hd;
      a.block_size = bs;
      a.sliding_window = i % 3 == 1 ? 24 : 0;
      a.scale = 0.15f;
    }
  };
  std::vector<Problem> alone;
  make(&alone);
  for (Problem& p : alone) MakeCpuBackend(1)->Attention({p.a});
  for (int threads : {1, 2, 3}) {
    std::vector<Problem> together;
    make(&together);
    std::vector<AttentionArgs> args;
    for (const Problem& p : together) args.push_back(p.a);
    MakeCpuBackend(threads)->Attention(args);
    for (int i = 0; i < problems; ++i) {
      ASSERT_EQ(together[i].out, alone[i].out) << "problem " << i << ", " << threads << " threads";
      ASSERT_EQ(together[i].store, alone[i].store)
          << "problem " << i << ", " << threads << " threads";
    }
  }
}

TEST(Rope, RotatesPairsAndPreservesNorm) {
  ModelConfig c;
  c.head_dim = 8;
  c.rope_theta = 10000;
  auto freq = RopeInvFreq(c);
  ASSERT_EQ(freq.size(), 4u);
  EXPECT_FLOAT_EQ(freq[0], 1.0f);
  EXPECT_NEAR(freq[1], std::pow(10000.0, -0.25), 1e-7);
  auto be = MakeCpuBackend(1);
  std::vector<float> x = {1, 0, 0, 0, 0, 0, 0, 0};
  int32_t pos = 3;
  std::vector<float> table;
  ExtendRopeTable(freq, 2, &table);
  ExtendRopeTable(freq, 4, &table);  // rows 2 and 3 added to the first two
  ASSERT_EQ(table.size(), 32u);
  EXPECT_EQ(table[8 + 1], static_cast<float>(std::cos(1.0 * freq[1])));
  EXPECT_EQ(table[8 + 4 + 1], static_cast<float>(std::sin(1.0 * freq[1])));
  be->Rope(x.data(), 8, 8, &pos, 1, 1, 8, table.data());
  EXPECT_NEAR(x[0], std::cos(3.0), 1e-6);
  EXPECT_NEAR(x[4], std::sin(3.0), 1e-6);
}

TEST(Rope, Llama3ScalingLeavesHighFrequenciesAndDividesLowOnes) {
  ModelConfig c;
  c.head_dim = 128;
  c.rope_theta = 500000;
  c.rope_scaling = {true, 8.0, 1.0, 4.0, 8192};
  auto scaled = RopeInvFreq(c);
  c.rope_scaling.enabled = false;
  auto plain = RopeInvFreq(c);
  EXPECT_FLOAT_EQ(scaled[0], plain[0]);           // wavelength 2*pi < 2048: unchanged
  EXPECT_FLOAT_EQ(scaled[63], plain[63] / 8.0f);  // wavelength > 8192: divided by the factor
}

TEST(Rope, LongRopeDividesByItsFactorsAndScalesTheTable) {
  ModelConfig c;
  c.head_dim = 8;
  c.rope_theta = 10000;
  const auto plain = RopeInvFreq(c);
  c.longrope.short_factor = {1.0, 1.5, 2.0, 2.5};
  c.longrope.long_factor = {1.0, 4.0, 16.0, 64.0};
  c.longrope.original_max_position_embeddings = 64;
  c.longrope.SetContext(4096);  // the long factors, cos and sin times sqrt(2)
  ASSERT_TRUE(c.longrope.use_long);
  EXPECT_DOUBLE_EQ(c.longrope.attention_factor, std::sqrt(2.0));
  auto freq = RopeInvFreq(c);
  for (int i = 0; i < 4; ++i)
    EXPECT_FLOAT_EQ(freq[i], static_cast<float>(double(plain[i]) / c.longrope.long_factor[i]));
  std::vector<float> table;
  ExtendRopeTable(freq, 3, &table, c.longrope.attention_factor);
  EXPECT_FLOAT_EQ(table[2 * 8 + 1], static_cast<float>(std::cos(2.0 * freq[1]) * std::sqrt(2.0)));
  EXPECT_FLOAT_EQ(table[2 * 8 + 4 + 3],
                  static_cast<float>(std::sin(2.0 * freq[3]) * std::sqrt(2.0)));
  c.longrope.SetContext(64);  // served at the trained context
  EXPECT_FALSE(c.longrope.use_long);
  EXPECT_EQ(c.longrope.attention_factor, 1.0);
  EXPECT_FLOAT_EQ(RopeInvFreq(c)[2], static_cast<float>(double(plain[2]) / 2.0));
}

TEST(Sampling, GreedyTopKTopPAndSeeds) {
  auto be = MakeCpuBackend(1);
  std::vector<float> logits = {0.1f, 3.0f, 2.9f, -1.0f, 3.0f};
  EXPECT_EQ(be->Sample(logits.data(), 5, {}, 0), 1);  // lowest id wins the tie
  SamplingParams p{1.0f, 2, 1.0f, 42};
  std::set<int> seen;
  for (uint64_t c = 0; c < 200; ++c) seen.insert(be->Sample(logits.data(), 5, p, c));
  EXPECT_EQ(seen, (std::set<int>{1, 4}));
  SamplingParams nucleus{1.0f, 0, 0.5f, 42};
  seen.clear();
  for (uint64_t c = 0; c < 200; ++c) seen.insert(be->Sample(logits.data(), 5, nucleus, c));
  EXPECT_EQ(seen, (std::set<int>{1, 4}));
  SamplingParams hot{5.0f, 0, 1.0f, 7};
  seen.clear();
  for (uint64_t c = 0; c < 500; ++c) seen.insert(be->Sample(logits.data(), 5, hot, c));
  EXPECT_EQ(seen.size(), 5u);
  for (uint64_t c = 0; c < 50; ++c) {
    EXPECT_EQ(be->Sample(logits.data(), 5, hot, c), be->Sample(logits.data(), 5, hot, c));
  }
}

// A NaN logit (a broken model's) ranks as -inf: never chosen over a number,
// first or not, and the seeded sort stays a strict order.
TEST(Sampling, NanLogitsAreNeverChosen) {
  auto be = MakeCpuBackend(1);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> logits(300);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = std::sin(0.37f * i);
  for (size_t i = 0; i < logits.size(); i += 3) logits[i] = nan;  // id 0 among them
  logits[7] = 5.0f;
  EXPECT_EQ(be->Sample(logits.data(), 300, {}, 0), 7);
  for (SamplingParams p : {SamplingParams{1.0f, 0, 1.0f, 3}, SamplingParams{2.0f, 50, 0.95f, 4},
                           SamplingParams{4.0f, 0, 1.0f, 5}}) {
    for (uint64_t c = 0; c < 300; ++c) {
      const int t = be->Sample(logits.data(), 300, p, c);
      ASSERT_TRUE(t >= 0 && t < 300);
      EXPECT_NE(t % 3, 0) << "drew the NaN logit of " << t;
    }
  }
  std::vector<float> all_nan(10, nan);
  EXPECT_EQ(be->Sample(all_nan.data(), 10, {}, 0), 0);
}

TEST(MoeGate, TopKRenormalised) {
  auto be = MakeCpuBackend(1);
  std::vector<float> logits = {0.0f, 2.0f, 1.0f, -1.0f};
  int32_t ids[2];
  float w[2];
  be->MoeGate(logits.data(), 1, 4, 2, true, ids, w);
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(ids[1], 2);
  EXPECT_NEAR(w[0], std::exp(2.0) / (std::exp(2.0) + std::exp(1.0)), 1e-6);
  EXPECT_NEAR(w[0] + w[1], 1.0, 1e-6);
}

TEST(MoeGate, TopKAsTheSoftmaxGives) {  // Qwen2-MoE: norm_topk_prob false
  auto be = MakeCpuBackend(1);
  std::vector<float> logits = {0.0f, 2.0f, 1.0f, -1.0f};
  int32_t ids[2];
  float w[2];
  be->MoeGate(logits.data(), 1, 4, 2, false, ids, w);
  const double sum = 1 + std::exp(2.0) + std::exp(1.0) + std::exp(-1.0);
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(ids[1], 2);
  EXPECT_NEAR(w[0], std::exp(2.0) / sum, 1e-6);
  EXPECT_NEAR(w[1], std::exp(1.0) / sum, 1e-6);
}

// Gemma 2's final logits: cap * tanh(x / cap), odd, near x for small x and
// never past the cap.
TEST(Softcap, BoundsLogitsByTheCap) {
  auto be = MakeCpuBackend(1);
  std::vector<float> x = {0.0f, 0.3f, -0.3f, 29.0f, -45.0f, 1e6f, -1e30f};
  std::vector<float> y = x;
  be->Softcap(y.data(), static_cast<int64_t>(y.size()), 30.0f);
  EXPECT_EQ(y[0], 0.0f);
  EXPECT_NEAR(y[1], 0.3f, 1e-4);
  EXPECT_EQ(y[2], -y[1]);
  for (size_t i = 3; i < x.size(); ++i) {
    EXPECT_NEAR(y[i], 30.0 * std::tanh(x[i] / 30.0), 1e-4) << i;
    EXPECT_LE(std::abs(y[i]), 30.0f) << i;
  }
}

// A batch of host copies: a copy that continues the last on both sides
// joins it (a page's keys then values), any other starts a copy of its own,
// and the bytes moved are those asked for.
TEST(HostCopies, ACopyContinuingTheLastJoinsIt) {
  std::vector<char> src(1000), dst(1000, 0);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<char>(i * 7 + 1);
  std::vector<DeviceMemory::HostCopy> batch;
  DeviceMemory::AppendCopy(batch, {dst.data(), src.data(), 100});
  DeviceMemory::AppendCopy(batch, {dst.data() + 100, src.data() + 100, 50});  // joins
  DeviceMemory::AppendCopy(batch, {dst.data() + 150, src.data() + 160, 10});  // source skips
  DeviceMemory::AppendCopy(batch, {dst.data() + 170, src.data() + 170, 10});  // destination skips
  DeviceMemory::AppendCopy(batch, {dst.data() + 180, src.data() + 180, 0});   // nothing
  DeviceMemory::AppendCopy(batch, {dst.data() + 180, src.data() + 180, 20});  // joins
  DeviceMemory::AppendCopy(batch, {dst.data() + 500, src.data() + 600, 30});
  ASSERT_EQ(batch.size(), 4u);
  EXPECT_EQ(batch[0].bytes, 150u);
  EXPECT_EQ(batch[1].bytes, 10u);
  EXPECT_EQ(batch[2].bytes, 30u);
  EXPECT_EQ(batch[3].bytes, 30u);
  auto cpu = MakeCpuBackend(1);
  cpu->BackgroundCopiesToHost(batch.data(), batch.size());
  std::vector<char> want(1000, 0);
  std::memcpy(want.data(), src.data(), 150);
  std::memcpy(want.data() + 150, src.data() + 160, 10);
  std::memcpy(want.data() + 170, src.data() + 170, 30);
  std::memcpy(want.data() + 500, src.data() + 600, 30);
  EXPECT_EQ(dst, want);
}

}  // namespace
}  // namespace failsafe
