// Detection of hung devices: how long a step may take, and who is hung when
// it takes longer.
//
// Deadlines come from measured step times. The scheduler's cost model gives
// each step an estimate from its work (tokens, context, the plan); the ratio
// of measured wall time to estimate is tracked over recent steps, so a
// step's expected duration is (a high percentile of that ratio) x its
// estimate. A device moves at every collective of a step (2 per layer, and
// the embedding), so the step's deadline is `multiplier` x the expected time
// between two moves, never less than a floor: a device that has not moved
// for that long is not merely slow. Until enough steps are measured the
// ratio is taken to be very large (a generous bootstrap).
//
// When a deadline passes, the devices' progress (worker/device_progress.h)
// says who is hung: a device that has not moved for the whole deadline while
// a peer is further along, or done, is the one the others wait for. It is
// declared dead (the caller kills it, which fences it) and the group is
// aborted so that no survivor keeps waiting. If nobody is ahead (every
// pending device stuck at the same point), the group is aborted and those
// that do not answer within a grace period are declared dead. Devices that
// are merely slow keep moving and are never declared dead: the watch looks
// again later.
//
// Thread-safety: one thread uses a StepDeadline or a HangWatch.
#pragma once

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "engine/reply_collector.h"
#include "worker/device_progress.h"

namespace failsafe {

struct DeadlineOptions {
  int64_t step_timeout_ms = 0;  // > 0: every step gets exactly this; 0: derived
  int64_t floor_ms = 500;       // a derived deadline is never shorter
  double multiplier = 8;        // over the expected time between two moves
};

class StepDeadline {
 public:
  explicit StepDeadline(const DeadlineOptions& options = {}) : options_(options) {}

  // Milliseconds a device of a step the cost model estimates at `estimate_s`
  // may go without moving, for a step with `moves` collectives.
  int64_t DeadlineMs(double estimate_s, int moves = 1) const;
  // A step estimated at `estimate_s` took `wall_ns`.
  void Observe(double estimate_s, int64_t wall_ns);
  // The expected wall time of a step estimated at `estimate_s` (seconds).
  double ExpectedSeconds(double estimate_s) const;
  int64_t floor_ms() const;
  int samples() const { return static_cast<int>(std::min<int64_t>(count_, kWindow)); }

 private:
  static constexpr int kWindow = 256;   // recent steps whose ratio counts
  static constexpr int kBootstrap = 8;  // steps before the ratio is trusted
  // The ratio of wall time to estimate that covers most recent steps.
  double Ratio() const;

  DeadlineOptions options_;
  double ratios_[kWindow] = {};
  int64_t count_ = 0;
};

// The host behind a link that loses frames, from what a group's devices saw
// on their collective connections at or after `since_ns` (each device's
// DeviceProgress::loss: the peer hosts its connections lost segments to).
// Frames lost on one host's link show on every pair of hosts with that host
// at one end: it is the host common to every such pair, once two pairs
// show it; in a group over two hosts a single pair does, and the side that
// is not the coordinator's is to blame. The coordinator's host is never the
// answer: local devices (host 0), the address they give their peers (their
// alias) and kCoordinatorHostId name it, as does a remote device's host
// that is one of those. A peer id that names no device's host is nobody's
// (an address the group does not know), and its pairs count for nothing.
// 0 when nothing was lost, or when the pairs share no host (two bad
// links), or a single pair shows in a group over three hosts or more.
uint64_t LossyHost(const std::vector<DeviceProgress>& group, int64_t since_ns);

// Hang detection for one collection of replies (a ReplyWatch).
class HangWatch final : public ReplyWatch {
 public:
  // `devices` were sent a request at `sent_ns`; `before` is their progress
  // read just before (parallel to `devices`; empty: read now).
  // `abort_group` makes every pending collective of their group fail.
  HangWatch(const DeviceProgressRegion* progress, const std::vector<int>& devices,
            std::vector<DeviceProgress> before, int64_t sent_ns, int64_t deadline_ms,
            int64_t grace_ms, std::function<void()> abort_group);

  int64_t next_check_ns() const override { return next_check_ns_; }
  std::vector<Verdict> Check(int64_t now_ns, const std::vector<int>& pending,
                             const std::vector<int>& replied) override;
  void OnFailedReply(int device) override;
  bool aborted() const { return aborted_; }
  // The step's expected time between two moves (0, the default: unknown, as
  // for requests other than steps, which are never judged by their pace). A
  // group that crawls over a bad link is blamed on it only at under half
  // that pace (Check).
  void set_expected_move_ns(int64_t ns) { expected_move_ns_ = ns; }
  // Whether a device's process is stopped now (by a signal or a tracer:
  // SIGSTOP, a debugger), or gone (declared dead); unset: never known. A
  // step whose every device is stopped or gone, one pending at least, is
  // paused, not hung, whichever collective the stop caught each in: Check
  // waits for it, and once it runs again its devices get the grace to move
  // before anyone is judged. (A group stopped and continued over and over,
  // faster than the grace, is judged only once that ends.)
  void set_stopped(std::function<bool(int device)> stopped) { stopped_ = std::move(stopped); }

 private:
  void Abort(int64_t now_ns);
  DeviceProgress Progress(int device) const;
  // How long a stall may last before a device behind a bad link is blamed.
  int64_t LinkBlameNs() const;

  const DeviceProgressRegion* progress_;
  std::vector<int> devices_;
  std::vector<DeviceProgress> base_;  // parallel to devices_
  const int64_t start_ns_;
  const int64_t deadline_ns_;  // length
  const int64_t grace_ns_;
  std::function<void()> abort_group_;
  int64_t next_check_ns_;
  bool aborted_ = false;
  bool networked_ = false;  // a device of the step is heard over a link
  int64_t aborted_at_ns_ = 0;
  int64_t paused_logged_ns_ = 0;  // last said the group is paused (0: never)
  // (when, the furthest witness's collectives) at the step's start and each
  // check since the crawl window before the last: the group's pace.
  std::vector<std::pair<int64_t, uint64_t>> paces_;
  int64_t expected_move_ns_ = 0;
  std::function<bool(int)> stopped_;
  int64_t paused_seen_ns_ = 0;  // when every device was last seen stopped (0: never)
};

// Whether process `pid` is stopped now (by a signal or a tracer); false if
// it cannot be told (it is gone, or on another host).
bool ProcessStopped(int pid);

}  // namespace failsafe
