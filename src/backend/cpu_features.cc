#include "backend/cpu_features.h"

#include <cpuid.h>

#include <cstdint>
#include <cstring>
#include <set>
#include <sstream>

namespace failsafe {

namespace {

struct Regs {
  uint32_t eax = 0, ebx = 0, ecx = 0, edx = 0;
};

Regs Cpuid(uint32_t leaf, uint32_t subleaf) {
  Regs r;
  __cpuid_count(leaf, subleaf, r.eax, r.ebx, r.ecx, r.edx);
  return r;
}

bool Bit(uint32_t v, int bit) { return (v >> bit) & 1u; }

// XCR0: which register states the OS saves on a context switch.
uint64_t Xcr0() {
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

std::string Trim(const std::string& s) {
  size_t b = s.find_first_not_of(' '), e = s.find_last_not_of(' ');
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

CpuFeatures Detect() {
  CpuFeatures f;
  const uint32_t max_leaf = __get_cpuid_max(0, nullptr);
  if (max_leaf == 0) return f;
  Regs r0 = Cpuid(0, 0);
  char vendor[13] = {};
  std::memcpy(vendor, &r0.ebx, 4);
  std::memcpy(vendor + 4, &r0.edx, 4);
  std::memcpy(vendor + 8, &r0.ecx, 4);
  f.vendor = vendor;

  Regs r1 = Cpuid(1, 0);
  const int base_family = (r1.eax >> 8) & 0xf, base_model = (r1.eax >> 4) & 0xf;
  f.family = base_family == 0xf ? base_family + ((r1.eax >> 20) & 0xff) : base_family;
  f.model_id = (base_family == 0x6 || base_family == 0xf)
                   ? base_model + (((r1.eax >> 16) & 0xf) << 4)
                   : base_model;
  f.sse41 = Bit(r1.ecx, 19);
  const bool osxsave = Bit(r1.ecx, 27);
  const uint64_t xcr0 = osxsave ? Xcr0() : 0;
  const bool ymm_state = (xcr0 & 0x6) == 0x6;                 // SSE and AVX state
  const bool zmm_state = ymm_state && (xcr0 & 0xe0) == 0xe0;  // opmask, ZMM_Hi256, Hi16_ZMM
  const bool tile_state = (xcr0 & 0x60000) == 0x60000;        // XTILECFG, XTILEDATA
  f.avx = ymm_state && Bit(r1.ecx, 28);
  f.fma = f.avx && Bit(r1.ecx, 12);
  f.f16c = f.avx && Bit(r1.ecx, 29);
  if (max_leaf >= 7) {
    Regs r7 = Cpuid(7, 0);
    f.avx2 = f.avx && Bit(r7.ebx, 5);
    f.avx512f = zmm_state && Bit(r7.ebx, 16);
    f.avx512dq = f.avx512f && Bit(r7.ebx, 17);
    f.avx512bw = f.avx512f && Bit(r7.ebx, 30);
    f.avx512vl = f.avx512f && Bit(r7.ebx, 31);
    f.avx512_vnni = f.avx512f && Bit(r7.ecx, 11);
    f.avx512_fp16 = f.avx512f && Bit(r7.edx, 23);
    f.amx_bf16 = tile_state && Bit(r7.edx, 22);
    f.amx_tile = tile_state && Bit(r7.edx, 24);
    if (r7.eax >= 1) {
      Regs r71 = Cpuid(7, 1);
      f.avx512_bf16 = f.avx512f && Bit(r71.eax, 5);
    }
  }
  if (__get_cpuid_max(0x80000000, nullptr) >= 0x80000004) {
    char brand[49] = {};
    for (uint32_t i = 0; i < 3; ++i) {
      Regs r = Cpuid(0x80000002 + i, 0);
      std::memcpy(brand + 16 * i, &r.eax, 4);
      std::memcpy(brand + 16 * i + 4, &r.ebx, 4);
      std::memcpy(brand + 16 * i + 8, &r.ecx, 4);
      std::memcpy(brand + 16 * i + 12, &r.edx, 4);
    }
    f.model = Trim(brand);
  }
  return f;
}

}  // namespace

std::string CpuFeatures::ToString() const {
  std::string out;
  auto add = [&](bool on, const char* name) {
    if (!on) return;
    if (!out.empty()) out += ' ';
    out += name;
  };
  add(sse41, "sse4.1");
  add(avx, "avx");
  add(avx2, "avx2");
  add(fma, "fma");
  add(f16c, "f16c");
  add(avx512f, "avx512f");
  add(avx512bw, "avx512bw");
  add(avx512vl, "avx512vl");
  add(avx512dq, "avx512dq");
  add(avx512_vnni, "avx512-vnni");
  add(avx512_bf16, "avx512-bf16");
  add(avx512_fp16, "avx512-fp16");
  add(amx_tile, "amx-tile");
  add(amx_bf16, "amx-bf16");
  return out.empty() ? "none" : out;
}

const CpuFeatures& HostCpuFeatures() {
  static const CpuFeatures features = Detect();
  return features;
}

const char* CpuIsaName(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kGeneric:
      return "generic";
    case CpuIsa::kAvx2:
      return "avx2";
    case CpuIsa::kAvx512:
      return "avx512";
  }
  return "?";
}

std::optional<CpuIsa> ParseCpuIsa(const std::string& name) {
  for (CpuIsa isa : {CpuIsa::kGeneric, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    if (name == CpuIsaName(isa)) return isa;
  }
  return std::nullopt;
}

bool CpuSupports(const CpuFeatures& f, CpuIsa isa) {
  const bool avx2 = f.avx2 && f.fma && f.f16c;
  const bool avx512 = avx2 && f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq;
  switch (isa) {
    case CpuIsa::kGeneric:
      return true;
    case CpuIsa::kAvx2:
      return avx2;
    case CpuIsa::kAvx512:
      return avx512;
  }
  return false;
}

CpuIsa BestCpuIsa(const CpuFeatures& f) {
  for (CpuIsa isa : {CpuIsa::kAvx512, CpuIsa::kAvx2}) {
    if (CpuSupports(f, isa)) return isa;
  }
  return CpuIsa::kGeneric;
}

CpuFeatures CpuFeaturesFromProcFlags(const std::string& flags) {
  std::set<std::string> set;
  std::istringstream in(flags);
  for (std::string w; in >> w;) set.insert(w);
  auto has = [&](const char* name) { return set.count(name) > 0; };
  CpuFeatures f;
  f.sse41 = has("sse4_1");
  f.avx = has("avx");
  f.avx2 = has("avx2");
  f.fma = has("fma");
  f.f16c = has("f16c");
  f.avx512f = has("avx512f");
  f.avx512bw = has("avx512bw");
  f.avx512vl = has("avx512vl");
  f.avx512dq = has("avx512dq");
  f.avx512_vnni = has("avx512_vnni");
  f.avx512_bf16 = has("avx512_bf16");
  f.avx512_fp16 = has("avx512_fp16");
  f.amx_tile = has("amx_tile");
  f.amx_bf16 = has("amx_bf16");
  return f;
}

}  // namespace failsafe
