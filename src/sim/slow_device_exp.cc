// slow-device: what rebalancing a slow device buys. One 8-GPU node serves an
// offline queue that never empties (the offline-gcp workload) while device 3
// runs at `speed` of its peers' speed (a throttled accelerator), under each
// placement that can give it a smaller share: without rebalancing (every
// all-reduce waits for it) and with the engine's own slow-device monitor
// and rebalancing (EngineOptions::rebalance_slow: it measures each device's
// speed from the executor's per-device timings and re-plans with a smaller
// share for the slow one). Sustained rates, as offline-gcp's steady mode
// measures them (warm-up, then a window), beside the healthy node's.
#include <fmt/format.h>

#include "sim/experiments_internal.h"
#include "sim/report.h"

namespace failsafe {

using nlohmann::json;

namespace {

constexpr int kSlowDevice = 3;

struct SlowRun {
  double tokens_per_s = 0;
  int64_t rebalances = 0;
  double share = 1;  // the slow device's share at the end
};

Result<SlowRun> Run(const ModelConfig& m, const HardwareProfile& hw, Policy policy,
                    const std::vector<SimRequest>& reqs, double speed, bool rebalance,
                    double warmup_s, double window_s) {
  InstanceConfig ic;
  ic.model = m;
  ic.hw = hw;
  ic.policy = policy;
  ic.sched = GpuSchedulerConfig(m, FailsafeTp(8));
  ic.rebalance_slow = rebalance;
  FS_ASSIGN_OR_RETURN(auto inst, SimInstance::Create(ic));
  if (speed < 1) FS_RETURN_IF_ERROR(inst->executor().SetDeviceSpeed(kSlowDevice, speed));
  size_t next = 0;
  FS_RETURN_IF_ERROR(RunQueueFull(inst.get(), reqs, &next, warmup_s));
  const int64_t tokens0 = inst->tokens_out();
  FS_RETURN_IF_ERROR(RunQueueFull(inst.get(), reqs, &next, warmup_s + window_s));
  SlowRun r;
  r.tokens_per_s = static_cast<double>(inst->tokens_out() - tokens0) / window_s;
  for (const RecoveryReport& rep : inst->engine().recoveries()) r.rebalances += rep.rebalance;
  r.share = inst->engine().device_speeds()[kSlowDevice].share;
  return r;
}

}  // namespace

Result<json> SlowDevice(const ExperimentOptions& o) {
  FS_ASSIGN_OR_RETURN(ModelConfig m, GetModelProfile(o.model));
  FS_ASSIGN_OR_RETURN(HardwareProfile hw, GetHardwareProfile(o.hardware));
  if (!(o.slow_speed > 0 && o.slow_speed <= 1))
    return InvalidArgument("--slow-speed must be in (0, 1], not {}", o.slow_speed);
  FS_ASSIGN_OR_RETURN(auto reqs, OfflineRequests(o, o.quick ? 300 : 1200));
  const double warmup = o.steady_warmup_s >= 0 ? o.steady_warmup_s : o.quick ? 120 : 900;
  const double window = o.steady_window_s > 0 ? o.steady_window_s : o.quick ? 60 : 600;
  json out = {{"slow_device", kSlowDevice},
              {"speed", o.slow_speed},
              {"warmup_s", warmup},
              {"window_s", window}};
  std::vector<std::vector<std::string>> rows;
  for (Policy p : {Policy::kHybrid, Policy::kCyclic, Policy::kNonUniform}) {
    FS_ASSIGN_OR_RETURN(SlowRun healthy, Run(m, hw, p, reqs, 1.0, true, warmup, window));
    FS_ASSIGN_OR_RETURN(SlowRun slow, Run(m, hw, p, reqs, o.slow_speed, false, warmup, window));
    FS_ASSIGN_OR_RETURN(SlowRun rebalanced,
                        Run(m, hw, p, reqs, o.slow_speed, true, warmup, window));
    const std::string name = PolicyName(p);
    out[name] = {
        {"healthy_tokens_per_s", healthy.tokens_per_s},
        {"slow_tokens_per_s", slow.tokens_per_s},
        {"rebalanced_tokens_per_s", rebalanced.tokens_per_s},
        {"rebalanced_over_slow", RatioOrNull(rebalanced.tokens_per_s, slow.tokens_per_s)},
        {"rebalanced_over_healthy", RatioOrNull(rebalanced.tokens_per_s, healthy.tokens_per_s)},
        {"rebalances", rebalanced.rebalances},
        {"healthy_rebalances", healthy.rebalances},
        {"slow_share", rebalanced.share}};
    rows.push_back({name, Num(healthy.tokens_per_s, 6), Num(slow.tokens_per_s, 6),
                    Num(rebalanced.tokens_per_s, 6), Num(rebalanced.share),
                    std::to_string(rebalanced.rebalances)});
  }
  FS_RETURN_IF_ERROR(WriteCsv(o.out_dir + "/slow_device.csv",
                              {"placement", "healthy_tokens_per_s", "slow_tokens_per_s",
                               "rebalanced_tokens_per_s", "slow_device_share", "rebalances"},
                              rows));
  return out;
}

}  // namespace failsafe
