// The GEMM's kernels built for the avx512 level (compile flags in
// src/backend/CMakeLists.txt); called only on CPUs that have it. The
// functions that use AVX512_BF16 (vdpbf16ps) carry it as a target attribute,
// so nothing else in this file needs it; they run only where the CPU has it.
#include "backend/cpu/gemm_impl.h"

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
    uint32_t bx, by;
    std::memcpy(&bx, &x[i], 4);
    std::memcpy(&by, &y[i], 4);
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

}  // namespace

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
  static constexpr GemmKernels kernels{kMR,           RunDirect,       RunStream,   RunPanel,
                                       RunItemPanels, RunColumnPanels, SiluMulRow,  ExpShifted,
                                       SoftmaxRow,    RoundRowBf16,    PackPairsRow};
  return kernels;
}

}  // namespace failsafe::cpu
