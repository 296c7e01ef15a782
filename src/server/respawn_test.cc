// Dead devices start again on their own: the policy's backoff and crash-loop
// limit, then a real server whose worker processes are killed with SIGKILL
// mid-stream and come back, losing no request.
#include "server/respawn.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <nlohmann/json.hpp>
#include <thread>

#include "server/test_server.h"

namespace failsafe {
namespace {

using nlohmann::json;

constexpr int64_t kMs = 1000000;

RespawnOptions Policy() {
  RespawnOptions o;
  o.enabled = true;
  o.backoff_ms = 100;
  o.max_backoff_ms = 400;
  o.crash_loop_limit = 3;
  o.crash_loop_window_ms = 10000;
  return o;
}

TEST(RespawnPolicy, BacksOffDoublingThenGivesUpOnACrashLoop) {
  RespawnPolicy p(Policy(), 2);
  p.Observe({0, 1}, 0);
  EXPECT_EQ(p.NextDueNs(), -1);
  p.Observe({0}, 1000 * kMs);  // device 1 died
  EXPECT_TRUE(p.record(1).pending);
  EXPECT_TRUE(p.Due(1099 * kMs).empty());
  EXPECT_EQ(p.Due(1100 * kMs), std::vector<int>{1});
  EXPECT_EQ(p.NextDueNs(), 1100 * kMs);
  // A failed start doubles the wait; so does the next death.
  p.StartFailed(1, "no", true, 1100 * kMs);
  EXPECT_EQ(p.record(1).next_ns, 1300 * kMs);
  p.Started(1, 1300 * kMs);
  p.Observe({0, 1}, 1300 * kMs);
  EXPECT_FALSE(p.record(1).pending);
  p.Observe({0}, 2000 * kMs);
  EXPECT_EQ(p.record(1).next_ns, 2400 * kMs);  // 400: the cap
  p.Started(1, 2400 * kMs);
  // The fourth failure within the window: crash-looping, nothing due.
  p.Observe({0}, 3000 * kMs);
  EXPECT_TRUE(p.record(1).crash_looping);
  EXPECT_FALSE(p.record(1).pending);
  EXPECT_TRUE(p.Due(60000 * kMs).empty());
  EXPECT_EQ(p.record(1).deaths, 3);
  EXPECT_EQ(p.record(1).failed_starts, 1);
  EXPECT_EQ(p.record(1).respawns, 2);
  // Restored by hand: a clean slate.
  p.Reset(1, true, 4000 * kMs);
  EXPECT_FALSE(p.record(1).crash_looping);
  p.Observe({0}, 5000 * kMs);
  EXPECT_EQ(p.record(1).next_ns, 5100 * kMs);
  // Device 0 was never touched.
  EXPECT_EQ(p.record(0).deaths, 0);
}

TEST(RespawnPolicy, ARemoteDeviceWithoutAWorkerDoesNotCountAsFailing) {
  RespawnPolicy p(Policy(), 1);
  p.Observe({}, 0);
  for (int i = 1; i <= 20; ++i) p.StartFailed(0, "no worker joined", false, i * 100 * kMs);
  EXPECT_FALSE(p.record(0).crash_looping);
  EXPECT_EQ(p.record(0).next_ns, 2100 * kMs);
  EXPECT_EQ(p.record(0).failed_starts, 0);
}

TEST(RespawnPolicy, AliveAWholeWindowStartsTheBackoffAfresh) {
  RespawnPolicy p(Policy(), 1);
  p.Observe({0}, 0);
  p.Observe({}, 100 * kMs);
  p.Started(0, 200 * kMs);
  p.Observe({}, 300 * kMs);
  EXPECT_EQ(p.record(0).next_ns, 500 * kMs);  // doubled
  p.Started(0, 500 * kMs);
  p.Observe({0}, 20000 * kMs);  // a window later
  p.Observe({}, 20001 * kMs);
  EXPECT_EQ(p.record(0).next_ns, 20101 * kMs);
}

TestServerOptions RespawningServer(int crash_loop_limit) {
  TestServerOptions o;
  o.devices = 3;
  o.respawn = Policy();
  o.respawn.crash_loop_limit = crash_loop_limit;
  return o;
}

int Pid(const TestServer& s, int device) { return s.Status()["devices"][device]["pid"].get<int>(); }

// Kill -9 a device mid-stream: the stream completes with the fault-free text,
// and the device comes back as a new process on its own, without an
// operator; /metrics and /admin/status say so.
TEST(Respawn, AKilledDeviceComesBackOnItsOwn) {
  TestServer s(RespawningServer(3));
  const json body = {
      {"prompt", "the engine"}, {"max_tokens", 48}, {"ignore_eos", true}, {"temperature", 0}};
  auto want = s.Post("/v1/completions", body);
  ASSERT_EQ(want->status, 200);
  const int victim = Pid(s, 1);
  ASSERT_GT(victim, 0);
  std::thread killer([&] {
    ::usleep(30000);
    ::kill(victim, SIGKILL);
  });
  auto got = s.Post("/v1/completions", body);
  killer.join();
  ASSERT_EQ(got->status, 200);
  EXPECT_EQ(json::parse(got->body)["choices"][0]["text"],
            json::parse(want->body)["choices"][0]["text"]);
  const double ms = WaitFor(
      [&] { return MetricValue(s.Metrics(), "failsafe_device_respawns_total{device=\"1\"}") == 1; },
      20000);
  EXPECT_GE(ms, 0) << s.Metrics();
  EXPECT_EQ(MetricValue(s.Metrics(), "failsafe_devices_alive"), 3);
  const json st = s.Status();
  EXPECT_NE(Pid(s, 1), victim);
  EXPECT_EQ(st["devices"][1]["respawn"]["deaths"], 1);
  EXPECT_EQ(st["devices"][1]["respawn"]["crash_looping"], false);
  // Serving on every device again.
  EXPECT_EQ(st["plan"]["active"].size(), 3u);
  EXPECT_EQ(json::parse(s.Post("/v1/completions", body)->body)["choices"][0]["text"],
            json::parse(want->body)["choices"][0]["text"]);
}

// Killed every time it comes back: crash-looping after the limit, left dead
// (the node serves on the others) until an operator restores it.
TEST(Respawn, ACrashLoopingDeviceIsLeftForTheOperator) {
  TestServer s(RespawningServer(1));
  for (int round = 0; round < 2; ++round) {
    const int pid = Pid(s, 2);
    ASSERT_GT(pid, 0) << round;
    ::kill(pid, SIGKILL);
    if (round == 0) {
      // Back and serving (a kill while it still starts is a failed start,
      // not a second death).
      ASSERT_GE(WaitFor(
                    [&] {
                      const int now = Pid(s, 2);  // one read: -1 while it is dead
                      return now > 0 && now != pid &&
                             MetricValue(s.Metrics(), "failsafe_devices_alive") == 3;
                    },
                    20000),
                0);
    }
  }
  ASSERT_GE(WaitFor(
                [&] {
                  return MetricValue(s.Metrics(), "failsafe_device_crash_looping{device=\"2\"}") ==
                         1;
                },
                20000),
            0);
  ::usleep(500000);
  EXPECT_EQ(Pid(s, 2), -1);
  EXPECT_EQ(s.Status()["devices"][2]["respawn"]["respawns"], 1);
  auto r = s.Post("/v1/completions", {{"prompt", "x"}, {"max_tokens", 4}});
  EXPECT_EQ(r->status, 200) << r->body;
  // By hand.
  auto c = s.Client();
  EXPECT_EQ(c->Post("/admin/devices/2/restore", "", "application/json")->status, 200);
  EXPECT_EQ(MetricValue(s.Metrics(), "failsafe_device_crash_looping{device=\"2\"}"), 0);
  EXPECT_GT(Pid(s, 2), 0);
}

}  // namespace
}  // namespace failsafe
