#include "sim/availability.h"

#include <gtest/gtest.h>

#include <sstream>

#include "trace/workload.h"

namespace failsafe {
namespace {

Result<AvailabilityTrace> Parse(const std::string& text) {
  std::istringstream in(text);
  return ParseAvailabilityTrace(in, "t.csv");
}

// The error's message, or "" when parsing succeeded.
std::string Error(const std::string& text) {
  auto r = Parse(text);
  return r.ok() ? "" : r.status().message();
}

TEST(Availability, ReadsSamples) {
  auto t = Parse(
      "2021-12-11, 23:59:00, 60\n"
      "\n"
      "# a comment\n"
      "2021-12-12, 00:00:40, 64\n"
      "2021-12-12, 00:01:40, 62\n");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->format, AvailabilityFormat::kSamples);
  ASSERT_EQ(t->points.size(), 3u);
  EXPECT_EQ(t->points[0].t_s, 0);
  EXPECT_EQ(t->points[1].t_s, 100);  // across midnight
  EXPECT_EQ(t->points[2].t_s, 160);
  EXPECT_EQ(t->points[1].count, 64);
  EXPECT_EQ(t->span_s(), 160);
  EXPECT_EQ(t->peak(), 64);
  EXPECT_DOUBLE_EQ(t->mean(), (60 * 100 + 64 * 60) / 160.0);
  EXPECT_EQ(t->reordered, 0);
}

TEST(Availability, ReadsEventsAsNodesPresent) {
  auto t = Parse(
      "1000,add,a\n"
      "1000,add,b\n"
      "1000,add,c\n"
      "61000,remove,b\n"
      "121000,add,b\n"
      "181000,remove,a\n");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->format, AvailabilityFormat::kEvents);
  ASSERT_EQ(t->points.size(), 4u);  // one point per distinct time
  EXPECT_EQ(t->points[0].t_s, 0);   // starts at the first row
  EXPECT_EQ(t->points[0].count, 3);
  EXPECT_EQ(t->points[1].t_s, 60);
  EXPECT_EQ(t->points[1].count, 2);
  EXPECT_EQ(t->points[2].count, 3);
  EXPECT_EQ(t->points[3].count, 2);
  EXPECT_EQ(t->span_s(), 180);
}

// A byte order mark before the first row, as spreadsheets write, is skipped.
TEST(Availability, SkipsAByteOrderMark) {
  auto t = Parse(
      "\xEF\xBB\xBF"
      "2021-01-01, 00:00:00, 5\n2021-01-01, 00:01:00, 6\n");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->points.size(), 2u);
  auto e = Parse(
      "\xEF\xBB\xBF"
      "0,add,a\n10,add,b\n");
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ(e->format, AvailabilityFormat::kEvents);
}

TEST(Availability, SortsRowsOutOfOrderAndCountsThem) {
  auto t = Parse(
      "0,add,a\n"
      "5000,remove,a\n"
      "2000,add,b\n"  // out of order
      "9000,remove,b\n");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->reordered, 1);
  ASSERT_EQ(t->points.size(), 4u);
  EXPECT_EQ(t->points[1].t_s, 2);
  EXPECT_EQ(t->points[1].count, 2);
  EXPECT_EQ(t->points[2].count, 1);
  auto s = Parse("2021-01-01, 00:10:00, 5\n2021-01-01, 00:00:00, 7\n");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->reordered, 1);
  EXPECT_EQ(s->points[0].count, 7);
  EXPECT_EQ(s->points[1].t_s, 600);
}

