// offline-gcp's step-by-step mode against its steady-state composition, on
// short synthetic availability traces.
#include <gtest/gtest.h>

#include <bit>
#include <filesystem>
#include <fstream>

#include "common/scratch_dir.h"
#include "sim/experiments.h"
#include "sim/offline_gcp.h"

namespace failsafe {
namespace {

std::string TempDir() {
  std::string d =
      ProcessScratchDir().Sub(::testing::UnitTest::GetInstance()->current_test_info()->name());
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

// A sample-format trace: `counts[i]` GPUs from hour i * step_h on, ending at
// hour counts.size() * step_h.
std::string WriteTrace(const std::string& dir, const std::vector<int>& counts, double step_h) {
  const std::string path = dir + "/trace.txt";
  std::ofstream f(path);
  for (size_t i = 0; i <= counts.size(); ++i) {
    const int s = static_cast<int>(i * step_h * 3600);
    f << fmt::format("2024-01-01, {:02d}:{:02d}:{:02d}, {}\n", s / 3600, s / 60 % 60, s % 60,
                     counts[std::min(i, counts.size() - 1)]);
  }
  return path;
}

// Nodes of four GPUs (the fewest that serve 70B in bf16 with room), two
// unless a test says otherwise.
ExperimentOptions TwoNodes(const std::string& dir, const std::vector<int>& counts, double step_h) {
  ExperimentOptions o;
  o.out_dir = dir;
  o.quick = true;
  o.nodes = 2;
  o.gpus_per_node = 4;
  o.availability_scale = "none";
  o.availability_file = WriteTrace(dir, counts, step_h);
  o.offline_mode = "step";
  // Steady rates past the first batches' transient, as without --quick.
  o.steady_warmup_s = 900;
  o.steady_window_s = 600;
  return o;
}

// [row][column] of a CSV file, without its header.
std::vector<std::vector<double>> ReadCsv(const std::string& path) {
  std::ifstream f(path);
  std::string line;
  std::getline(f, line);
  std::vector<std::vector<double>> rows;
  while (std::getline(f, line)) {
    std::vector<double> row;
    size_t at = 0;
    while (at <= line.size()) {
      const size_t comma = std::min(line.find(',', at), line.size());
      row.push_back(std::stod(line.substr(at, comma - at)));
      at = comma + 1;
    }
    rows.push_back(row);
  }
  return rows;
}

}  // namespace

// The failure model: the trace's count at every point, a node never holds
// more than its GPUs, and changes are GPU by GPU (a bit per device).
TEST(OfflineGcp, NodeMasksFollowTheTrace) {
  std::vector<AvailabilityPoint> trace;
  for (int c : {16, 13, 9, 16, 0, 5}) trace.push_back({trace.size() * 60.0, c});
  const auto masks = NodeAliveMasks(trace, 2, 8, 3);
  ASSERT_EQ(masks.size(), trace.size());
  for (size_t i = 0; i < trace.size(); ++i) {
    int n = 0;
    for (uint64_t m : masks[i]) {
      EXPECT_EQ(m & ~uint64_t{0xff}, 0u);
      n += std::popcount(m);
    }
    EXPECT_EQ(n, trace[i].count) << i;
  }
  EXPECT_EQ(masks, NodeAliveMasks(trace, 2, 8, 3)) << "seeded";
  // The baseline keeps its group through a spare's loss, restarts on its own.
  BaselineGroup g;
  EXPECT_TRUE(g.Update(0xff, 8));
  EXPECT_TRUE(g.Update(0x7f, 4));  // 7 alive: TP4 on devices 0-3
  EXPECT_EQ(g.devices, 0x0fu);
  EXPECT_FALSE(g.Update(0x3f, 4));  // a spare lost
  EXPECT_TRUE(g.Update(0x3e, 4));   // device 0 lost: a restart on 1-4
  EXPECT_EQ(g.devices, 0x1eu);
}

// With a constant availability nothing changes: run step by step, the
// trace gives each node's steady rate measured over the same span (the
// steady mode's table with no warm-up and the trace as its window), within
// 1%.
TEST(OfflineGcp, StepMatchesSteadyUnderConstantAvailability) {
  const std::string dir = TempDir();
  ExperimentOptions o = TwoNodes(dir, {8}, 0.5);
  o.skip_steady = false;
  o.steady_warmup_s = 0;
  o.steady_window_s = 1800;
  auto j = RunExperiment("offline-gcp", o);
  ASSERT_TRUE(j.ok()) << j.status().ToString();
  const auto& step = (*j)["step"];
  EXPECT_NEAR(step["over_steady"]["failsafe"].get<double>(), 1.0, 0.01) << j->dump(2);
  EXPECT_NEAR(step["over_steady"]["baseline"].get<double>(), 1.0, 0.01) << j->dump(2);
  EXPECT_EQ(step["failsafe"]["reconfigurations"].get<int>(), 0);
  EXPECT_EQ(step["failsafe"]["skipped_s"].get<double>(), 0);
  EXPECT_TRUE(std::filesystem::exists(dir + "/offline_gcp_step.csv"));
}

// Time skipping credits the mean of whole passes through the workload: a
// node's rate swings with the workload's order, and repeats every pass, so
// on a flat trace skipping most of the time gives what running every step
// gives, within 1% (here -0.8% for FailSafe and -0.5% for the baseline;
// crediting two 5-minute periods within 3% of each other, as skipping did
// before, gave +3.0% and +1.9%).
TEST(OfflineGcp, SkippingMatchesEveryStepOnAFlatTrace) {
  const std::string dir = TempDir();
  ExperimentOptions o = TwoNodes(dir, {4}, 2.0);
  o.nodes = 1;
  o.steady_warmup_s = o.steady_window_s = -1;  // the quick ones: only the step run is checked
  auto every = RunExperiment("offline-gcp", [&] {
    ExperimentOptions n = o;
    n.skip_steady = false;
    return n;
  }());
  ASSERT_TRUE(every.ok()) << every.status().ToString();
  auto skipped = RunExperiment("offline-gcp", o);
  ASSERT_TRUE(skipped.ok()) << skipped.status().ToString();
  for (const char* s : {"failsafe", "baseline"}) {
    const auto& a = (*every)["step"][s];
    const auto& b = (*skipped)["step"][s];
    EXPECT_EQ(a["skipped_s"].get<double>(), 0) << s;
    EXPECT_GT(b["skipped_s"].get<double>(), 0.4 * 7200) << s << ": " << b.dump();
    EXPECT_GE(b["passes"].get<int>(), 1) << s;
    EXPECT_NEAR(b["mean_tokens_per_s"].get<double>() / a["mean_tokens_per_s"].get<double>(), 1.0,
                0.01)
        << s;
  }
}

// A GPU lost at hour 1 of 2 and regained 40 minutes later: the step run's
// throughput drops in the timeline row of hour 1, not before, and rises
// again after the rejoin; FailSafe recovers in place through the engine (a
// node of 3 GPUs still serves 70B) where the baseline's node, below TP4,
// serves nothing.
TEST(OfflineGcp, ADropShowsUpWhenItHappens) {
  const std::string dir = TempDir();
  ExperimentOptions o = TwoNodes(dir, {4, 4, 4, 3, 3, 4}, 1.0 / 3);
  o.nodes = 1;
  o.steady_warmup_s = o.steady_window_s = -1;  // the quick ones: only the step run is checked
  auto j = RunExperiment("offline-gcp", o);
  ASSERT_TRUE(j.ok()) << j.status().ToString();
  const auto& step = (*j)["step"];
  EXPECT_EQ(step["failsafe"]["reconfigurations"].get<int>(), 2);  // a loss, a rejoin
  EXPECT_EQ(step["baseline"]["reconfigurations"].get<int>(), 2);  // to nothing, back to TP4
  const auto rows = ReadCsv(dir + "/offline_gcp_step.csv");
  ASSERT_EQ(rows.size(), 12u);  // 2 h in rows of 600 s
  for (int col : {1, 2}) {
    double before = 0;
    for (int r = 2; r < 6; ++r) before += rows[r][col] / 4;
    for (int r = 1; r < 6; ++r) EXPECT_GT(rows[r][col], 0.85 * before) << r << " " << col;
    EXPECT_LT(rows[6][col], 0.9 * before) << "the row of hour 1 has the loss, " << col;
    for (int r = 7; r < 10; ++r) EXPECT_LT(rows[r][col], 0.8 * before) << r << " " << col;
    EXPECT_GT(rows[11][col], rows[8][col] * 1.1) << "the rejoin, " << col;
  }
  for (int r = 7; r < 10; ++r) {
    EXPECT_GT(rows[r][2], rows[r][1] * 1.2) << "FailSafe's node of 3 GPUs serves, row " << r;
  }
  EXPECT_GT(step["failsafe_over_baseline"].get<double>(), 1.0);
  // A switching delay stalls every system at every reconfiguration.
  o.switch_delay_s = 120;
  auto slow = RunExperiment("offline-gcp", o);
  ASSERT_TRUE(slow.ok()) << slow.status().ToString();
  for (const char* s : {"failsafe", "baseline"}) {
    EXPECT_LT((*slow)["step"][s]["mean_tokens_per_s"].get<double>(),
              step[s]["mean_tokens_per_s"].get<double>())
        << s;
    EXPECT_LT((*slow)["mean_tokens_per_s"][s].get<double>(),
              (*j)["mean_tokens_per_s"][s].get<double>())
        << s;
  }
}

TEST(OfflineGcp, BadModesAreErrors) {
  ExperimentOptions o = TwoNodes(TempDir(), {8}, 1.0);
  o.offline_mode = "stepwise";
  EXPECT_FALSE(RunExperiment("offline-gcp", o).ok());
  o.offline_mode = "step";
  o.switch_delay_s = -1;
  EXPECT_FALSE(RunExperiment("offline-gcp", o).ok());
}

}  // namespace failsafe
