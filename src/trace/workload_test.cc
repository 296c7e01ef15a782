#include "trace/workload.h"

#include <gtest/gtest.h>

#include <unistd.h>
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
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

// Rows out of order run in arrival order (stably), and are counted.
TEST(Workload, RowsOutOfOrderAreSortedByArrival) {
  auto path = Write(R"({"timestamp": 3000, "input_length": 1, "output_length": 1}
{"timestamp": 1000, "input_length": 2, "output_length": 1}
{"timestamp": 3000, "input_length": 3, "output_length": 1}
{"input_length": 4, "output_length": 1}
{"timestamp": 2000, "input_length": 5, "output_length": 1}
)");
  auto w = ReadJsonlWorkload(path, {});
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  std::vector<int> order;
  for (auto& r : w->requests) order.push_back(r.input_len);
  EXPECT_EQ(order, (std::vector<int>{4, 2, 5, 1, 3}));
  EXPECT_EQ(w->reordered, 3);
  for (size_t i = 1; i < w->requests.size(); ++i)
    EXPECT_LE(w->requests[i - 1].arrival_s, w->requests[i].arrival_s);
}

// Lengths that do not fit an int after scaling, and traces with nothing to
// run, are errors naming the file (and line).
TEST(Workload, HugeLengthsAndEmptyTracesAreErrors) {
  auto huge = Write(R"({"input_length": 10, "output_length": 5}
{"input_length": 5000000000, "output_length": 5}
)");
  auto w = ReadJsonlWorkload(huge, {});
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find(huge + ":2: lengths (input 5000000000, output 5) exceed"),
            std::string::npos)
      << w.status().message();
  WorkloadOptions scaled;
  scaled.length_scale = 1e6;
  w = ReadJsonlWorkload(Write(R"({"input_length": 100, "output_length": 5})"), scaled);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find(":1: lengths"), std::string::npos);

  auto empty = Write("\n  \n");
  w = ReadJsonlWorkload(empty, {});
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().message(), empty + ": no requests (2 lines, 0 skipped as invalid)");
  WorkloadOptions skip;
  skip.skip_invalid = true;
  auto all_bad = Write("{}\nnot json\n");
  w = ReadJsonlWorkload(all_bad, skip);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().message(), all_bad + ": no requests (2 lines, 2 skipped as invalid)");
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
  // hash_ids are kept: one per 512 prompt tokens, and the trace shares
  // prefixes (ids repeat across requests).
  std::map<int64_t, int> uses;
  for (auto& r : w->requests) {
    EXPECT_EQ(static_cast<int>(r.hash_ids.size()), (r.input_len + 511) / 512);
    for (int64_t id : r.hash_ids) uses[id]++;
  }
  int shared = 0;
  for (auto& [id, n] : uses) shared += n > 1;
  EXPECT_GT(shared, 0);
}

// Equal hash ids give equal prompt blocks, at any length scale; different ids
// (and the tail past the hashed blocks) give different tokens.
TEST(Workload, EqualHashIdsGiveEqualBlocks) {
  auto path = Write(R"({"input_length": 1500, "output_length": 5, "hash_ids": [4, 9, 2]}
{"input_length": 1200, "output_length": 5, "hash_ids": [4, 9, 3]}
{"input_length": 1100, "output_length": 5, "hash_ids": [4, 7]}
{"input_length": 900, "output_length": 5}
)");
  for (double scale : {1.0, 0.1, 0.37}) {
    SCOPED_TRACE(scale);
    WorkloadOptions o;
    o.length_scale = scale;
    auto w = ReadJsonlWorkload(path, o);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    const int block = std::max(1, static_cast<int>(std::lround(512 * scale)));
    std::vector<std::vector<int32_t>> p;
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(w->requests[i].block_tokens, block);
      p.push_back(WorkloadPrompt(w->requests[i], i, 42, 0, 32000));
      EXPECT_EQ(static_cast<int>(p[i].size()), w->requests[i].input_len);
    }
    auto same = [&](int a, int b, int from, int to) {
      return std::equal(p[a].begin() + from, p[a].begin() + to, p[b].begin() + from);
    };
    EXPECT_TRUE(same(0, 1, 0, 2 * block));  // ids 4, 9
    EXPECT_FALSE(same(0, 1, 2 * block, std::min(p[0].size(), p[1].size())));
    EXPECT_TRUE(same(0, 2, 0, block));  // id 4
    EXPECT_FALSE(same(0, 2, block, 2 * block));
    EXPECT_FALSE(same(0, 3, 0, block));  // no ids: its own tokens
    // The same request draws the same prompt again.
    EXPECT_EQ(WorkloadPrompt(w->requests[0], 0, 42, 0, 32000), p[0]);
  }
  auto bad = Write(R"({"input_length": 600, "output_length": 5, "hash_ids": [1, 2, 3]}
{"input_length": 600, "output_length": 5, "hash_ids": [1, -2]}
{"input_length": 600, "output_length": 5, "hash_ids": "1"}
)");
  auto w = ReadJsonlWorkload(bad, {});
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find(":2: field 'hash_ids' is not an array of non-negative"),
            std::string::npos)
      << w.status().message();
  WorkloadOptions skip;
  skip.skip_invalid = true;
  w = ReadJsonlWorkload(bad, skip);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(w->skipped, 2);
  // Ids past the prompt's blocks are not used: the prompt is its own length.
  ASSERT_EQ(w->requests.size(), 1u);
  EXPECT_EQ(WorkloadPrompt(w->requests[0], 0, 1, 0, 100).size(), 600u);
}

}  // namespace
}  // namespace failsafe
