#include "trace/workload.h"

#include <gtest/gtest.h>

#include <unistd.h>
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>

#include "common/scratch_dir.h"

namespace failsafe {
namespace {

std::string Write(const std::string& text) {
  static int n = 0;
  auto p = ProcessScratchDir().Sub(std::to_string(n++) + ".jsonl");
  std::ofstream(p) << text;
  return p;
}

TEST(Workload, ReadsAndScales) {
  auto path = Write(R"({"timestamp": 0, "input_length": 1000, "output_length": 300}
{"timestamp": 2000, "input_length": 50, "output_length": 9, "hash_ids": [1]}
)");
  WorkloadOptions o;
  o.length_scale = 0.1;
  o.time_scale = 0.5;
  auto w = ReadJsonlWorkload(path, o);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  ASSERT_EQ(w->requests.size(), 2u);
  EXPECT_EQ(w->requests[0].input_len, 100);
  EXPECT_EQ(w->requests[0].output_len, 30);
  EXPECT_EQ(w->requests[1].output_len, 1);  // at least one token
  EXPECT_DOUBLE_EQ(w->requests[1].arrival_s, 1.0);
}

TEST(Workload, BadLinesNameTheLineOrAreCounted) {
  auto path = Write(R"({"input_length": 10, "output_length": 5}
{"input_length": -3, "output_length": 5}
{"output_length": 5}
not json
{"input_length": 5000, "output_length": 5}
{"input_length": 7, "output_length": 2}
)");
  WorkloadOptions o;
  o.max_context = 1000;
  auto w = ReadJsonlWorkload(path, o);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find(":2: lengths must be positive"), std::string::npos)
      << w.status().message();
  o.skip_invalid = true;
  w = ReadJsonlWorkload(path, o);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(w->requests.size(), 2u);
  EXPECT_EQ(w->skipped, 4);
}

TEST(Workload, OpenThoughtsMatchesThePapersStatistics) {
  WorkloadOptions o;
  o.seed = 1;
  Workload w = OpenThoughtsWorkload(20000, o);
  std::vector<int> in, out;
  for (auto& r : w.requests) {
    in.push_back(r.input_len);
    out.push_back(r.output_len);
  }
  auto mean = [](const std::vector<int>& v) {
    return std::accumulate(v.begin(), v.end(), 0.0) / v.size();
  };
  auto median = [](std::vector<int> v) {
    std::sort(v.begin(), v.end());
    return static_cast<double>(v[v.size() / 2]);
  };
  EXPECT_NEAR(median(in), 352, 15);
  EXPECT_NEAR(mean(in), 422, 20);
  EXPECT_NEAR(median(out), 5583, 250);
  EXPECT_NEAR(mean(out), 7295, 400);
  EXPECT_LE(*std::max_element(in.begin(), in.end()), 7633);
  // Same seed, same workload.
  EXPECT_EQ(OpenThoughtsWorkload(100, o).requests[42].output_len, w.requests[42].output_len);
}

TEST(Workload, MooncakeTraceIsThere) {
  std::string dir = FindDataDir("");
  if (!std::filesystem::exists(dir + "/mooncake/conversation_trace.jsonl"))
    GTEST_SKIP() << "no shared data";
  WorkloadOptions o;
  o.max_requests = 3000;
  auto w = LoadWorkload("mooncake", dir, o);
  ASSERT_TRUE(w.ok());
  ASSERT_EQ(w->requests.size(), 3000u);
  double sum = 0;
  for (auto& r : w->requests) sum += r.input_len;
  EXPECT_NEAR(sum / 3000, 13516, 5);  // the paper's first 3,000 requests
}

}  // namespace
}  // namespace failsafe
