// The slow-device monitor on made-up step timings: speed is work over compute
// time relative to the healthy peers, a device is slow only over a whole
// window, and shares change only when the speed moves well away from them.
#include "engine/slow_devices.h"

#include <gtest/gtest.h>

namespace failsafe {
namespace {

constexpr int64_t kMs = 1000000;

// A step where device d did flops[d] of work in ns[d] of compute wall time.
StepTiming Timing(const std::vector<double>& flops, const std::vector<int64_t>& ns) {
  StepTiming t;
  for (size_t d = 0; d < flops.size(); ++d) {
    t.devices.push_back(static_cast<int>(d));
    t.device_attention_flops.push_back(flops[d] / 4);
    t.device_ffn_flops.push_back(flops[d] * 3 / 4);
    t.device_compute_wall_ns.push_back(ns[d]);
    t.device_compute_ns.push_back(ns[d]);
  }
  return t;
}

SlowDeviceOptions Options() {
  SlowDeviceOptions o;
  o.window_ms = 100;
  o.min_steps = 5;
  return o;
}

// Feeds `steps` steps 10 ms apart starting at *now.
void Feed(SlowDeviceMonitor& m, const StepTiming& t, int steps, int64_t* now) {
  for (int i = 0; i < steps; ++i) {
    m.Observe(t, *now);
    *now += 10 * kMs;
  }
}

TEST(SlowDevices, EqualSpeedsAreNotSlow) {
  SlowDeviceMonitor m(4, Options());
  int64_t now = 0;
  // Unequal work, same speed: nobody is slow.
  Feed(m, Timing({1e9, 1e9, 2e9, 1e9}, {10 * kMs, 10 * kMs, 20 * kMs, 10 * kMs}), 20, &now);
  std::vector<double> shares;
  EXPECT_FALSE(m.ProposeShares(&shares, nullptr));
  for (const MeasuredSpeed& s : m.speeds()) {
    EXPECT_TRUE(s.measured);
    EXPECT_FALSE(s.slow) << s.device;
    EXPECT_NEAR(s.relative_speed, 1.0, 1e-9);
    EXPECT_NEAR(s.gflops_per_s, 100.0, 1e-6);
  }
  EXPECT_NEAR(m.speeds()[2].work_fraction, 0.4, 1e-9);
}

TEST(SlowDevices, AHalfSpeedDeviceIsSlowOnlyAfterAWholeWindow) {
  SlowDeviceMonitor m(4, Options());
  int64_t now = 0;
  const StepTiming t = Timing({1e9, 1e9, 1e9, 1e9}, {10 * kMs, 20 * kMs, 10 * kMs, 10 * kMs});
  Feed(m, t, 4, &now);  // not yet a window (steps and time)
  EXPECT_FALSE(m.speeds()[1].measured);
  std::vector<double> shares;
  EXPECT_FALSE(m.ProposeShares(&shares, nullptr));
  Feed(m, t, 10, &now);
  const auto speeds = m.speeds();
  EXPECT_TRUE(speeds[1].slow);
  EXPECT_NEAR(speeds[1].relative_speed, 0.5, 1e-9);
  EXPECT_FALSE(speeds[0].slow);
  std::string why;
  ASSERT_TRUE(m.ProposeShares(&shares, &why));
  EXPECT_EQ(shares, (std::vector<double>{1, 0.5, 1, 1}));
  EXPECT_NE(why.find("device 1"), std::string::npos) << why;

  // In force: with half the work it takes the same time as the others, and
  // its speed is still half: no further change.
  m.PlanChanged(shares);
  EXPECT_FALSE(m.speeds()[1].measured);
  EXPECT_TRUE(m.uneven());
  Feed(m, Timing({1.14e9, 0.57e9, 1.14e9, 1.14e9}, {11 * kMs, 11 * kMs, 11 * kMs, 11 * kMs}), 20,
       &now);
  EXPECT_FALSE(m.ProposeShares(&shares, nullptr));
  EXPECT_TRUE(m.speeds()[1].slow);

  // Well again (full speed on its smaller share): its share rises, but only
  // after several windows, a step at a time, and not to the share it was too
  // slow for until a minute has passed.
  const StepTiming well =
      Timing({1.14e9, 0.57e9, 1.14e9, 1.14e9}, {11 * kMs, 6 * kMs, 11 * kMs, 11 * kMs});
  Feed(m, well, 20, &now);
  EXPECT_FALSE(m.ProposeShares(&shares, nullptr));
  Feed(m, well, 20, &now);
  ASSERT_TRUE(m.ProposeShares(&shares, nullptr));
  EXPECT_EQ(shares, (std::vector<double>{1, 0.75, 1, 1}));
  m.PlanChanged(shares);
  Feed(m, well, 40, &now);
  ASSERT_TRUE(m.ProposeShares(&shares, nullptr));
  EXPECT_EQ(shares, (std::vector<double>{1, 0.875, 1, 1}));
  m.PlanChanged(shares);
  Feed(m, well, 40, &now);
  EXPECT_FALSE(m.ProposeShares(&shares, nullptr));
  now += 60000 * kMs;
  Feed(m, well, 40, &now);
  ASSERT_TRUE(m.ProposeShares(&shares, nullptr));
  EXPECT_EQ(shares, (std::vector<double>{1, 1, 1, 1}));
}

// A device throttled by a duty cycle (a CPU quota) at half speed reads
// slow on a full share but fast once a smaller share leaves it idle part of
// the time. Its share settles instead of swinging between the two.
TEST(SlowDevices, ADutyCycledDeviceSettlesOnASmallerShare) {
  SlowDeviceMonitor m(2, Options());
  int64_t now = 0;
  int changes = 0;
  for (int window = 0; window < 60; ++window) {
    const double share = m.shares()[1];
    // Device 1 does share/(1+share) of the work; measured speed: 0.5 while
    // its share is above 0.5, 0.9 at or below it.
    const double rel = share > 0.5 ? 0.5 : 0.9;
    const double w1 = 2e9 * share / (1 + share), w0 = 2e9 - w1;
    Feed(m, Timing({w0, w1}, {10 * kMs, static_cast<int64_t>(w1 / w0 / rel * 10 * kMs)}), 11, &now);
    std::vector<double> shares;
    if (m.ProposeShares(&shares, nullptr)) {
      m.PlanChanged(shares);
      ++changes;
    }
  }
  EXPECT_LE(changes, 4);
  EXPECT_GE(m.shares()[1], 0.5);
  EXPECT_LE(m.shares()[1], 0.625);
}

TEST(SlowDevices, SmallDifferencesAndShortBurstsChangeNothing) {
  SlowDeviceMonitor m(2, Options());
  int64_t now = 0;
  // 0.8x: measured, not slow.
  Feed(m, Timing({1e9, 1e9}, {10 * kMs, 12500000}), 20, &now);
  EXPECT_FALSE(m.speeds()[1].slow);
  std::vector<double> shares;
  EXPECT_FALSE(m.ProposeShares(&shares, nullptr));
  // A single very slow step in a window of normal ones: the window's sums
  // keep the device above the threshold.
  SlowDeviceMonitor m2(2, Options());
  now = 0;
  Feed(m2, Timing({1e9, 1e9}, {10 * kMs, 10 * kMs}), 5, &now);
  Feed(m2, Timing({1e9, 1e9}, {10 * kMs, 25 * kMs}), 1, &now);
  Feed(m2, Timing({1e9, 1e9}, {10 * kMs, 10 * kMs}), 5, &now);
  ASSERT_TRUE(m2.speeds()[1].measured);
  EXPECT_FALSE(m2.speeds()[1].slow) << m2.speeds()[1].relative_speed;
  EXPECT_FALSE(m2.ProposeShares(&shares, nullptr));
}

TEST(SlowDevices, SharesAreRoundedAndBounded) {
  SlowDeviceMonitor m(3, Options());
  int64_t now = 0;
  // 0.1x: share at its floor.
  Feed(m, Timing({1e9, 1e9, 1e9}, {10 * kMs, 10 * kMs, 100 * kMs}), 20, &now);
  std::vector<double> shares;
  ASSERT_TRUE(m.ProposeShares(&shares, nullptr));
  EXPECT_EQ(shares, (std::vector<double>{1, 1, 0.25}));
  // A replaced device starts again at an even share.
  m.PlanChanged(shares);
  m.DeviceReplaced(2);
  EXPECT_FALSE(m.uneven());
}

}  // namespace
}  // namespace failsafe
