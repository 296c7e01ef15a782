// What the tests that start device processes share: the failsafe program
// CTest names, and synthetic models written once per test process into its
// scratch directory (removed at exit).
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <tuple>

#include "common/rng.h"
#include "common/scratch_dir.h"
#include "model/synthetic.h"
#include "trace/workload.h"

namespace failsafe {

// Held by a test that measures how fast its device processes run against
// one another (a throttled device against its peers): two such tests at once
// on a machine of 2 cores starve each other's processes and blur what each
// measures. An exclusive lock (flock) on a file in the temporary directory,
// taken at construction (waiting for the holder) and held for the object's
// life; every other test runs beside it.
class MeasuringLock {
 public:
  explicit MeasuringLock(const std::string& name = "speeds") {
    const char* dir = std::getenv("TMPDIR");
    const std::string path =
        std::string(dir && *dir ? dir : "/tmp") + "/failsafe-test-" + name + ".lock";
    fd_ = ::open(path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0666);
    if (fd_ < 0) return;  // unlocked: the test still runs
    while (::flock(fd_, LOCK_EX) != 0 && errno == EINTR) {
    }
  }
  ~MeasuringLock() {
    if (fd_ >= 0) ::close(fd_);
  }
  MeasuringLock(const MeasuringLock&) = delete;
  MeasuringLock& operator=(const MeasuringLock&) = delete;

 private:
  int fd_ = -1;
};

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

// `n` requests whose prompts share leading blocks: each starts with 0 to 5
// blocks of `block_tokens` tokens common to one of `groups` prefixes, then
// has blocks of its own (prompt lengths 4 to 4 + max_prompt, outputs 4 to 43
// tokens).
inline Workload SharedPrefixWorkload(int n, uint64_t seed, int block_tokens = 16, int groups = 3,
                                     int max_prompt = 200) {
  Workload w;
  Rng rng(seed);
  for (int i = 0; i < n; ++i) {
    WorkloadRequest r;
    r.arrival_s = 0.0005 * i;
    r.input_len = 4 + static_cast<int>(rng.Below(max_prompt));
    r.output_len = 4 + static_cast<int>(rng.Below(40));
    r.block_tokens = block_tokens;
    const int64_t group = static_cast<int64_t>(rng.Below(groups));
    const int shared = static_cast<int>(rng.Below(6));
    for (int b = 0; b * block_tokens < r.input_len; ++b)
      r.hash_ids.push_back(b < shared ? group * 100 + b : 1000000 + i * 1000LL + b);
    w.requests.push_back(std::move(r));
  }
  return w;
}

}  // namespace failsafe