TEST(Availability, RejectsBadRowsNamingTheLine) {
  EXPECT_NE(Error("0,add,a\n10,add,b\n20,oops,c\n").find("t.csv:3:"), std::string::npos);
  EXPECT_NE(Error("0,add,a\n10,remove,z\n").find("t.csv:2: node 'z' removed"), std::string::npos);
  EXPECT_NE(Error("0,add,a\n10,add,a\n").find("t.csv:2: node 'a' added"), std::string::npos);
  EXPECT_NE(Error("-5,add,a\n10,add,b\n").find("t.csv:1:"), std::string::npos);
  EXPECT_NE(Error("0,add,a\nx,add,b\n").find("t.csv:2:"), std::string::npos);
  EXPECT_NE(Error("0,add,\n").find("t.csv:1:"), std::string::npos);
  EXPECT_NE(Error("2021-01-01, 00:00:00, 5\n2021-01-01, 00:01:00, -1\n").find("t.csv:2:"),
            std::string::npos);
  EXPECT_NE(Error("2021-01-01, 00:00:00, 5\n2021-13-01, 00:01:00, 5\n").find("t.csv:2:"),
            std::string::npos);
  EXPECT_NE(Error("2021-01-01, 00:00:00, 5\n2021-01-01, 00:01:00, 2.5\n").find("t.csv:2:"),
            std::string::npos);
  // Days that do not exist are malformed, not normalised into the next month.
  EXPECT_NE(Error("2023-02-27, 00:00:00, 5\n2023-02-30, 00:01:00, 5\n").find("t.csv:2:"),
            std::string::npos);
  EXPECT_NE(Error("2023-04-31, 00:00:00, 5\n").find("t.csv:1:"), std::string::npos);
  EXPECT_EQ(Error("2024-02-29, 00:00:00, 5\n2024-03-01, 00:00:00, 5\n"), "");  // a leap day
  EXPECT_NE(Error("2021-01-01, 00:00:00, 5\n10,add,a\n").find("t.csv:2:"), std::string::npos);
  EXPECT_NE(Error("hello\n").find("t.csv:1: not an availability trace"), std::string::npos);
  EXPECT_NE(Error("").find("no availability rows"), std::string::npos);
  EXPECT_NE(Error("0,add,a\n0,add,b\n").find("same time"), std::string::npos);
  // A removal that only an out-of-order row makes valid is valid once sorted;
  // one that sorting makes invalid names its line.
  EXPECT_EQ(Error("10,remove,a\n0,add,a\n"), "");
  EXPECT_NE(Error("0,add,a\n20,add,b\n10,remove,b\n").find("t.csv:3:"), std::string::npos);
  EXPECT_FALSE(ReadAvailabilityTrace("/nonexistent/trace.csv").ok());
}

TEST(Availability, ScalesThePeakToTheClusterOrRejectsOverflow) {
  auto t = Parse("0,add,a\n0,add,b\n0,add,c\n60000,remove,a\n120000,remove,b\n180000,add,a\n");
  ASSERT_TRUE(t.ok());
  auto s = ScaleAvailability(*t, 64, AvailabilityScale::kPeak);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_DOUBLE_EQ(s->factor, 64.0 / 3);
  EXPECT_EQ(s->points[0].count, 64);
  EXPECT_EQ(s->points[1].count, 43);  // 2 * 64 / 3 = 42.67
  EXPECT_EQ(s->points[2].count, 21);
  // Unscaled counts above the cluster are an error, never clamped.
  auto big = Parse("2021-01-01, 00:00:00, 64\n2021-01-01, 00:01:00, 70\n");
  ASSERT_TRUE(big.ok());
  auto n = ScaleAvailability(*big, 64, AvailabilityScale::kNone);
  ASSERT_FALSE(n.ok());
  EXPECT_NE(n.status().message().find("70 GPUs"), std::string::npos) << n.status().message();
  auto ok = ScaleAvailability(*big, 80, AvailabilityScale::kNone);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->points[1].count, 70);
  auto down = ScaleAvailability(*big, 35, AvailabilityScale::kPeak);
  ASSERT_TRUE(down.ok());
  EXPECT_EQ(down->points[1].count, 35);
  EXPECT_EQ(down->points[0].count, 32);
  EXPECT_FALSE(ParseAvailabilityScale("clamp").ok());
  auto zero = Parse("0,add,a\n10,remove,a\n");
  ASSERT_TRUE(zero.ok());
  EXPECT_TRUE(ScaleAvailability(*zero, 8, AvailabilityScale::kPeak).ok());
}

// Every trace shipped in data/ reads, in its own format, without reordering.
TEST(Availability, ReadsEveryShippedTrace) {
  const std::string data = FindDataDir("");
  struct Want {
    const char* path;
    AvailabilityFormat format;
    int peak;
  };
  for (const Want& w :
       {Want{"bamboo/gcloud/a100x1-east1b.txt", AvailabilityFormat::kSamples, 64},
        Want{"bamboo/g4dn-trace.csv", AvailabilityFormat::kEvents, 24},
        Want{"oobleck/scaled/scale_gcp-trace.csv", AvailabilityFormat::kEvents, 30},
        Want{"oobleck/synthetic_failure_freq/1h.csv", AvailabilityFormat::kEvents, 30}}) {
    auto t = ReadAvailabilityTrace(data + "/availability/" + w.path);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    EXPECT_EQ(t->format, w.format) << w.path;
    EXPECT_EQ(t->peak(), w.peak) << w.path;
    EXPECT_EQ(t->reordered, 0) << w.path;
  }
}

}  // namespace
}  // namespace failsafe
