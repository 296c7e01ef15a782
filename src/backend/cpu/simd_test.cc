// The generic level's fused multiply-add (simd.h, built here as the generic
// level is: no FMA in the instruction set) against the instruction itself,
// bit for bit, where double rounding and float's denormals would catch a
// plain double sum out: sums halfway between two floats or a hair from it,
// cancellations, results near and below 2^-126, denormal inputs, signed
// zeros and overflow, with MXCSR's DAZ and FTZ off and on.
#include "backend/cpu/simd.h"

#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "backend/cpu_features.h"
#include "common/rng.h"

#if defined(__FMA__)
#error "simd_test.cc tests the generic level: build it without -mfma"
#endif

namespace failsafe::cpu {
namespace {

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// The instruction, under whatever MXCSR says.
__attribute__((target("fma"), noinline)) float FmaInstruction(float a, float b, float c) {
  return _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(a), _mm_set_ss(b), _mm_set_ss(c)));
}

bool HasFma() { return HostCpuFeatures().fma; }

struct Triple {
  float a, b, c;
};

// Sixteen at a time through the vector Fma, each also through the scalar
// one; every result against the reference.
template <typename Reference>
void ExpectAllMatch(const std::vector<Triple>& cases, Reference reference, const char* mode) {
  int mismatches = 0;
  for (size_t i = 0; i < cases.size(); i += 16) {
    float a[16] = {}, b[16] = {}, c[16] = {}, got[16];
    const size_t n = std::min<size_t>(16, cases.size() - i);
    for (size_t l = 0; l < n; ++l) {
      a[l] = cases[i + l].a;
      b[l] = cases[i + l].b;
      c[l] = cases[i + l].c;
    }
    Store(got, Fma(Load(a), Load(b), Load(c)));
    for (size_t l = 0; l < n; ++l) {
      const float want = reference(a[l], b[l], c[l]);
      const float scalar = Fma(a[l], b[l], c[l]);
      if (std::isnan(want) && std::isnan(got[l]) && std::isnan(scalar)) continue;
      if (Bits(got[l]) != Bits(want) || Bits(scalar) != Bits(want)) {
        if (++mismatches <= 10) {
          ADD_FAILURE() << mode << ": fma(" << std::hexfloat << a[l] << ", " << b[l] << ", " << c[l]
                        << ") = " << want << ", vector " << got[l] << ", scalar " << scalar
                        << std::defaultfloat;
        }
      }
    }
  }
  EXPECT_EQ(mismatches, 0) << mode << " over " << cases.size() << " cases";
}

