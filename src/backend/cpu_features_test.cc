#include "backend/cpu_features.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>

namespace failsafe {
namespace {

// The first processor's line `key : value` of /proc/cpuinfo.
std::string ProcCpuinfo(const std::string& key) {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(key, 0) != 0) continue;
    auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string name = line.substr(0, colon);
    while (!name.empty() && (name.back() == ' ' || name.back() == '\t')) name.pop_back();
    if (name != key) continue;
    return colon + 2 <= line.size() ? line.substr(colon + 2) : "";
  }
  return "";
}

TEST(CpuFeatures, CpuidAgreesWithTheKernel) {
  const std::string flags = ProcCpuinfo("flags");
  if (flags.empty()) GTEST_SKIP() << "no /proc/cpuinfo flags";
  const CpuFeatures& got = HostCpuFeatures();
  const CpuFeatures want = CpuFeaturesFromProcFlags(flags);
  EXPECT_EQ(got.sse41, want.sse41);
  EXPECT_EQ(got.avx, want.avx);
  EXPECT_EQ(got.avx2, want.avx2);
  EXPECT_EQ(got.fma, want.fma);
  EXPECT_EQ(got.f16c, want.f16c);
  EXPECT_EQ(got.avx512f, want.avx512f);
  EXPECT_EQ(got.avx512bw, want.avx512bw);
  EXPECT_EQ(got.avx512vl, want.avx512vl);
  EXPECT_EQ(got.avx512dq, want.avx512dq);
  EXPECT_EQ(got.avx512_vnni, want.avx512_vnni);
  EXPECT_EQ(got.avx512_bf16, want.avx512_bf16);
  EXPECT_EQ(got.avx512_fp16, want.avx512_fp16);
  EXPECT_EQ(got.amx_tile, want.amx_tile);
  EXPECT_EQ(got.amx_bf16, want.amx_bf16);
  // The brand string is not compared: under a hypervisor the kernel may
  // name the CPU otherwise than cpuid does in user space (seen: cpuid's
  // "Oxide Virtual Turin-like Processor" as "AMD EPYC" in /proc/cpuinfo).
  EXPECT_FALSE(got.model.empty());
  EXPECT_EQ(got.vendor, ProcCpuinfo("vendor_id"));
  EXPECT_EQ(got.family, std::stoi(ProcCpuinfo("cpu family")));
  EXPECT_EQ(got.model_id, std::stoi(ProcCpuinfo("model")));
}

TEST(CpuFeatures, LevelsNeedTheLevelsBelow) {
  CpuFeatures f;
  EXPECT_EQ(BestCpuIsa(f), CpuIsa::kGeneric);
  f.avx = f.avx2 = f.fma = true;
  EXPECT_EQ(BestCpuIsa(f), CpuIsa::kGeneric);  // no F16C
  f.f16c = true;
  EXPECT_EQ(BestCpuIsa(f), CpuIsa::kAvx2);
  f.avx512f = f.avx512bw = f.avx512vl = true;
  EXPECT_EQ(BestCpuIsa(f), CpuIsa::kAvx2);  // no AVX512DQ
  f.avx512dq = true;
  EXPECT_EQ(BestCpuIsa(f), CpuIsa::kAvx512);
  EXPECT_TRUE(CpuSupports(f, CpuIsa::kAvx2));
  f.f16c = false;
  EXPECT_FALSE(CpuSupports(f, CpuIsa::kAvx512));
  EXPECT_EQ(f.ToString(), "avx avx2 fma avx512f avx512bw avx512vl avx512dq");
  for (CpuIsa isa : {CpuIsa::kGeneric, CpuIsa::kAvx2, CpuIsa::kAvx512})
    EXPECT_EQ(ParseCpuIsa(CpuIsaName(isa)), isa);
  EXPECT_EQ(ParseCpuIsa("avx512-bf16"), std::nullopt);
}

}  // namespace
}  // namespace failsafe
