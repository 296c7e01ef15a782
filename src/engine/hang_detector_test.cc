// Deadlines from measured step times, and telling a hung device from the
// peers waiting for it, on progress written by hand.
#include "engine/hang_detector.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>

#include "common/clock.h"

namespace failsafe {
namespace {

TEST(StepDeadline, ExplicitBootstrapAndDerived) {
  DeadlineOptions fixed;
  fixed.step_timeout_ms = 1234;
  EXPECT_EQ(StepDeadline(fixed).DeadlineMs(100.0), 1234);

  StepDeadline d;  // floor 500 ms, 8x the expected time between two moves
  // Before any step is measured: generous (50x the estimate), never below the floor.
  EXPECT_EQ(d.DeadlineMs(0.001), 500);
  EXPECT_EQ(d.DeadlineMs(0.1), 40000);
  EXPECT_EQ(d.DeadlineMs(0.1, 10), 4000);
  // Steps take 3x their estimate.
  for (int i = 0; i < 40; ++i) d.Observe(0.01, 30000000);
  EXPECT_NEAR(d.ExpectedSeconds(1.0), 3.0, 1e-9);
  EXPECT_EQ(d.DeadlineMs(1.0, 8), 3000);
  EXPECT_EQ(d.DeadlineMs(0.01, 8), 500);
  // One slow step in twenty does not move the deadline (95th percentile)...
  d.Observe(0.01, 1000000000);
  EXPECT_EQ(d.DeadlineMs(1.0, 8), 3000);
  // ...a machine that became slower does.
  for (int i = 0; i < 60; ++i) d.Observe(0.01, 100000000);
  EXPECT_EQ(d.DeadlineMs(1.0, 8), 10000);
}

struct Progress {
  DeviceProgressRegion region = std::move(DeviceProgressRegion::Create(4)).value();
  void Set(int device, uint64_t requests, uint64_t entered, uint64_t left, int64_t last_ns) {
    DeviceProgressSlot* s = region.slot(device);
    s->requests = requests;
    s->entered = entered;
    s->left = left;
    s->last_move_ns = last_ns;
  }
};

constexpr int64_t kMs = 1000000;

// Three devices took the step; two wait in collective 5 for the third, which
// has been still since before the deadline.
TEST(HangWatch, TheDeviceBehindThatDoesNotMoveIsHung) {
  Progress p;
  const int64_t t0 = MonotonicNanos();
  for (int d = 0; d < 3; ++d) p.Set(d, 10, 4, 4, t0);
  int aborts = 0;
  HangWatch w(&p.region, {0, 1, 2}, {}, MonotonicNanos(), 500, 250, [&] { ++aborts; });
  EXPECT_GE(w.next_check_ns(), t0 + 500 * kMs);
  p.Set(0, 11, 5, 4, t0 + 100 * kMs);
  p.Set(1, 11, 5, 4, t0 + 120 * kMs);
  p.Set(2, 11, 4, 4, t0 + 40 * kMs);
  auto dead = w.Check(t0 + 600 * kMs, {0, 1, 2}, {});
  ASSERT_EQ(dead.size(), 1u);
  EXPECT_EQ(dead[0].device, 2);
  EXPECT_EQ(dead[0].failed_ns, t0 + 40 * kMs);  // its last sign of life
  EXPECT_NE(dead[0].reason.find("no progress"), std::string::npos);
  EXPECT_EQ(aborts, 1);
  EXPECT_TRUE(w.aborted());
}

// Devices 2 and 3 are on another host behind a link whose round trip grew
// to 400 ms. The ring's order put the local devices 0 and 1 behind device 3,
// which already entered the next collective: by progress alone they would
// look hung. The devices behind the bad link go instead, the local ones stay.
TEST(HangWatch, ADegradedLinkBlamesTheSideBehindIt) {
  const int64_t t0 = MonotonicNanos();
  // The stall, with devices 2 and 3 heard 50 ms ago over a link of `rtt`.
  auto stalled_ring = [&](Progress* p, int64_t rtt) {
    for (int d = 0; d < 4; ++d) p->Set(d, 10, 4, 4, t0);
    auto w = std::make_unique<HangWatch>(&p->region, std::vector<int>{0, 1, 2, 3},
                                         std::vector<DeviceProgress>{}, MonotonicNanos(), 500, 250,
                                         nullptr);
    p->Set(0, 11, 5, 4, t0 + 40 * kMs);
    p->Set(1, 11, 5, 4, t0 + 45 * kMs);
    p->Set(2, 11, 5, 4, t0 + 50 * kMs);
    p->Set(3, 11, 6, 5, t0 + 90 * kMs);
    for (int d : {2, 3}) {
      p->region.slot(d)->heard_ns = t0 + 550 * kMs;
      p->region.slot(d)->link_rtt_ns = rtt;
    }
    return w;
  };
  Progress p;
  auto w = stalled_ring(&p, 400 * kMs);
  auto dead = w->Check(t0 + 600 * kMs, {0, 1, 2, 3}, {});
  ASSERT_EQ(dead.size(), 2u);
  EXPECT_EQ(dead[0].device, 2);
  EXPECT_EQ(dead[1].device, 3);
  EXPECT_NE(dead[0].reason.find("link is degraded"), std::string::npos);
  EXPECT_TRUE(w->aborted());
  // The same stall over a healthy link (a round trip of 1 ms): over a
  // network, devices still inside a collective a peer has left may only be
  // waiting for its frames, so nobody is dead for being behind; the group is
  // aborted, and those that do not answer within the grace are.
  Progress q;
  auto v = stalled_ring(&q, 1 * kMs);
  EXPECT_TRUE(v->Check(t0 + 600 * kMs, {0, 1, 2, 3}, {}).empty());
  EXPECT_TRUE(v->aborted());
  q.Set(0, 11, 5, 5, t0 + 620 * kMs);  // left its collective: aborted
  q.Set(1, 11, 5, 5, t0 + 625 * kMs);
  dead = v->Check(t0 + 900 * kMs, {2, 3}, {0, 1});
  ASSERT_EQ(dead.size(), 2u);
  EXPECT_EQ(dead[0].device, 2);
  EXPECT_EQ(dead[1].device, 3);
  // A link silent for a heartbeat or two is not yet to blame; the step goes
  // on with its witness left out.
  Progress r;
  for (int d = 0; d < 2; ++d) r.Set(d, 10, 4, 4, t0);
  HangWatch u(&r.region, {0, 1}, {}, MonotonicNanos(), 500, 250, nullptr);
  r.Set(0, 11, 5, 4, t0 + 40 * kMs);
  r.Set(1, 11, 5, 5, t0 + 580 * kMs);
  r.region.slot(1)->heard_ns = t0 + 300 * kMs;
  EXPECT_TRUE(u.Check(t0 + 600 * kMs, {0, 1}, {}).empty());
  // Every device of the step behind bad links: nobody healthy is left to
  // serve, so the link alone kills nobody (the link timeout decides).
  Progress all;
  for (int d = 0; d < 2; ++d) {
    all.Set(d, 11, 5, 4, t0);
    all.region.slot(d)->heard_ns = t0 + 550 * kMs;
    all.region.slot(d)->link_rtt_ns = 400 * kMs;
  }
  HangWatch x(&all.region, {0, 1}, {}, MonotonicNanos(), 500, 250, nullptr);
  for (const Verdict& v2 : x.Check(t0 + 600 * kMs, {0, 1}, {}))
    EXPECT_EQ(v2.reason.find("link is degraded"), std::string::npos);
}

// A rendezvous or a plan change waits up to the collective timeout (here
// 30 s); a link that degrades meanwhile is blamed once the group has stood
// still for 1 s, not after the whole timeout: the watch looks by then, a
// round trip of 200 ms is bad whatever the deadline, and only the devices
// behind it go.
TEST(HangWatch, ADegradedLinkIsBlamedWithinSecondsOfALongDeadline) {
  Progress p;
  const int64_t t0 = MonotonicNanos();
  for (int d = 0; d < 4; ++d) p.Set(d, 3, 0, 0, t0);
  for (int d : {2, 3}) p.region.slot(d)->heard_ns = t0;  // heard over links
  HangWatch w(&p.region, {0, 1, 2, 3}, {}, t0, 30000, 1000, nullptr);
  EXPECT_LE(w.next_check_ns(), t0 + 1000 * kMs);
  for (int d : {2, 3}) {
    p.region.slot(d)->heard_ns = t0 + 900 * kMs;
    p.region.slot(d)->link_rtt_ns = 200 * kMs;
  }
  EXPECT_TRUE(w.Check(t0 + 500 * kMs, {0, 1, 2, 3}, {}).empty());  // still for only 0.5 s
  EXPECT_FALSE(w.aborted());
  EXPECT_LE(w.next_check_ns(), t0 + 750 * kMs);
  auto dead = w.Check(t0 + 1000 * kMs, {0, 1, 2, 3}, {});
  ASSERT_EQ(dead.size(), 2u);
  EXPECT_EQ(dead[0].device, 2);
  EXPECT_EQ(dead[1].device, 3);
  EXPECT_TRUE(dead[0].link);
  EXPECT_TRUE(w.aborted());
  // Over good links (a round trip of 1 ms) the same wait is no hang.
  Progress q;
  for (int d = 0; d < 4; ++d) q.Set(d, 3, 0, 0, t0);
  for (int d : {2, 3}) q.region.slot(d)->heard_ns = t0;
  HangWatch v(&q.region, {0, 1, 2, 3}, {}, t0, 30000, 1000, nullptr);
  for (int d : {2, 3}) {
    q.region.slot(d)->heard_ns = t0 + 900 * kMs;
    q.region.slot(d)->link_rtt_ns = 1 * kMs;
  }
  EXPECT_TRUE(v.Check(t0 + 1000 * kMs, {0, 1, 2, 3}, {}).empty());
  EXPECT_FALSE(v.aborted());
  // A step's deadline of 1 s: the bad link is blamed after half of it.
  Progress r;
  for (int d = 0; d < 4; ++d) r.Set(d, 3, 0, 0, t0);
  for (int d : {2, 3}) r.region.slot(d)->heard_ns = t0;
  HangWatch u(&r.region, {0, 1, 2, 3}, {}, t0, 1000, 250, nullptr);
  EXPECT_LE(u.next_check_ns(), t0 + 500 * kMs);
  for (int d : {2, 3}) {
    r.region.slot(d)->heard_ns = t0 + 480 * kMs;
    r.region.slot(d)->link_rtt_ns = 400 * kMs;
  }
  EXPECT_EQ(u.Check(t0 + 500 * kMs, {0, 1, 2, 3}, {}).size(), 2u);
  // Devices 2 and 3 on one host, only 2's round trips measured bad yet:
  // they share the link, and both go.
  Progress h;
  for (int d = 0; d < 4; ++d) h.Set(d, 3, 0, 0, t0);
  for (int d : {2, 3}) {
    h.region.slot(d)->heard_ns = t0;
    h.region.slot(d)->host = 77;
  }
  HangWatch x(&h.region, {0, 1, 2, 3}, {}, t0, 1000, 250, nullptr);
  for (int d : {2, 3}) h.region.slot(d)->heard_ns = t0 + 480 * kMs;
  h.region.slot(2)->link_rtt_ns = 400 * kMs;
  h.region.slot(3)->link_rtt_ns = 20 * kMs;
  const auto both = x.Check(t0 + 500 * kMs, {0, 1, 2, 3}, {});
  ASSERT_EQ(both.size(), 2u);
  std::vector<int> gone = {both[0].device, both[1].device};
  std::sort(gone.begin(), gone.end());
  EXPECT_EQ(gone, (std::vector<int>{2, 3}));
  EXPECT_TRUE(both[0].link && both[1].link);
}

// Four devices that took a step at collective 10; devices 2 and 3 heard
// over links since t0.
struct LinkedGroup {
  Progress p;
  explicit LinkedGroup(int64_t t0) {
    for (int d = 0; d < 4; ++d) p.Set(d, 3, 10, 10, t0);
    for (int d : {2, 3}) p.region.slot(d)->heard_ns = t0;
  }
  // Every device entered collective `entered` (and left `left`) at `at`;
  // 2 and 3 were heard then, over links of round trip `rtt`.
  void Move(uint64_t entered, uint64_t left, int64_t at, int64_t rtt) {
    for (int d = 0; d < 4; ++d) p.Set(d, 3, entered, left, at);
    for (int d : {2, 3}) {
      p.region.slot(d)->heard_ns = at;
      p.region.slot(d)->link_rtt_ns = rtt;
    }
  }
  // A watch over the step sent at t0 (deadline 1 s), collectives expected
  // every `expected_move_ns`.
  HangWatch Watch(int64_t t0, int64_t expected_move_ns) {
    HangWatch w(&p.region, {0, 1, 2, 3}, {}, t0, 1000, 250, nullptr);
    w.set_expected_move_ns(expected_move_ns);
    return w;
  }
};

// A link that bad slows every collective over it to a round trip: the group
// keeps moving (nobody still for half the deadline) but crawls, and the
// devices behind the link go once a quarter deadline passed at that pace
// (collectives expected every 10 ms). The same pace over good links is
// slowness, and a bad link under a group that moves fast is not blamed
// for it.
TEST(HangWatch, AStepThatCrawlsOverADegradedLinkBlamesIt) {
  const int64_t t0 = MonotonicNanos();
  const std::vector<int> all = {0, 1, 2, 3};
  for (const int64_t rtt : {400 * kMs, 1 * kMs}) {
    LinkedGroup g(t0);
    HangWatch w = g.Watch(t0, 10 * kMs);
    g.Move(10, 10, t0, rtt);
    EXPECT_TRUE(w.Check(t0 + 200 * kMs, all, {}).empty());  // too soon to tell
    g.Move(11, 10, t0 + 400 * kMs, rtt);                    // one collective every 400 ms
    const auto dead = w.Check(t0 + 450 * kMs, all, {});
    if (rtt > 100 * kMs) {
      ASSERT_EQ(dead.size(), 2u);
      EXPECT_EQ(dead[0].device, 2);
      EXPECT_EQ(dead[1].device, 3);
      EXPECT_TRUE(dead[0].link);
      EXPECT_NE(dead[0].reason.find("crawls"), std::string::npos) << dead[0].reason;
      EXPECT_TRUE(w.aborted());
    } else {
      EXPECT_TRUE(dead.empty());
      EXPECT_FALSE(w.aborted());
    }
  }
  {
    LinkedGroup g(t0);
    HangWatch w = g.Watch(t0, 10 * kMs);
    g.Move(40, 39, t0 + 590 * kMs, 400 * kMs);  // 30 collectives
    EXPECT_TRUE(w.Check(t0 + 600 * kMs, all, {}).empty());
    EXPECT_FALSE(w.aborted());
  }
  {
    // A step that ran fast and then crawls: the pace is the last quarter
    // deadline's, not the step's (checks every 125 ms, as the watch asks).
    LinkedGroup g(t0);
    HangWatch w = g.Watch(t0, 10 * kMs);
    g.Move(40, 40, t0 + 300 * kMs, 400 * kMs);
    EXPECT_TRUE(w.Check(t0 + 300 * kMs, all, {}).empty());
    EXPECT_TRUE(w.Check(t0 + 425 * kMs, all, {}).empty());
    // No collective in the quarter deadline since the link went bad.
    EXPECT_EQ(w.Check(t0 + 550 * kMs, all, {}).size(), 2u);
  }
  // A collective every 170 ms over a 200 ms round trip: a crawl for a step
  // whose collectives are expected to take 10 ms (twice that is less than
  // the bad round trip), not for one whose collectives are expected to
  // take 100 ms, nor for a request other than a step (no expected pace).
  for (const int64_t expected : {10 * kMs, int64_t{0}, 100 * kMs}) {
    LinkedGroup g(t0);
    HangWatch w = g.Watch(t0, expected);
    g.Move(13, 12, t0 + 510 * kMs, 200 * kMs);
    EXPECT_EQ(w.Check(t0 + 520 * kMs, all, {}).size(), expected == 10 * kMs ? 2u : 0u) << expected;
  }
  {
    // The healthy devices answered, the two behind the bad link have not
    // yet (their replies cross it): no crawl, those are left to the stall.
    LinkedGroup g(t0);
    HangWatch w = g.Watch(t0, 10 * kMs);
    g.Move(30, 30, t0 + 250 * kMs, 200 * kMs);
    EXPECT_TRUE(w.Check(t0 + 300 * kMs, all, {}).empty());
    EXPECT_TRUE(w.Check(t0 + 600 * kMs, {2, 3}, {0, 1}).empty());
    EXPECT_FALSE(w.aborted());
  }
}

// A device that is behind but still moves is slow, not hung: nobody is
// declared dead and the group is not aborted; the watch looks again.
TEST(HangWatch, SlowButMovingIsNotHung) {
  Progress p;
  const int64_t t0 = MonotonicNanos();
  for (int d = 0; d < 3; ++d) p.Set(d, 1, 0, 0, t0);
  int aborts = 0;
  HangWatch w(&p.region, {0, 1, 2}, {}, MonotonicNanos(), 500, 250, [&] { ++aborts; });
  p.Set(0, 2, 20, 19, t0 + 100 * kMs);
  p.Set(1, 2, 20, 19, t0 + 110 * kMs);
  p.Set(2, 2, 12, 12, t0 + 580 * kMs);  // behind, moved 20 ms ago
  EXPECT_TRUE(w.Check(t0 + 600 * kMs, {0, 1, 2}, {}).empty());
  EXPECT_EQ(aborts, 0);
  EXPECT_GT(w.next_check_ns(), t0 + 600 * kMs);
  EXPECT_LT(w.next_check_ns(), t0 + 1100 * kMs);
}

// Devices that replied are done: a pending one that never took the request
// (stopped before reading it) is hung.
TEST(HangWatch, NotStartedWhileOthersAreDone) {
  Progress p;
  const int64_t t0 = MonotonicNanos();
  for (int d = 0; d < 3; ++d) p.Set(d, 7, 30, 30, t0 - 5000 * kMs);
  HangWatch w(&p.region, {0, 1, 2}, {}, MonotonicNanos(), 500, 250, nullptr);
  auto dead = w.Check(t0 + 501 * kMs, {1}, {0, 2});
  ASSERT_EQ(dead.size(), 1u);
  EXPECT_EQ(dead[0].device, 1);
}

// Everyone stuck at the same point: nobody is ahead, so the group is aborted
// and those that do not move within the grace period are dead.
TEST(HangWatch, NobodyAheadAbortsThenWaitsTheGrace) {
  Progress p;
  const int64_t t0 = MonotonicNanos();
  for (int d = 0; d < 3; ++d) p.Set(d, 3, 9, 8, t0);
  int aborts = 0;
  HangWatch w(&p.region, {0, 1, 2}, {}, MonotonicNanos(), 500, 250, [&] { ++aborts; });
  for (int d = 0; d < 3; ++d) p.Set(d, 4, 10, 9, t0 + 50 * kMs);
  EXPECT_TRUE(w.Check(t0 + 700 * kMs, {0, 1, 2}, {}).empty());
  EXPECT_EQ(aborts, 1);
  // After the abort, 0 and 1 left their collective; 2 did not.
  const int64_t after = t0 + 710 * kMs;
  p.Set(0, 4, 10, 10, after);
  p.Set(1, 4, 10, 10, after);
  EXPECT_TRUE(w.Check(after + 100 * kMs, {2}, {0, 1}).empty());  // within the grace
  auto dead = w.Check(after + 300 * kMs, {2}, {0, 1});
  ASSERT_EQ(dead.size(), 1u);
  EXPECT_EQ(dead[0].device, 2);
  EXPECT_NE(dead[0].reason.find("aborted"), std::string::npos);
}

// Everyone stuck at the same point and nobody moves after the abort either:
// the whole group is paused, and nobody is declared dead for it.
TEST(HangWatch, AWholeGroupStillAfterTheAbortIsPausedNotDead) {
  Progress p;
  const int64_t t0 = MonotonicNanos();
  for (int d = 0; d < 3; ++d) p.Set(d, 3, 9, 8, t0);
  int aborts = 0;
  HangWatch w(&p.region, {0, 1, 2}, {}, MonotonicNanos(), 500, 250, [&] { ++aborts; });
  EXPECT_TRUE(w.Check(t0 + 700 * kMs, {0, 1, 2}, {}).empty());
  EXPECT_EQ(aborts, 1);
  for (int64_t ms : {800, 1200, 5000, 60000}) {
    EXPECT_TRUE(w.Check(t0 + ms * kMs, {0, 1, 2}, {}).empty()) << ms;
  }
  EXPECT_EQ(aborts, 1);
  // Once it runs again, the group answers the abort.
  for (int d = 0; d < 3; ++d) p.Set(d, 4, 10, 9, t0 + 61000 * kMs);
  EXPECT_TRUE(w.Check(t0 + 61100 * kMs, {0, 1, 2}, {}).empty());
}

// A device that answered with an error of its own aborts the group, so that
// its peers do not wait for it in a collective.
TEST(HangWatch, AFailedReplyAbortsTheGroup) {
  Progress p;
  int aborts = 0;
  HangWatch w(&p.region, {0, 1}, {}, MonotonicNanos(), 500, 250, [&] { ++aborts; });
  w.OnFailedReply(1);
  w.OnFailedReply(0);
  EXPECT_EQ(aborts, 1);
}

// Every device of a step stopped at once (SIGSTOP sent to each in turn),
// two of them caught a collective behind the others: paused, not hung, and
// once they run again each gets a whole deadline from then. Only some
// devices stopped, their peers waiting: the hang it looks like.
TEST(HangWatch, EveryDeviceStoppedIsPausedNotHung) {
  const int64_t t0 = MonotonicNanos();
  const std::vector<int> all = {0, 1, 2, 3};
  for (const bool every : {true, false}) {
    Progress g;
    for (int d = 0; d < 4; ++d) g.Set(d, 3, 4, 4, t0);
    HangWatch w(&g.region, all, {}, t0, 1000, 250, nullptr);
    // 1 and 2 left collective 5 and wait in 6; 0 and 3 stopped inside 5.
    for (int d : {0, 3}) g.Set(d, 3, 5, 4, t0 + 10 * kMs);
    for (int d : {1, 2}) g.Set(d, 3, 6, 5, t0 + 20 * kMs);
    bool paused = true;
    w.set_stopped([&](int d) { return paused && (every || d == 0 || d == 3); });
    auto dead = w.Check(t0 + 1500 * kMs, all, {});
    if (!every) {
      ASSERT_EQ(dead.size(), 2u);
      EXPECT_EQ(dead[0].device, 0);
      EXPECT_EQ(dead[1].device, 3);
      continue;
    }
    EXPECT_TRUE(dead.empty());
    EXPECT_FALSE(w.aborted());
    EXPECT_LE(w.next_check_ns(), t0 + 1600 * kMs);
    EXPECT_TRUE(w.Check(t0 + 5000 * kMs, all, {}).empty());  // however long
    paused = false;                                          // SIGCONT
    EXPECT_TRUE(w.Check(t0 + 5100 * kMs, all, {}).empty());  // the grace to move again
    EXPECT_FALSE(w.aborted());
    // Still stuck past that grace: 0 and 3 are hung, still since t0.
    dead = w.Check(t0 + 5300 * kMs, all, {});
    ASSERT_EQ(dead.size(), 2u);
    EXPECT_EQ(dead[0].device, 0);
    EXPECT_EQ(dead[1].device, 3);
    EXPECT_NE(dead[0].reason.find("5290 ms"), std::string::npos) << dead[0].reason;
  }
}

// Hosts of a loss test: the coordinator's (its devices local, host 0; the
// address they give their peers, kCoordinatorHost, their alias), and two
// remote hosts.
constexpr uint64_t kCoordinatorHost = 99, kHostA = 11, kHostB = 22;

DeviceProgress OnHost(uint64_t host, std::vector<LossPeer> loss = {}) {
  DeviceProgress p;
  p.host = host;
  p.alias = host == 0 ? kCoordinatorHost : host;
  for (size_t i = 0; i < loss.size(); ++i) p.loss[i] = loss[i];
  return p;
}

// Frames lost on one host's link show on every pair of hosts with it at
// one end: that host is to blame, never the coordinator's, and nobody when
// the pairs cannot tell the sides apart.
TEST(LossyHost, TheHostCommonToEveryLossyPair) {
  const int64_t now = 10000 * kMs, since = now - 1000 * kMs;
  const LossPeer to_b{kHostB, now - 100 * kMs}, to_a{kHostA, now - 100 * kMs};
  const LossPeer to_coordinator{kCoordinatorHost, now - 100 * kMs};
  // B's link loses frames: the local device, A's and B's own see it.
  EXPECT_EQ(LossyHost({OnHost(0, {to_b}), OnHost(kHostA, {to_b}), OnHost(kHostB, {to_a}),
                       OnHost(kHostB, {to_coordinator, to_a})},
                      since),
            kHostB);
  // Two pairs (seen from one side each) suffice: from the coordinator's
  // end of B's link and from A.
  EXPECT_EQ(LossyHost({OnHost(0), OnHost(kHostA, {to_b}),
                       OnHost(kHostB, {{kCoordinatorHostId, now - 50 * kMs}})},
                      since),
            kHostB);
  // One pair over three hosts names nobody: the coordinator's host may be
  // the one losing them, the other pairs not yet seen.
  EXPECT_EQ(LossyHost({OnHost(0, {to_b}), OnHost(kHostA), OnHost(kHostB), OnHost(kHostB)}, since),
            0u);
  // Over two hosts it does: the side that is not the coordinator's.
  EXPECT_EQ(LossyHost({OnHost(0, {to_b}), OnHost(kHostB)}, since), kHostB);
  EXPECT_EQ(LossyHost({OnHost(0), OnHost(kHostB, {to_coordinator})}, since), kHostB);
  // Only between A and B: either side may lose them.
  EXPECT_EQ(LossyHost({OnHost(0), OnHost(kHostA, {to_b}), OnHost(kHostB, {to_a})}, since), 0u);
  // The coordinator's host loses them: never blamed, and nobody else is.
  EXPECT_EQ(LossyHost({OnHost(0, {to_a, to_b}), OnHost(kHostA, {to_coordinator}),
                       OnHost(kHostB, {to_coordinator})},
                      since),
            0u);
  // Two bad links (A's and B's): the pairs share no single host.
  EXPECT_EQ(
      LossyHost({OnHost(0, {to_a, to_b}), OnHost(kHostA, {to_b}), OnHost(kHostB, {to_a})}, since),
      0u);
  // Loss before `since`, and loss between a host's own devices, count for
  // nothing.
  const LossPeer old_b{kHostB, since - 1};
  EXPECT_EQ(LossyHost({OnHost(0, {old_b}), OnHost(kHostA, {old_b}), OnHost(kHostB, {to_b})}, since),
            0u);
  // A peer address that names no device's host (not the one B joined
  // from, not the one it gives its peers) is nobody's: its pairs do not
  // make A's or the coordinator's side the one to blame.
  const LossPeer to_unknown{555, now - 100 * kMs};
  EXPECT_EQ(LossyHost({OnHost(0, {to_unknown}), OnHost(kHostA, {to_unknown, to_b}), OnHost(kHostB)},
                      since),
            0u);
  EXPECT_EQ(LossyHost({OnHost(0), OnHost(kHostA, {to_unknown})}, since), 0u);
  // B gives its peers another address (its alias) than the one it joined
  // from: loss toward that address is loss toward B.
  DeviceProgress b = OnHost(kHostB);
  b.alias = 23;
  const LossPeer to_b_alias{23, now - 100 * kMs};
  EXPECT_EQ(LossyHost({OnHost(0, {to_b_alias}), OnHost(kHostA, {to_b_alias}), b}, since), kHostB);
  // A remote worker on the coordinator's host (joined from the address the
  // local devices give their peers) is of the coordinator's host: loss
  // toward that host blames nobody.
  EXPECT_EQ(LossyHost({OnHost(0), OnHost(kHostA, {to_coordinator}),
                       OnHost(kHostB, {to_coordinator}), OnHost(kCoordinatorHost, {to_a, to_b})},
                      since),
            0u);
}

// A step stalls while B's link loses the collectives' frames but spares
// B's heartbeats (its round trip to the coordinator measures 10 ms): the
// devices behind B go once it stalls for half the deadline, and only they.
TEST(HangWatch, AStallOverALinkThatLosesFramesBlamesItsHost) {
  const int64_t t0 = MonotonicNanos();
  const std::vector<int> all = {0, 1, 2, 3};
  // Device 0 local, 1 on host A, 2 and 3 on host B; every device still at
  // collective 10 since t0; the remote ones heard at t0 + 480 ms.
  auto group = [&](Progress& g) {
    for (int d = 0; d < 4; ++d) g.Set(d, 3, 10, 9, t0);
    for (int d : {1, 2, 3}) {
      g.region.slot(d)->heard_ns = t0 + 480 * kMs;
      g.region.slot(d)->link_rtt_ns = 10 * kMs;
    }
    g.region.slot(1)->host = kHostA;
    for (int d : {2, 3}) g.region.slot(d)->host = kHostB;
  };
  {
    Progress g;
    group(g);
    HangWatch w(&g.region, all, {}, t0, 1000, 250, nullptr);
    DeviceProgressRegion::NoteLoss(g.region.slot(0), kHostB, t0 + 300 * kMs);
    DeviceProgressRegion::NoteLoss(g.region.slot(1), kHostB, t0 + 350 * kMs);
    EXPECT_TRUE(w.Check(t0 + 400 * kMs, all, {}).empty());  // not stalled long enough yet
    const auto dead = w.Check(t0 + 500 * kMs, all, {});
    ASSERT_EQ(dead.size(), 2u);
    EXPECT_EQ(dead[0].device, 2);
    EXPECT_EQ(dead[1].device, 3);
    EXPECT_TRUE(dead[0].link && dead[1].link);
    EXPECT_NE(dead[0].reason.find("lost"), std::string::npos) << dead[0].reason;
    EXPECT_TRUE(w.aborted());
  }
  {
    // The same stall with loss seen only between A and B: which side loses
    // cannot be told, and nobody is blamed for the link; the stall is left
    // to the deadline.
    Progress g;
    group(g);
    HangWatch w(&g.region, all, {}, t0, 1000, 250, nullptr);
    DeviceProgressRegion::NoteLoss(g.region.slot(1), kHostB, t0 + 300 * kMs);
    DeviceProgressRegion::NoteLoss(g.region.slot(2), kHostA, t0 + 300 * kMs);
    EXPECT_TRUE(w.Check(t0 + 500 * kMs, all, {}).empty());
    EXPECT_FALSE(w.aborted());
  }
  {
    // A local device hangs at t0 + 100 ms; B's link lost frames 200 ms
    // before (congestion on a busy link, say): that says nothing of the
    // hang, and no link is blamed for it.
    Progress g;
    group(g);
    for (int d : {1, 2, 3}) g.Set(d, 3, 11, 10, t0 + 100 * kMs);
    for (int d : {1, 2, 3}) g.region.slot(d)->heard_ns = t0 + 580 * kMs;
    HangWatch w(&g.region, all, {}, t0, 1000, 250, nullptr);
    DeviceProgressRegion::NoteLoss(g.region.slot(0), kHostB, t0 - 200 * kMs);
    DeviceProgressRegion::NoteLoss(g.region.slot(1), kHostB, t0 - 150 * kMs);
    for (const Verdict& v : w.Check(t0 + 600 * kMs, all, {})) EXPECT_FALSE(v.link) << v.reason;
  }
  {
    // Loss toward B while the step moves: slowness, not a fault.
    Progress g;
    group(g);
    HangWatch w(&g.region, all, {}, t0, 1000, 250, nullptr);
    DeviceProgressRegion::NoteLoss(g.region.slot(0), kHostB, t0 + 300 * kMs);
    for (int d = 0; d < 4; ++d) g.Set(d, 3, 14, 13, t0 + 450 * kMs);
    EXPECT_TRUE(w.Check(t0 + 500 * kMs, all, {}).empty());
    EXPECT_FALSE(w.aborted());
  }
}

// A slot keeps the latest loss per peer host, the oldest entry making room
// for a new host, and a reset forgets them.
TEST(DeviceProgress, NoteLossKeepsTheLatestPerPeerHost) {
  Progress g;
  DeviceProgressSlot* s = g.region.slot(1);
  DeviceProgressRegion::NoteLoss(s, kHostA, 100);
  DeviceProgressRegion::NoteLoss(s, kHostA, 300);
  DeviceProgressRegion::NoteLoss(s, kHostA, 200);  // older: ignored
  for (uint64_t h = 1000; h < 1000 + kLossPeers - 1; ++h) DeviceProgressRegion::NoteLoss(s, h, 400);
  DeviceProgress p = g.region.Read(1);
  int seen = 0;
  for (const LossPeer& l : p.loss) {
    if (l.host == kHostA) {
      EXPECT_EQ(l.last_ns, 300);
    }
    seen += l.host != 0;
  }
  EXPECT_EQ(seen, kLossPeers);
  DeviceProgressRegion::NoteLoss(s, kHostB, 500);  // replaces A's, the oldest
  p = g.region.Read(1);
  bool a = false, b = false;
  for (const LossPeer& l : p.loss) {
    a |= l.host == kHostA;
    b |= l.host == kHostB && l.last_ns == 500;
  }
  EXPECT_FALSE(a);
  EXPECT_TRUE(b);
  g.region.Reset(1);
  p = g.region.Read(1);
  for (const LossPeer& l : p.loss) EXPECT_EQ(l.host, 0u);
  EXPECT_EQ(HostId("10.0.0.9"), HostId("::ffff:10.0.0.9"));
  EXPECT_NE(HostId("10.0.0.9"), HostId("10.0.0.19"));
}

}  // namespace
}  // namespace failsafe