// Inputs that a double sum rounded to float gets wrong, and their
// neighbours, plus random ones over every exponent.
std::vector<Triple> HardCases() {
  Rng r(42);
  std::vector<Triple> out;
  auto random_float = [&r](int lo, int hi) {
    const double e = lo + (hi - lo) * r.Uniform();
    const float sign = r.Uniform() < 0.5 ? -1.0f : 1.0f;
    return sign * static_cast<float>(std::ldexp(1.0 + r.Uniform(), static_cast<int>(e)));
  };
  for (int i = 0; i < 20000; ++i) {
    // c's half ulp times (1 - 2^-2t) as an exact product (1 + 2^-t)(1 - 2^-t):
    // the double sum lands on the float halfway point (t >= 15) or a hair off.
    const float c = random_float(-100, 100);
    const int e = std::ilogb(c) - 24;
    for (int t : {8, 12, 15, 16, 20, 23}) {
      for (float sign : {1.0f, -1.0f}) {
        const float a = sign * std::ldexp(1.0f + std::ldexp(1.0f, -t), e);
        const float b = 1.0f - std::ldexp(1.0f, -t);
        out.push_back({a, b, c});
        out.push_back({a, 2.0f - b, c});  // (1 + 2^-t)^2: a hair above
      }
    }
    // Exactly halfway, and a product of many bits near c's last.
    out.push_back({std::ldexp(1.0f, e), 1.0f, c});
    out.push_back({std::ldexp(1.0f, e), -1.0f, c});
    out.push_back({random_float(e - 2, e + 2), random_float(-1, 1), c});
    // Cancellation: c near -a * b.
    const float a = random_float(-60, 60), b = random_float(-60, 60);
    out.push_back({a, b, -a * b});
    out.push_back({a, b, std::nextafter(-a * b, 0.0f)});
    // Results near and below 2^-126, and denormal inputs.
    out.push_back({random_float(-75, -60), random_float(-75, -60), random_float(-140, -120)});
    out.push_back({random_float(-70, -60), random_float(-70, -60), -random_float(-130, -122)});
    const float tiny = std::ldexp(1.0f, -126);
    out.push_back({tiny, 1.0f - std::ldexp(1.0f, -24), -std::ldexp(1.0f, -150)});
    out.push_back({FromBits(static_cast<uint32_t>(1 + i % 0x7FFFFF)), random_float(-2, 20),
                   random_float(-140, -100)});
    out.push_back({random_float(-10, 10), random_float(-10, 10),
                   FromBits(static_cast<uint32_t>(1 + (i * 7919) % 0x7FFFFF))});
    // A product a hair off an odd multiple of 2^-150 (a float denormal's
    // halfway point) added to a multiple of 2^-149 that takes the double sum
    // onto that point: rounded where float's denormals round, not at 24 bits.
    for (int t : {18, 20, 23}) {
      const float odd = static_cast<float>(1 + 2 * (i % 7));
      const float a_small = std::ldexp(odd * (1.0f + std::ldexp(1.0f, -t)), -70);
      const float b_small = std::ldexp(1.0f - std::ldexp(1.0f, -t), -80);
      const float c_small =
          (i % 2 ? -1.0f : 1.0f) * std::ldexp(static_cast<float>(1 + r.Below(1 << 24)), -149);
      out.push_back({a_small, b_small, c_small});
      out.push_back({a_small, 2.0f - b_small * 0x1p80f, c_small * 0x1p-80f});
      out.push_back({-a_small, b_small, c_small});
    }
    // Anything.
    out.push_back({random_float(-126, 127), random_float(-126, 127), random_float(-126, 127)});
    out.push_back({random_float(-20, 20), random_float(-20, 20), random_float(-20, 20)});
  }
  // Signed zeros, overflow, infinities.
  for (float z : {0.0f, -0.0f}) {
    for (float w : {0.0f, -0.0f, 1.0f, -1.0f}) {
      out.push_back({z, w, 0.0f});
      out.push_back({z, w, -0.0f});
      out.push_back({w, 1.0f, -w});
    }
  }
  out.push_back({FLT_MAX, 2.0f, -FLT_MAX});
  out.push_back({FLT_MAX, 1.0f, std::ldexp(1.0f, 103)});  // halfway past the largest
  out.push_back({FLT_MAX, 1.0f, std::ldexp(1.0f, 102)});
  out.push_back({INFINITY, 1.0f, 1.0f});
  out.push_back({INFINITY, 0.0f, 1.0f});  // NaN both ways
  return out;
}

TEST(GenericFma, IsCorrectlyRoundedLikeStdFma) {
  const auto cases = HardCases();
  ExpectAllMatch(
      cases, [](float a, float b, float c) { return std::fma(a, b, c); }, "std::fma");
}

TEST(GenericFma, MatchesTheInstructionWithAndWithoutFlushing) {
  if (!HasFma()) GTEST_SKIP() << "this CPU has no FMA instruction to compare with";
  const auto cases = HardCases();
  ExpectAllMatch(cases, FmaInstruction, "no flushing");
  const unsigned saved = _mm_getcsr();
  _mm_setcsr(saved | 0x0040 | 0x8000);  // DAZ, FTZ
  ExpectAllMatch(cases, FmaInstruction, "DAZ and FTZ");
  _mm_setcsr(saved);
}

// bf16 values: a float's top 16 bits.
float RoundDownToBf16(float f) { return FromBits(Bits(f) & 0xFFFF0000u); }

