// The GEMM's kernels built for the avx512 level (compile flags in
// src/backend/CMakeLists.txt); called only on CPUs that have it. The
// functions that use AVX512_BF16 (vdpbf16ps) carry it as a target attribute,
// so nothing else in this file needs it; they run only where the CPU has it.
#include <cstdint>

#include "backend/cpu/gemm_impl.h"
#include "common/clock.h"

#if !defined(__AVX512F__)
#error "gemm_avx512.cc must be compiled with the avx512 level's flags"
#endif

namespace failsafe::cpu {

namespace {

// acc + the pairs of a and b (16 lanes of two bf16 each) by vdpbf16ps.
__attribute__((target("avx512bf16"), noinline)) V16 Dpbf16(V16 acc, I16 a, I16 b) {
  return reinterpret_cast<V16>(_mm512_dpbf16_ps(
      reinterpret_cast<__m512>(acc), reinterpret_cast<__m512bh>(a), reinterpret_cast<__m512bh>(b)));
}

// The same by the bf16 chain's rule (gemm.h): odd products, then even, by
// fused multiply-adds that flush denormals.
__attribute__((noinline)) V16 PairChain(V16 acc, I16 a, I16 b) {
  FlushDenormals flush;
  V16 ae, ao, be, bo;
  WidenPair(a, &ae, &ao);
  WidenPair(b, &be, &bo);
  acc = Fma(ao, bo, acc);
  return Fma(ae, be, acc);
}

bool SameOrBothNan(V16 x, V16 y) {
  for (int i = 0; i < 16; ++i) {
    const float fx = x[i], fy = y[i];
    uint32_t bx, by;
    std::memcpy(&bx, &fx, 4);
    std::memcpy(&by, &fy, 4);
    if (bx != by && !(x[i] != x[i] && y[i] != y[i])) return false;
  }
  return true;
}

// A bf16 value of a chosen kind: any bits (NaN, infinities and denormals
// included), a moderate magnitude, or a denormal or tiny one.
uint16_t ProbeBf16(uint64_t r) {
  const uint16_t sign = static_cast<uint16_t>(r & 0x8000);
  switch ((r >> 16) % 4) {
    case 0:
      return static_cast<uint16_t>(r & 0xffff);
    case 1:  // exponents around 1 (products near the accumulator's)
      return sign | static_cast<uint16_t>((0x7f - 12 + (r >> 20) % 24) << 7) | (r >> 32 & 0x7f);
    case 2:  // denormal and the smallest normals
      return sign | static_cast<uint16_t>(((r >> 20) % 3) << 7) | (r >> 32 & 0x7f);
    default:  // products near 2^-126 (exponents around -63)
      return sign | static_cast<uint16_t>((0x7f - 70 + (r >> 20) % 14) << 7) | (r >> 32 & 0x7f);
  }
}

float ProbeAcc(uint64_t r) {
  uint32_t b = static_cast<uint32_t>(r >> 32);
  switch (r % 4) {
    case 0:
      break;  // any bits
    case 1:   // denormal or near 2^-126
      b = (b & 0x807fffffu) | static_cast<uint32_t>((r >> 8) % 3) << 23;
      break;
    case 2:  // around 1
      b = (b & 0x807fffffu) | static_cast<uint32_t>(0x7f - 12 + (r >> 8) % 24) << 23;
      break;
    default:
      b &= 0x80000000u;  // signed zeros
  }
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

// Nanoseconds of the fastest of `reps` runs of `f`.
template <typename F>
int64_t Fastest(int reps, F f) {
  int64_t best = INT64_MAX;
  for (int r = 0; r < reps; ++r) {
    const int64_t t0 = MonotonicNanos();
    volatile float sink = f();
    (void)sink;
    best = std::min(best, MonotonicNanos() - t0);
  }
  return best;
}

// The sum of twelve chains' lanes (keeps them alive).
float SumLanes(const __m512 (&acc)[12]) {
  float sum = 0;
  for (int i = 0; i < 12; ++i) sum += reinterpret_cast<const V16&>(acc[i])[i];
  return sum;
}

}  // namespace

// The empty asm keeps the operand in a register the compiler cannot see
// through, so every round's instructions are issued.
__attribute__((noinline)) float Avx512FmaChains(int64_t iters) {
  __m512 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  __m512 a = _mm512_set1_ps(1.0f), b = _mm512_set1_ps(0.5f);
  for (int64_t t = 0; t < iters; ++t) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_fmadd_ps(a, b, acc[i]);
    asm volatile("" : "+v"(a));
  }
  return SumLanes(acc);
}

__attribute__((target("avx512bf16"), noinline)) float Avx512Dpbf16Chains(int64_t iters) {
  __m512 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  __m512 a = _mm512_set1_ps(1.0f), b = _mm512_set1_ps(0.5f);
  for (int64_t t = 0; t < iters; ++t) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) {
      acc[i] =
          _mm512_dpbf16_ps(acc[i], reinterpret_cast<__m512bh>(a), reinterpret_cast<__m512bh>(b));
    }
    asm volatile("" : "+v"(a));
  }
  return SumLanes(acc);
}

double Dpbf16PerFma() {
  if (!HostCpuFeatures().avx512_bf16) return 0;
  // 0.04-0.15 ms per run (196608 instructions); the fastest of eight,
  // alternating, so that a run the scheduler interrupts does not decide.
  constexpr int kIters = 16384;
  int64_t dp = INT64_MAX, fma = INT64_MAX;
  for (int r = 0; r < 4; ++r) {
    dp = std::min(dp, Fastest(2, [] { return Avx512Dpbf16Chains(kIters); }));
    fma = std::min(fma, Fastest(2, [] { return Avx512FmaChains(kIters); }));
  }
  return static_cast<double>(std::max<int64_t>(fma, 1)) /
         static_cast<double>(std::max<int64_t>(dp, 1));
}

bool Dpbf16MatchesChain() {
  if (!HostCpuFeatures().avx512_bf16) return false;
  // Fixed operands: pseudo-random kinds (splitmix64 from a fixed seed), with
  // cancellation (the odd product the negated even one) in every fourth.
  uint64_t state = 0x9e3779b97f4a7c15ull;
  auto next = [&state] {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  for (int round = 0; round < 2048; ++round) {
    uint16_t a[32], b[32];
    V16 acc;
    for (int i = 0; i < 32; ++i) {
      a[i] = ProbeBf16(next());
      b[i] = ProbeBf16(next());
    }
    if (round % 4 == 3) {
      for (int i = 0; i < 16; ++i) {
        a[2 * i + 1] = a[2 * i] ^ 0x8000;
        b[2 * i + 1] = b[2 * i];
      }
    }
    for (int i = 0; i < 16; ++i) acc[i] = ProbeAcc(next());
    I16 va, vb;
    std::memcpy(&va, a, sizeof(va));
    std::memcpy(&vb, b, sizeof(vb));
    if (!SameOrBothNan(Dpbf16(acc, va, vb), PairChain(acc, va, vb))) return false;
  }
  return true;
}

const GemmKernels& GemmKernelsAvx512() {
  static constexpr GemmKernels kernels{
      kMR,           RunDirect,       RunStream,        RunPanel,
      RunItemPanels, RunColumnPanels, RunColumnWidened, SiluMulRow,
      ExpShifted,    SoftmaxRow,      RoundRowBf16,     PackPairsRow,
      kWideRows};
  return kernels;
}

}  // namespace failsafe::cpu
