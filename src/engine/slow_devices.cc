#include "engine/slow_devices.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace failsafe {

SlowDeviceMonitor::SlowDeviceMonitor(int num_devices, const SlowDeviceOptions& options)
    : options_(options),
      shares_(num_devices, 1.0),
      current_(num_devices),
      last_(num_devices),
      measured_(num_devices, false),
      relative_(num_devices, 1.0),
      raise_streak_(num_devices, 0),
      ceiling_(num_devices, 1.0),
      lowered_ns_(num_devices, 0) {}

double SlowDeviceMonitor::Rate(const Window& w) const {
  return w.compute_ns > 0 ? w.flops / static_cast<double>(w.compute_ns) : 0;  // FLOP per ns
}

void SlowDeviceMonitor::Observe(const StepTiming& timing, int64_t now_ns) {
  if (timing.devices.empty()) return;
  now_ns_ = now_ns;
  if (window_steps_ == 0) window_start_ns_ = now_ns;
  const int nd = static_cast<int>(shares_.size());
  for (size_t i = 0; i < timing.devices.size(); ++i) {
    const int d = timing.devices[i];
    if (d < 0 || d >= nd || i >= timing.device_compute_wall_ns.size()) continue;
    Window& w = current_[d];
    w.flops += timing.device_attention_flops[i] + timing.device_ffn_flops[i];
    w.compute_ns += timing.device_compute_wall_ns[i];
    w.steps++;
  }
  ++window_steps_;
  if (window_steps_ < options_.min_steps ||
      now_ns - window_start_ns_ < options_.window_ms * 1000000)
    return;
  // The window is full: speeds relative to the upper median of the devices
  // that worked in it.
  std::vector<double> rates;
  for (int d = 0; d < nd; ++d) {
    if (current_[d].steps > 0 && Rate(current_[d]) > 0) rates.push_back(Rate(current_[d]));
  }
  if (!rates.empty()) {
    std::sort(rates.begin(), rates.end());
    const double reference = rates[rates.size() / 2];
    for (int d = 0; d < nd; ++d) {
      measured_[d] = current_[d].steps > 0 && Rate(current_[d]) > 0;
      relative_[d] = measured_[d] ? Rate(current_[d]) / reference : 1.0;
      last_[d] = current_[d];
      if (ceiling_[d] < 1.0 && now_ns - lowered_ns_[d] > options_.ceiling_ms * 1000000)
        ceiling_[d] = 1.0;
      const bool more = measured_[d] && Target(d) > shares_[d] + options_.share_step / 2;
      raise_streak_[d] = more ? raise_streak_[d] + 1 : 0;
    }
  }
  for (Window& w : current_) w = Window();
  window_steps_ = 0;
}

void SlowDeviceMonitor::PlanChanged(const std::vector<double>& shares) {
  if (shares.size() == shares_.size()) {
    for (size_t d = 0; d < shares.size(); ++d) {
      // Lowered: it was too slow for the share it had.
      if (shares[d] < shares_[d]) {
        ceiling_[d] = std::min(ceiling_[d], shares_[d] - options_.share_step);
        lowered_ns_[d] = now_ns_;
      }
    }
    shares_ = shares;
  }
  std::fill(raise_streak_.begin(), raise_streak_.end(), 0);
  for (Window& w : current_) w = Window();
  std::fill(measured_.begin(), measured_.end(), false);
  window_steps_ = 0;
}

void SlowDeviceMonitor::DeviceReplaced(int device) {
  if (device < 0 || device >= static_cast<int>(shares_.size())) return;
  shares_[device] = 1.0;
  relative_[device] = 1.0;
  measured_[device] = false;
  raise_streak_[device] = 0;
  ceiling_[device] = 1.0;
}

double SlowDeviceMonitor::Target(int d) const {
  if (relative_[d] >= options_.slow_below) return 1.0;
  const double target = std::round(relative_[d] / options_.share_step) * options_.share_step;
  return std::clamp(target, options_.min_share, 1.0);
}

bool SlowDeviceMonitor::uneven() const {
  return std::any_of(shares_.begin(), shares_.end(), [](double s) { return s != 1.0; });
}

bool SlowDeviceMonitor::ProposeShares(std::vector<double>* shares, std::string* why) const {
  const int nd = static_cast<int>(shares_.size());
  std::vector<double> next = shares_;
  bool change = false;
  std::string reasons;
  int measured = 0;
  for (int d = 0; d < nd; ++d) {
    if (!measured_[d]) continue;
    ++measured;
    double target = Target(d);
    if (target > shares_[d]) {
      // Rising: slowly, and not to where it was too slow before.
      if (raise_streak_[d] < options_.raise_after_windows) continue;
      target = std::min({target, shares_[d] + options_.max_raise, ceiling_[d]});
      if (target < shares_[d] + options_.share_step / 2) continue;
    }
    // Falling: at once, once well away from the share in force.
    if (target > shares_[d] || shares_[d] - target > options_.hysteresis) {
      next[d] = target;
      change = true;
      if (!reasons.empty()) reasons += "; ";
      reasons += fmt::format("device {} runs at {:.2f}x its peers' speed: share {:.3g} -> {:.3g}",
                             d, relative_[d], shares_[d], target);
    }
  }
  if (!change || measured < 2) return false;
  *shares = std::move(next);
  if (why) *why = reasons;
  return true;
}

std::vector<MeasuredSpeed> SlowDeviceMonitor::speeds() const {
  double total = 0;
  for (const Window& w : last_) total += w.flops;
  std::vector<MeasuredSpeed> out;
  for (int d = 0; d < static_cast<int>(shares_.size()); ++d) {
    MeasuredSpeed s;
    s.device = d;
    s.measured = measured_[d];
    s.relative_speed = relative_[d];
    s.slow = measured_[d] && relative_[d] < options_.slow_below;
    s.share = shares_[d];
    s.work_fraction = total > 0 ? last_[d].flops / total : 0;
    s.gflops_per_s = Rate(last_[d]);  // FLOP/ns = GFLOP/s
    out.push_back(s);
  }
  return out;
}

}  // namespace failsafe