// FmaBf16 (no checks) on bf16 pairs under DAZ and FTZ, as the bf16 chain
// takes it: against the exact Fma (any CPU) and the instruction (where there
// is one). Products of every size against sums near them, halfway points of
// the sum's float, cancellations, and results near 2^-126.
TEST(GenericFma, Bf16ProductsNeedNoChecks) {
  Rng r(7);
  auto bf16 = [&r](int lo, int hi) {
    const double e = lo + (hi - lo) * r.Uniform();
    const float sign = r.Uniform() < 0.5 ? -1.0f : 1.0f;
    return RoundDownToBf16(sign *
                           static_cast<float>(std::ldexp(1.0 + r.Uniform(), static_cast<int>(e))));
  };
  std::vector<Triple> cases;
  for (int i = 0; i < 100000; ++i) {
    const float a = bf16(-70, 64), b = bf16(-70, 64);
    const float p = a * b;
    const int e = std::isfinite(p) && p != 0 ? std::ilogb(p) : 0;
    const float c = bf16(-140, 127) * static_cast<float>(1.0 + r.Uniform());  // any float
    cases.push_back({a, b, c});
    // Sums whose exact value sits on or by the halfway point of the sum's
    // float: c a float whose half ulp is near the product.
    for (int shift : {-1, 0, 1, 23, 24, 25, 30, 40}) {
      const float big =
          std::ldexp(static_cast<float>(1 + r.Below(1 << 23)) / (1 << 23) + 1.0f, e + shift);
      cases.push_back({a, b, big});
      cases.push_back({a, b, -big});
    }
    cases.push_back({a, b, -p});
    cases.push_back({a, b, std::nextafter(-p, 0.0f)});
    cases.push_back({a, b, std::nextafter(-p, -INFINITY)});
    // Near 2^-126.
    cases.push_back({bf16(-64, -62), bf16(-64, -62), bf16(-127, -124)});
    cases.push_back({bf16(-64, -62), bf16(-64, -62), 0.0f});
    cases.push_back({bf16(-66, -60), bf16(-66, -60), -bf16(-127, -125) * 1.5f});
    cases.push_back(
        {FromBits(static_cast<uint32_t>(0x00010000u * (1 + i % 0x7F))), bf16(-2, 2), c});
  }
  const unsigned saved = _mm_getcsr();
  _mm_setcsr(saved | 0x0040 | 0x8000);  // DAZ, FTZ
  int mismatches = 0;
  for (size_t i = 0; i + 16 <= cases.size(); i += 16) {
    float a[16], b[16], c[16], cheap[16], exact[16];
    for (int l = 0; l < 16; ++l) {
      a[l] = cases[i + l].a;
      b[l] = cases[i + l].b;
      c[l] = cases[i + l].c;
    }
    Store(cheap, FmaBf16(Load(a), Load(b), Load(c)));
    Store(exact, Fma(Load(a), Load(b), Load(c)));
    for (int l = 0; l < 16; ++l) {
      const bool nan = std::isnan(exact[l]) && std::isnan(cheap[l]);
      const bool instruction_agrees = !HasFma() || std::isnan(exact[l]) ||
                                      Bits(FmaInstruction(a[l], b[l], c[l])) == Bits(exact[l]);
      if ((!nan && Bits(cheap[l]) != Bits(exact[l])) ||
          (!nan && Bits(FmaBf16(a[l], b[l], c[l])) != Bits(exact[l])) || !instruction_agrees) {
        if (++mismatches <= 10) {
          ADD_FAILURE() << "fma(" << std::hexfloat << a[l] << ", " << b[l] << ", " << c[l]
                        << "): exact " << exact[l] << ", FmaBf16 " << cheap[l] << std::defaultfloat;
        }
      }
    }
  }
  _mm_setcsr(saved);
  EXPECT_EQ(mismatches, 0) << " over " << cases.size() << " cases";
}

}  // namespace
}  // namespace failsafe::cpu
