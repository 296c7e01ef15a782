// What the tests that start device processes share: the failsafe program
// CTest names, and synthetic models written once per test process into its
// scratch directory (removed at exit).
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <tuple>

#include "common/scratch_dir.h"
#include "model/synthetic.h"

namespace failsafe {

// The failsafe program (FAILSAFE_TEST_BIN, which CTest sets); aborts without it.
inline std::string TestBinary() {
  const char* b = std::getenv("FAILSAFE_TEST_BIN");
  if (!b) {
    std::fprintf(stderr, "FAILSAFE_TEST_BIN must name the failsafe program (ctest sets it)\n");
    std::abort();
  }
  return b;
}

// The directory of a synthetic model of `preset`, weights drawn with `seed`
// and stored as `dtype`; written at the first call with these arguments.
inline const std::string& TestModelDir(const std::string& preset, uint64_t seed,
                                       DType dtype = DType::kF32) {
  static std::map<std::tuple<std::string, uint64_t, DType>, std::string> dirs;
  const auto key = std::make_tuple(preset, seed, dtype);
  auto it = dirs.find(key);
  if (it != dirs.end()) return it->second;
  const std::string dir = ProcessScratchDir().Sub(preset + "_" + std::to_string(seed) + "_" +
                                                  std::to_string(static_cast<int>(dtype)));
  SyntheticModelOptions o;
  o.preset = preset;
  o.dtype = dtype;
  o.seed = seed;
  const Status st = WriteSyntheticModel(dir, o);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return dirs[key] = dir;
}

}  // namespace failsafe
