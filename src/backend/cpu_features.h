// What the CPU this process runs on can do, read once with cpuid (and xgetbv
// for the register state the OS enables), never from a library's model table.
//
// Thread-safety: HostCpuFeatures() detects on first use (thread-safe static)
// and returns an immutable value.
#pragma once

#include <optional>
#include <string>

namespace failsafe {

struct CpuFeatures {
  std::string vendor;  // "GenuineIntel", "AuthenticAMD", ...
  std::string model;   // brand string, e.g. "AMD EPYC 9454 48-Core Processor"
  int family = 0;      // display family and model (cpuid leaf 1)
  int model_id = 0;
  // Instruction sets usable by this process: the CPU has them and the OS
  // saves their registers.
  bool sse41 = false;
  bool avx = false;
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512dq = false;
  bool avx512_vnni = false;
  bool avx512_bf16 = false;  // vdpbf16ps, vcvtne2ps2bf16
  bool avx512_fp16 = false;
  bool amx_tile = false;  // AMX tiles with their state enabled by the OS (XCR0)
  bool amx_bf16 = false;

  // "avx2 fma f16c avx512f ... amx-bf16": the flags above that are set.
  std::string ToString() const;
};

// The features of the CPU this process runs on.
const CpuFeatures& HostCpuFeatures();

// The instruction-set levels the engine's own CPU kernels are built for, lowest
// first. Each level needs the features of the ones below it.
enum class CpuIsa {
  kGeneric,  // any x86-64
  kAvx2,     // AVX2, FMA, F16C
  kAvx512,   // AVX-512 F, BW, VL, DQ (with the AVX2 level's features)
};
const char* CpuIsaName(CpuIsa isa);  // "generic", "avx2", "avx512"
// The level named `name`, if any.
std::optional<CpuIsa> ParseCpuIsa(const std::string& name);
bool CpuSupports(const CpuFeatures& f, CpuIsa isa);
// The highest level `f` supports.
CpuIsa BestCpuIsa(const CpuFeatures& f);

// Parses the flags line of /proc/cpuinfo's first processor into the same
// fields (the kernel's view, for tests to compare cpuid's with).
CpuFeatures CpuFeaturesFromProcFlags(const std::string& flags);

}  // namespace failsafe
