// Slow devices: a device that stays slower than its peers on the same work
// (a throttled accelerator, a noisy neighbour, a process starved of CPU) is a
// gray failure. The monitor measures each device's speed as the work it did
// (attention and FFN FLOPs) over the wall time it spent computing (outside
// collectives), summed over a window of steps, relative to its healthy peers
// (the upper median of the active devices' speeds). A device is slow when its
// relative speed stays below a threshold over a whole window.
//
// From the speeds it proposes a share of work per device (Replan's weights):
// 1 for a device at normal speed, its relative speed (rounded) for a slow
// one. The share only changes when the measured speed moves well away from
// the share in force, so a rebalanced device, still slow but now with less
// work, keeps its share. A share falls at once but rises slowly: only after
// several windows in a row call for more, by a bounded step, and never back
// to a share the device was already too slow for (its ceiling, which a new
// process resets, and which lasts a minute). A device throttled by a duty cycle (a CPU quota) reads
// faster once its share leaves it idle part of the time; without the ceiling
// its share would swing between small and full.
//
//
// Pure logic: fed StepTiming and a clock reading, no threads, no I/O.
// Thread-safety: none (the engine thread owns it).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/executor.h"

namespace failsafe {

struct SlowDeviceOptions {
  // Measurements sum over at least this long and this many steps before a
  // device's speed counts.
  int64_t window_ms = 3000;
  int min_steps = 20;
  // Relative speed below which a device is slow.
  double slow_below = 0.75;
  // A lower share is proposed when it is below the share in force by more
  // than this (absolute); a higher one after raise_after_windows windows.
  double hysteresis = 0.2;
  // Shares are multiples of this, and at least min_share.
  double share_step = 0.125;
  double min_share = 0.25;
  // A share rises only after this many full windows in a row call for more,
  // and by at most max_raise at a time.
  int raise_after_windows = 3;
  double max_raise = 0.25;
  // A ceiling lasts this long after the share was lowered (then the device
  // may try its full share again).
  int64_t ceiling_ms = 60000;
};

struct MeasuredSpeed {
  int device = 0;
  bool measured = false;        // a full window has been seen since the last plan change
  double relative_speed = 1.0;  // work per compute second over the healthy peers'
  bool slow = false;
  double share = 1.0;          // the weight in force (Replan), 1: an equal share
  double work_fraction = 0.0;  // this device's part of the work in the last window
  double gflops_per_s = 0.0;   // measured rate over the last window
};

class SlowDeviceMonitor {
 public:
  SlowDeviceMonitor(int num_devices, const SlowDeviceOptions& options = {});

  // One step's per-device timing, at now_ns (monotonic).
  void Observe(const StepTiming& timing, int64_t now_ns);
  // The plan changed (failure, rejoin, rebalance): windows restart, since
  // shares of work changed. `shares` ([device]) are the weights now in force.
  void PlanChanged(const std::vector<double>& shares);
  // A device came back as a new process: its share returns to 1.
  void DeviceReplaced(int device);

  // Weights to re-plan with, when the measured speeds call for a change of
  // shares; false while the shares in force fit (or nothing is measured).
  bool ProposeShares(std::vector<double>* shares, std::string* why) const;

  // Per device id.
  std::vector<MeasuredSpeed> speeds() const;
  const std::vector<double>& shares() const { return shares_; }
  // Weights for Replan: nullptr-equivalent (empty) when every share is 1.
  bool uneven() const;

 private:
  struct Window {
    double flops = 0;
    int64_t compute_ns = 0;
    int steps = 0;
  };
  double Rate(const Window& w) const;
  // The share the last window's speed calls for.
  double Target(int device) const;

  const SlowDeviceOptions options_;
  std::vector<double> shares_;   // [device]
  std::vector<Window> current_;  // [device], filling
  std::vector<Window> last_;     // [device], the last full window
  std::vector<bool> measured_;   // [device]
  int64_t window_start_ns_ = 0;
  int window_steps_ = 0;
  std::vector<double> relative_;     // [device], from the last full window
  std::vector<int> raise_streak_;    // [device], full windows in a row that called for more
  std::vector<double> ceiling_;      // [device], below the least share it was too slow for
  std::vector<int64_t> lowered_ns_;  // [device], when its share was last lowered
  int64_t now_ns_ = 0;               // the latest Observe
};

}  // namespace failsafe
