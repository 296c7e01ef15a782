// Seeded random numbers. Every random choice in FailSafe (synthetic weights,
// workloads, fault schedules, sampling) comes from one of these, so every run
// can be replayed from its seed.
#pragma once

#include <cmath>
#include <cstdint>

namespace failsafe {

// SplitMix64 finaliser: a strong 64-bit mix, used to derive seeds and as a
// counter-based generator (Hash(seed, counter) is independent per counter).
inline uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

inline uint64_t HashCombine(uint64_t a, uint64_t b) { return Mix64(a ^ Mix64(b)); }

// Uniform double in [0, 1) from 53 random bits.
inline double ToUnitDouble(uint64_t bits) {
  return static_cast<double>(bits >> 11) * (1.0 / 9007199254740992.0);
}

// xoshiro256** stream generator. Not thread-safe: one per thread or owner.
class Rng {
 public:
  explicit Rng(uint64_t seed) {
    uint64_t x = seed;
    for (auto& s : s_) {
      x = Mix64(x);
      s = x;
    }
  }

  uint64_t Next() {
    const uint64_t result = Rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = Rotl(s_[3], 45);
    return result;
  }

  double Uniform() { return ToUnitDouble(Next()); }
  // Uniform integer in [0, n). n > 0.
  uint64_t Below(uint64_t n) { return static_cast<uint64_t>(Uniform() * static_cast<double>(n)); }
  // Standard normal (Box-Muller; one value per call).
  double Normal() {
    double u1 = Uniform();
    double u2 = Uniform();
    if (u1 < 1e-300) u1 = 1e-300;
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

 private:
  static uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

}  // namespace failsafe
