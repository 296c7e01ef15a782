#include "engine/hang_detector.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <optional>
#include <string>

#include "common/clock.h"
#include "common/log.h"

namespace failsafe {

namespace {

// The percentile of recent ratios a deadline covers.
constexpr double kQuantile = 0.95;
// The ratio assumed before enough steps are measured: the cost model assumes
// a fast device, and a CPU device shares its cores with others.
constexpr double kBootstrapRatio = 50;
// Estimates below this are taken as this (a step always costs something).
constexpr double kMinEstimateS = 1e-4;
// A link's round trip is bad only above this, whatever the deadline.
constexpr int64_t kMinBadRttNs = 50 * 1000000LL;
// A link silent this long (three heartbeats) is to blame for a stalled step.
constexpr int64_t kMinSilentNs = 600 * 1000000LL;
// A round trip this long is bad whatever the deadline: no worker is taken
// over such a link (WorkerGroup::CheckLink), and none is kept over it once it
// stalls the group this long, however long the deadline (a rendezvous or a
// plan change waits up to the collective timeout, tens of seconds).
constexpr int64_t kMaxBadRttNs = 150 * 1000000LL;
constexpr int64_t kLinkStallNs = 1000 * 1000000LL;
// Loss that a device saw on its collective connections counts this long.
constexpr int64_t kLossWindowNs = 1000 * 1000000LL;

}  // namespace

uint64_t LossyHost(const std::vector<DeviceProgress>& group, int64_t since_ns) {
  std::vector<uint64_t> coordinator = {0, kCoordinatorHostId};
  for (const DeviceProgress& p : group) {
    if (p.host == 0 && p.alias != 0) coordinator.push_back(p.alias);
  }
  auto of_coordinator = [&](uint64_t h) {
    return std::find(coordinator.begin(), coordinator.end(), h) != coordinator.end();
  };
  // The host `id` names (0: the coordinator's), or nullopt if none.
  auto host = [&](uint64_t id) -> std::optional<uint64_t> {
    if (of_coordinator(id)) return 0;
    for (const DeviceProgress& p : group) {
      if (p.host != 0 && (p.host == id || p.alias == id))
        return of_coordinator(p.host) ? 0 : p.host;
    }
    return std::nullopt;
  };
  std::vector<uint64_t> hosts;
  std::vector<std::pair<uint64_t, uint64_t>> pairs;  // (lower, higher)
  for (const DeviceProgress& p : group) {
    const uint64_t a = host(p.host).value_or(0);
    if (std::find(hosts.begin(), hosts.end(), a) == hosts.end()) hosts.push_back(a);
    for (const LossPeer& l : p.loss) {
      if (l.host == 0 || l.last_ns < since_ns) continue;
      const std::optional<uint64_t> b = host(l.host);
      if (!b || *b == a) continue;
      const std::pair<uint64_t, uint64_t> pair = std::minmax(a, *b);
      if (std::find(pairs.begin(), pairs.end(), pair) == pairs.end()) pairs.push_back(pair);
    }
  }
  if (pairs.empty()) return 0;
  if (pairs.size() == 1) {
    // (The coordinator's host is one of the group's, devices or not.)
    const size_t n = hosts.size() + (std::find(hosts.begin(), hosts.end(), 0) == hosts.end());
    return n <= 2 && pairs[0].first == 0 ? pairs[0].second : 0;
  }
  for (uint64_t h : {pairs[0].first, pairs[0].second}) {
    if (h == 0) continue;
    bool common = true;
    for (const auto& [a, b] : pairs) common &= a == h || b == h;
    if (common) return h;
  }
  return 0;
}

int64_t StepDeadline::floor_ms() const {
  return options_.step_timeout_ms > 0 ? options_.step_timeout_ms : options_.floor_ms;
}

double StepDeadline::Ratio() const {
  if (count_ < kBootstrap) return kBootstrapRatio;
  const int n = samples();
  std::vector<double> r(ratios_, ratios_ + n);
  const size_t k = std::min<size_t>(n - 1, static_cast<size_t>(kQuantile * n));
  std::nth_element(r.begin(), r.begin() + static_cast<std::ptrdiff_t>(k), r.end());
  return r[k];
}

double StepDeadline::ExpectedSeconds(double estimate_s) const {
  return Ratio() * std::max(estimate_s, kMinEstimateS);
}

int64_t StepDeadline::DeadlineMs(double estimate_s, int moves) const {
  if (options_.step_timeout_ms > 0) return options_.step_timeout_ms;
  const double ms = options_.multiplier * ExpectedSeconds(estimate_s) / std::max(1, moves) * 1e3;
  return std::max(options_.floor_ms, static_cast<int64_t>(std::min(ms, 1e12)));
}

void StepDeadline::Observe(double estimate_s, int64_t wall_ns) {
  ratios_[count_ % kWindow] = wall_ns * 1e-9 / std::max(estimate_s, kMinEstimateS);
  ++count_;
}

HangWatch::HangWatch(const DeviceProgressRegion* progress, const std::vector<int>& devices,
                     std::vector<DeviceProgress> before, int64_t sent_ns, int64_t deadline_ms,
                     int64_t grace_ms, std::function<void()> abort_group)
    : progress_(progress),
      devices_(devices),
      base_(std::move(before)),
      start_ns_(sent_ns),
      deadline_ns_(deadline_ms * 1000000),
      grace_ns_(grace_ms * 1000000),
      abort_group_(std::move(abort_group)),
      next_check_ns_(start_ns_ + deadline_ns_) {
  if (base_.size() != devices_.size()) {
    base_.clear();
    for (int d : devices_) base_.push_back(Progress(d));
  }
  // Devices on other hosts (heard over a link): a link may degrade, and its
  // stall is blamed sooner than the deadline (Check), so look sooner.
  for (int d : devices_) networked_ |= Progress(d).heard_ns > 0;
  if (networked_) next_check_ns_ = start_ns_ + LinkBlameNs();
  paces_.push_back({start_ns_, 0});
}

int64_t HangWatch::LinkBlameNs() const { return std::min(deadline_ns_ / 2, kLinkStallNs); }

DeviceProgress HangWatch::Progress(int device) const {
  return progress_ && progress_->valid() ? progress_->Read(device) : DeviceProgress();
}

void HangWatch::Abort(int64_t now_ns) {
  if (aborted_) return;
  aborted_ = true;
  aborted_at_ns_ = now_ns;
  if (abort_group_) abort_group_();
}

void HangWatch::OnFailedReply(int device) { Abort(MonotonicNanos()); }

std::vector<Verdict> HangWatch::Check(int64_t now, const std::vector<int>& pending,
                                      const std::vector<int>& replied) {
  struct Seen {
    int device;
    DeviceProgress p;
    bool started;          // took up the request
    uint64_t collectives;  // entered since the request
    int64_t still_ns;      // since its last move (or the request)
  };
  // Every device of the step stopped at once (SIGSTOP of them all, a
  // debugger, a job-control freeze): the group is paused, not hung, even
  // where the stop caught some devices a collective ahead of the others
  // (the signals do not land at one instant). It runs on when they do, and
  // its devices get the grace to move again before anyone is judged.
  if (stopped_ && !pending.empty() && std::all_of(devices_.begin(), devices_.end(), stopped_)) {
    paused_seen_ns_ = now;
    if (paused_logged_ns_ == 0 || now - paused_logged_ns_ >= 10 * grace_ns_) {
      FS_LOG_WARN(
          "every device of the step is stopped (a signal or a debugger): the group is "
          "paused, not hung; waiting for it");
      paused_logged_ns_ = now;
    }
  }
  const int64_t soon = now + std::max<int64_t>(grace_ns_ / 4, 10000000);
  if (paused_seen_ns_ > 0 && now - paused_seen_ns_ < grace_ns_) {
    next_check_ns_ = soon;
    return {};
  }
  std::vector<Seen> seen;
  for (int d : pending) {
    const size_t i = std::find(devices_.begin(), devices_.end(), d) - devices_.begin();
    const DeviceProgress base = i < base_.size() ? base_[i] : DeviceProgress();
    const DeviceProgress p = Progress(d);
    const int64_t last = std::max(p.last_move_ns, start_ns_);
    // (A counter behind the one read before the request, as a respawned
    // device's: nothing entered since.)
    const uint64_t entered = p.entered >= base.entered ? p.entered - base.entered : 0;
    seen.push_back({d, p, p.requests > base.requests, entered, now - last});
  }
  std::vector<Verdict> dead;
  if (aborted_) {
    // After the abort every survivor leaves its collective at once and
    // answers; one that has not moved since is not coming back.
    bool moving = false;
    for (const Seen& s : seen) {
      if (s.p.last_move_ns > aborted_at_ns_) moving = true;
    }
    const int64_t since_abort = now - std::max(aborted_at_ns_, paused_seen_ns_);
    if (since_abort < grace_ns_ || (moving && since_abort < 4 * grace_ns_)) {
      next_check_ns_ = soon;
      return dead;
    }
    // Nobody moved and nobody answered: the whole group is paused (a host
    // under memory pressure, a VM migrated, a debugger attached), not one
    // device hung while its peers went on. Killing every device would turn
    // the pause into an outage; the group answers the abort once it runs.
    if (!moving && replied.empty() && !seen.empty()) {
      if (paused_logged_ns_ == 0 || now - paused_logged_ns_ >= 10 * grace_ns_) {
        FS_LOG_WARN(
            "every device of the step has been still for {} ms, none ahead of another: "
            "the group is paused, not hung; waiting for it",
            (now - start_ns_) / 1000000);
        paused_logged_ns_ = now;
      }
      next_check_ns_ = soon;
      return dead;
    }
    for (const Seen& s : seen) {
      if (s.p.last_move_ns > aborted_at_ns_) continue;
      dead.push_back({s.device,
                      fmt::format("it did not answer within {} ms of its group being aborted",
                                  since_abort / 1000000),
                      std::max(s.p.last_move_ns, start_ns_)});
    }
    next_check_ns_ = now + grace_ns_;
    return dead;
  }
  // A device on another host behind a degraded link: silent for half the
  // deadline (a second at most), or a round trip of an eighth of it (150 ms
  // at most; a collective of n members takes about n - 1 round trips, so
  // such a link eats much of the deadline by itself). Such a device is no
  // witness: what it last said (entering a collective, say) may never have
  // reached its peers, who wait for it through that link.
  // Or on a host whose link loses frames, as its collective peers see it
  // (LossyHost): the link to the coordinator may be spared, its heartbeats
  // on time, while the collectives' frames are lost.
  const int64_t bad_rtt_ns = std::min(std::max(deadline_ns_ / 8, kMinBadRttNs), kMaxBadRttNs);
  const int64_t link_stall_ns = std::min(deadline_ns_, kLinkStallNs);
  // (Loss counts only once the stall may have begun: loss before it, as
  // congestion's on a busy link, says nothing of a device that hangs after.)
  uint64_t lossy_host = 0;
  if (networked_) {
    int64_t still_ns = 0;
    for (const Seen& s : seen) still_ns = std::max(still_ns, s.still_ns);
    std::vector<DeviceProgress> group;
    for (int d : devices_) group.push_back(Progress(d));
    lossy_host = LossyHost(group, now - std::min(kLossWindowNs, std::max(LinkBlameNs(), still_ns)));
  }
  auto lossy = [&](const Seen& s) { return lossy_host != 0 && s.p.host == lossy_host; };
  auto no_witness = [&](const Seen& s) {
    return s.p.heard_ns > 0 &&
           (now - s.p.heard_ns >= link_stall_ns / 2 || s.p.link_rtt_ns >= bad_rtt_ns || lossy(s));
  };
  // And it is to blame when its step stalls: silent for several heartbeats
  // too, or that round trip, or that loss.
  auto blamed = [&](const Seen& s) {
    return s.p.heard_ns > 0 && (now - s.p.heard_ns >= std::max(link_stall_ns / 2, kMinSilentNs) ||
                                s.p.link_rtt_ns >= bad_rtt_ns || lossy(s));
  };
  uint64_t ahead = 0;
  int witnesses = 0;  // pending devices whose progress is witness
  bool someone_started = false, stalled = false, healthy = !replied.empty();
  std::vector<const Seen*> behind_bad_links;
  // A stall is blamed on a bad link after half the deadline (1 s at most):
  // a link that bad stalls every collective over it, so waiting the whole
  // deadline only lengthens the stall (a device behind a good link still
  // gets the whole deadline, below).
  const int64_t blame_stall_ns = LinkBlameNs();
  for (const Seen& s : seen) {
    stalled |= s.still_ns >= blame_stall_ns;
    if (blamed(s)) {
      behind_bad_links.push_back(&s);
    } else {
      healthy = true;
    }
    if (no_witness(s)) continue;
    ++witnesses;
    ahead = std::max(ahead, s.collectives);
    someone_started |= s.started;
  }
  // Or crawls: a link that bad slows every collective over it to a round
  // trip or more, and the group moves at that pace without any device
  // standing still for long (each collective returns once the frames over
  // the link arrive). Over the last quarter deadline (two such collectives
  // at least) the furthest witness still in the step took a bad round trip
  // per collective it entered, and twice the collective's expected time.
  // Steps only (other requests have no expected pace, and some enter no
  // collective), and only while a witness is pending (once every healthy
  // device has answered, those left are judged by the stall alone).
  const int64_t age = now - start_ns_;
  bool crawling = false;
  uint64_t crawl_entered = 0;
  int64_t crawl_window = 0;
  if (expected_move_ns_ > 0) {
    const int64_t crawl_ns = std::max(bad_rtt_ns, 2 * expected_move_ns_);
    const int64_t crawl_window_ns = std::max(2 * crawl_ns, blame_stall_ns / 2);
    // (The furthest so far: a witness that answers, or stops being one,
    // takes its collectives with it.)
    paces_.push_back({now, std::max(ahead, paces_.back().second)});
    while (paces_.size() > 1 && paces_[1].first <= now - crawl_window_ns) {
      paces_.erase(paces_.begin());
    }
    const int64_t window = now - paces_.front().first;
    const uint64_t entered = paces_.back().second - paces_.front().second;
    crawling = witnesses > 0 && window >= crawl_window_ns &&
               entered <= static_cast<uint64_t>(window / crawl_ns);
    crawl_entered = entered;
    crawl_window = window;
  }
  if ((stalled || crawling) && healthy && !behind_bad_links.empty()) {
    // The step stalls and links are bad: the devices behind them go, never
    // the healthy side that waits for them (it would look behind). The
    // other devices of their hosts share the link and go with them (one of
    // them may not have measured the link's badness yet).
    for (const Seen& s : seen) {
      if (s.p.host == 0 || blamed(s)) continue;
      for (const Seen* b : behind_bad_links) {
        if (b->p.host != s.p.host) continue;
        dead.push_back({s.device,
                        fmt::format("its host's link is degraded (device {}'s round trip {} ms)",
                                    b->device, b->p.link_rtt_ns / 1000000),
                        now, /*link=*/true});
        break;
      }
    }
    const std::string why = stalled
                                ? fmt::format("its step made no progress for {} ms", age / 1000000)
                                : fmt::format("its step crawls ({} collectives in its last {} ms)",
                                              crawl_entered, crawl_window / 1000000);
    for (const Seen* s : behind_bad_links) {
      dead.push_back({s->device,
                      fmt::format("its link is degraded (round trip {} ms, last heard {} ms ago{}) "
                                  "and {}",
                                  s->p.link_rtt_ns / 1000000, (now - s->p.heard_ns) / 1000000,
                                  lossy(*s) ? ", its peers' frames to its host lost" : "", why),
                      now, /*link=*/true});
    }
    Abort(now);
    next_check_ns_ = now + grace_ns_;
    return dead;
  }
  const bool someone_done = !replied.empty();
  // Over a network, members of one collective finish it at different times
  // (each when its last piece arrives): a device still inside a collective
  // that a peer has left may be waiting for frames a bad link holds back.
  // It is judged by the abort below (it answers, or it does not), not by
  // being behind.
  for (const Seen& s : seen) networked_ |= s.p.heard_ns > 0;
  bool all_still = true, waiting_on_network = false;
  for (const Seen& s : seen) {
    const bool still = s.still_ns >= deadline_ns_;
    all_still &= still;
    // (A device that has not taken up the request is behind only if a peer
    // has: if none has, the whole group stands still.)
    const bool behind = someone_done || (!s.started && someone_started) || s.collectives < ahead;
    if (still && behind && networked_ && s.p.in_collective()) {
      waiting_on_network = true;
    } else if (still && behind) {
      dead.push_back(
          {s.device,
           fmt::format("it made no progress for {} ms while its peers were further along",
                       s.still_ns / 1000000),
           now - s.still_ns});
    }
  }
  if (!dead.empty() || all_still || waiting_on_network) {
    // No survivor may keep waiting for the dead (or, if nobody is ahead, for
    // whoever does not answer now).
    Abort(now);
    next_check_ns_ = now + grace_ns_;
    return dead;
  }
  // Slow, not hung: everyone who is behind still moves. Look again soon
  // (soon enough to catch a link that degrades, however long the deadline).
  next_check_ns_ =
      now + std::max<int64_t>((networked_ ? LinkBlameNs() : deadline_ns_) / 4, 10000000);
  return dead;
}

bool ProcessStopped(int pid) {
  if (pid <= 0) return false;
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", pid);
  std::FILE* f = std::fopen(path, "re");
  if (!f) return false;
  char buf[512];
  const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  // "pid (comm) S ...": the state follows the last ')'.
  const char* close = std::strrchr(buf, ')');
  if (!close || close[1] != ' ') return false;
  return close[2] == 'T' || close[2] == 't';
}

}  // namespace failsafe
