// offline-gcp step by step: every node's instances (FailSafe and the
// baseline, sim/offline_gcp.h) run the whole availability trace on the
// simulated engine, with an offline queue kept full, and the trace's losses
// and gains applied as they happen: FailSafe through the engine's own
// recovery and rejoin (SimInstance::Fail / Rejoin), the baseline by a
// restart (a new instance on its new degree, after reloading its weights
// over PCIe, taking over every unfinished request with the KV of its prompt
// and of the tokens it generated lost: recomputed as a longer prompt).
//
// Time skipping: an instance's rate swings with the order of the workload
// it serves (an offline queue that cycles through the workload's requests),
// by about a tenth over tens of minutes, and the swing repeats every pass
// through the workload. So the rate is measured over whole passes: from
// `settle_s` after the instance's last change (start, recovery, rejoin or
// restart), a pass runs until the instance has served as many output tokens
// as the workload holds; then up to `skip_passes` passes' length of whole
// periods (`period_s`) before the node's next change are skipped (the clock
// jumps, nothing runs), and the next pass is measured, and so on. At the
// next change every skipped stretch is credited with the mean rate of every
// pass measured since the last one. Recoveries, restarts, the settling and
// the passes always run step by step, and so does an interval too short for
// a pass.
#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <memory>

#include "common/clock.h"
#include "common/log.h"
#include "sim/experiments_internal.h"
#include "sim/offline_gcp.h"
#include "sim/report.h"

namespace failsafe {

using nlohmann::json;

namespace {

constexpr double kBucketS = 600;  // seconds per row of the timeline

// Output tokens over the trace in buckets of kBucketS of virtual time.
class Timeline {
 public:
  explicit Timeline(double span_s)
      : span_(span_s), tokens_(static_cast<size_t>(std::ceil(span_s / kBucketS)) + 1, 0) {}
  // `tokens` produced evenly over [t0, t1), cut at the trace's end.
  void Credit(double t0, double t1, double tokens) {
    if (t1 <= t0) return;
    const double rate = tokens / (t1 - t0);
    t1 = std::min(t1, span_);
    for (double t = t0; t < t1;) {
      const size_t b = static_cast<size_t>(t / kBucketS);
      const double end = std::min(t1, (b + 1) * kBucketS);
      tokens_[b] += rate * (end - t);
      total_ += rate * (end - t);
      t = end;
    }
  }
  double total() const { return total_; }
  double span() const { return span_; }
  // Mean tokens/s of bucket b (its last one may be shorter).
  double Rate(size_t b) const {
    const double len = std::min(kBucketS, span_ - b * kBucketS);
    return len > 0 ? tokens_[b] / len : 0;
  }
  size_t buckets() const { return static_cast<size_t>(std::ceil(span_ / kBucketS)); }

 private:
  double span_;
  std::vector<double> tokens_;
  double total_ = 0;
};

// The mean of a series.
class RunningMean {
 public:
  void Add(double x) { mean_ += (x - mean_) / ++n_; }
  double mean() const { return mean_; }

 private:
  int n_ = 0;
  double mean_ = 0;
};

struct SystemStats {
  double stepped_s = 0, skipped_s = 0;  // virtual time run step by step / skipped
  int64_t reconfigurations = 0;         // recoveries, rejoins or restarts
  int64_t steps = 0;
  int64_t degraded = 0;  // changes that left an instance unable to serve
  int64_t passes = 0;    // passes through the workload measured (time skipping)
};

uint64_t FullMask(int gpus) { return gpus >= 64 ? ~uint64_t{0} : (uint64_t{1} << gpus) - 1; }

// One node's instance of one system, and its offline queue.
class NodeRunner {
 public:
  NodeRunner(const OfflineTables& t, const OfflineStepOptions& o, Timeline* timeline,
             SystemStats* stats)
      : t_(t), o_(o), timeline_(timeline), stats_(stats) {
    for (const SimRequest& r : t.requests) pass_size_ += r.output;
  }

  // Keeps `inst_` holding as many unfinished requests as the workload has:
  // `carry` first (a restarted baseline's), then the workload in turn.
  Status TopUp() {
    if (!inst_) return Status::Ok();
    while (!carry_.empty()) {
      carry_.back().arrival = inst_->clock();
      FS_RETURN_IF_ERROR(inst_->Submit(carry_.back()));
      carry_.pop_back();
    }
    return KeepQueueFull(inst_.get(), t_.requests, &next_);
  }

  // Runs until `t_end` (virtual seconds since the trace's start), skipping
  // stretches once a pass is measured.
  Status RunTo(double t_end) {
    if (!inst_) return Status::Ok();
    // Passes only count from settle_s after the instance's change.
    const double settled = changed_at_ + o_.settle_s;
    while (inst_->clock() < t_end) {
      // Refilled as the steady rates' runs are.
      FS_RETURN_IF_ERROR(TopUp());
      const double t0 = inst_->clock();
      const int64_t tok0 = inst_->tokens_out(), steps0 = inst_->steps();
      inst_->RunUntil(std::min(t_end, t0 + kQueueRefillS));
      const double t1 = inst_->clock();
      const double tokens = static_cast<double>(inst_->tokens_out() - tok0);
      stats_->stepped_s += t1 - t0;
      stats_->steps += inst_->steps() - steps0;
      timeline_->Credit(t0, t1, tokens);
      if (t0 < settled) continue;
      if (pass_from_ < 0) {  // a pass starts
        pass_from_ = t0;
        pass_tokens_ = 0;
      }
      pass_tokens_ += tokens;
      if (pass_tokens_ < pass_size_) continue;
      passes_.Add(pass_tokens_ / (t1 - pass_from_));
      stats_->passes++;
      pass_s_ = t1 - pass_from_;
      pass_from_ = -1;
      if (!o_.skip) continue;
      const double room = std::min(o_.skip_passes * pass_s_, t_end - t1);
      const double skip = std::floor(room / o_.period_s) * o_.period_s;
      if (skip <= 0) continue;
      skipped_.emplace_back(t1, t1 + skip);
      stats_->skipped_s += skip;
      inst_->AdvanceTo(t1 + skip);
    }
    return Status::Ok();
  }

  // Runs the trace: at each point where the node's devices change, runs up
  // to it and calls change(at, before, after) (alive device masks); then
  // runs to the trace's end.
  template <typename F>
  Status Replay(int node, F&& change) {
    uint64_t mask = FullMask(t_.gpus_per_node);
    for (size_t i = 0; i + 1 < t_.trace.size(); ++i) {
      const uint64_t next = t_.masks[i][node];
      if (next == mask) continue;
      FS_RETURN_IF_ERROR(RunTo(t_.trace[i].t_s));
      FS_RETURN_IF_ERROR(change(t_.trace[i].t_s, mask, next));
      mask = next;
    }
    FS_RETURN_IF_ERROR(RunTo(t_.trace.back().t_s));
    CreditSkipped();
    return Status::Ok();
  }

  // Stops the instance: its unfinished requests wait for the next one, the
  // tokens they generated part of the prompt to recompute.
  void Stop() {
    CreditSkipped();
    if (!inst_) return;
    std::vector<SimRequest> left = inst_->Unfinished();
    carry_.insert(carry_.end(), left.rbegin(), left.rend());
    inst_.reset();
  }

  // The instance changed (started, recovered, restarted) at `t`: what it
  // measured before no longer holds.
  void Changed(double t) {
    CreditSkipped();
    changed_at_ = t;
  }
  std::unique_ptr<SimInstance>& inst() { return inst_; }
  std::vector<SimRequest>& carry() { return carry_; }

 private:
  // Credits every stretch skipped since the last change with the mean rate
  // of every pass measured since (those after it too), and starts afresh.
  void CreditSkipped() {
    for (const auto& [from, to] : skipped_)
      timeline_->Credit(from, to, passes_.mean() * (to - from));
    skipped_.clear();
    passes_ = RunningMean();
    pass_from_ = -1;
  }

  const OfflineTables& t_;
  const OfflineStepOptions& o_;
  Timeline* timeline_;
  SystemStats* stats_;
  std::unique_ptr<SimInstance> inst_;
  std::vector<SimRequest> carry_;  // unfinished requests for the next instance (last first)
  size_t next_ = 0;
  double changed_at_ = 0;
  // A pass: the instance serves as many output tokens as the workload has
  // (its rate swings with the workload's order, and repeats every pass).
  double pass_size_ = 0;
  RunningMean passes_;     // output tokens/s of the passes since the settling
  double pass_from_ = -1;  // the pass being measured started here (virtual s); -1: none
  double pass_tokens_ = 0;
  double pass_s_ = 0;                               // the last pass's length (virtual s)
  std::vector<std::pair<double, double>> skipped_;  // [from, to) virtual s, not yet credited
};

std::vector<int> Devices(uint64_t mask) {
  std::vector<int> out;
  for (int d = 0; d < 64; ++d) {
    if (mask >> d & 1) out.push_back(d);
  }
  return out;
}

// FailSafe's placement on `n` alive GPUs: hybrid attention, or cyclic
// placement alone where the steady tables say it serves more (replicating
// the DP head groups' weights costs more than their balance gains). The
// engine changes between them as it replans (EngineOptions::policy_for).
Policy FailsafePolicy(const OfflineTables& t, int n) {
  if (n < 0 || n >= static_cast<int>(t.hybrid_thr.size())) return Policy::kHybrid;
  return t.cyclic_thr[n] > t.hybrid_thr[n] ? Policy::kCyclic : Policy::kHybrid;
}

// A FailSafe instance on the node's alive devices (nullptr when they cannot
// hold the model).
Result<std::unique_ptr<SimInstance>> MakeFailsafe(const OfflineTables& t, uint64_t alive) {
  InstanceConfig ic;
  ic.model = t.model;
  ic.hw = t.hw;
  ic.policy = FailsafePolicy(t, std::popcount(alive));
  ic.policy_for = [&t](int n) { return FailsafePolicy(t, n); };
  ic.num_devices = std::max(8, t.gpus_per_node);  // as the steady mode's instances
  ic.alive = Devices(alive);
  ic.sched = GpuSchedulerConfig(t.model, FailsafeTp(t.gpus_per_node));
  ic.recovery = RecoveryMode::kFull;
  if (ic.alive.empty()) return std::unique_ptr<SimInstance>();
  auto made = SimInstance::Create(ic);
  if (!made.ok() && made.status().code() == StatusCode::kResourceExhausted)
    return std::unique_ptr<SimInstance>();
  return made;
}

// One node's FailSafe instance over the whole trace. While its devices
// serve the workload (the steady tables' rate for the placement and the
// count is positive) it recovers and rejoins in place through the engine;
// a change that leaves too few devices stops the instance (its unfinished
// requests wait, their KV lost), and enough devices back start a new one,
// which loads its weights over PCIe.
Status RunFailsafeNode(const OfflineTables& t, const OfflineStepOptions& o, int node,
                       Timeline* timeline, SystemStats* stats) {
  NodeRunner run(t, o, timeline, stats);
  auto serves = [&](uint64_t m) {
    const int n = std::popcount(m);
    return std::max(t.hybrid_thr[n], t.cyclic_thr[n]) > 0;
  };
  if (serves(FullMask(t.gpus_per_node))) {
    FS_ASSIGN_OR_RETURN(run.inst(), MakeFailsafe(t, FullMask(t.gpus_per_node)));
    FS_RETURN_IF_ERROR(run.TopUp());
  }
  return run.Replay(node, [&](double at, uint64_t mask, uint64_t next) -> Status {
    stats->reconfigurations++;
    if (!serves(next)) {
      stats->degraded++;
      run.Stop();
    } else if (!run.inst()) {
      FS_ASSIGN_OR_RETURN(run.inst(), MakeFailsafe(t, next));
      if (!run.inst()) return Internal("FailSafe cannot start on {} devices", std::popcount(next));
      run.inst()->AdvanceTo(at + ColdStartS(t.model, t.hw, std::popcount(next)) + o.switch_delay_s);
      FS_RETURN_IF_ERROR(run.TopUp());
    } else {
      SimInstance& inst = *run.inst();
      const std::vector<int> lost = Devices(mask & ~next), gained = Devices(next & ~mask);
      if (!lost.empty()) FS_RETURN_IF_ERROR(inst.Fail(lost).status());
      for (int d : gained) FS_RETURN_IF_ERROR(inst.Rejoin(d).status());
      inst.AdvanceTo(inst.clock() + o.switch_delay_s);
    }
    if (run.inst()) run.Changed(run.inst()->clock());
    return Status::Ok();
  });
}

// One node's baseline instance over the whole trace.
Status RunBaselineNode(const OfflineTables& t, const OfflineStepOptions& o, int node,
                       Timeline* timeline, SystemStats* stats) {
  NodeRunner run(t, o, timeline, stats);
  BaselineGroup group;
  auto start = [&](double at, double pause) -> Status {
    run.Stop();
    if (group.tp == 0) return Status::Ok();
    const SystemSpec s{"TP" + std::to_string(group.tp), group.tp, Policy::kStandard,
                       RouterPolicy::kRoundRobin, PrefillPolicy::kFifo};
    FS_ASSIGN_OR_RETURN(run.inst(), MakeInstance(t.model, t.hw, s, RecoveryMode::kFull));
    run.inst()->AdvanceTo(at + pause);
    run.Changed(at + pause);
    return run.TopUp();
  };
  group.Update(FullMask(t.gpus_per_node), BaselineTp(t.gpus_per_node, t.tp_thr));
  FS_RETURN_IF_ERROR(start(0, 0));
  return run.Replay(node, [&](double at, uint64_t, uint64_t next) -> Status {
    if (!group.Update(next, BaselineTp(std::popcount(next), t.tp_thr))) return Status::Ok();
    // A restart: every unfinished request moves to the new instance.
    stats->reconfigurations++;
    if (group.tp == 0) stats->degraded++;
    return start(at, ColdStartS(t.model, t.hw, group.tp) + o.switch_delay_s);
  });
}

json StatsJson(const SystemStats& s, const Timeline& tl) {
  return {{"mean_tokens_per_s", tl.total() / tl.span()},
          {"stepped_s", s.stepped_s},
          {"skipped_s", s.skipped_s},
          {"steps", s.steps},
          {"passes", s.passes},
          {"reconfigurations", s.reconfigurations},
          {"changes_leaving_nothing_to_serve", s.degraded}};
}

}  // namespace

Result<json> OfflineGcpStep(const OfflineTables& t, const OfflineStepOptions& o,
                            const std::string& out_dir) {
  if (!(o.period_s > 0) || !(o.skip_passes >= 0))
    return InvalidArgument(
        "the skipping period must be positive, and the passes skipped at once not negative");
  if (t.trace.size() < 2) return InvalidArgument("an availability trace needs two points");
  const int64_t wall0 = MonotonicNanos();
  const double span = t.trace.back().t_s;
  Timeline base_tl(span), fs_tl(span);
  SystemStats base_st, fs_st;
  json placement = json::object();
  for (int n = 1; n <= t.gpus_per_node; ++n) {
    if (std::max(t.hybrid_thr[n], t.cyclic_thr[n]) > 0)
      placement[std::to_string(n)] = PolicyName(FailsafePolicy(t, n));
  }
  for (int node = 0; node < t.nodes; ++node) {
    FS_RETURN_IF_ERROR(RunBaselineNode(t, o, node, &base_tl, &base_st));
    FS_RETURN_IF_ERROR(RunFailsafeNode(t, o, node, &fs_tl, &fs_st));
    FS_LOG_INFO("offline-gcp step: node {} of {} done ({:.1f} s)", node + 1, t.nodes,
                (MonotonicNanos() - wall0) * 1e-9);
  }
  std::vector<std::vector<std::string>> rows;
  for (size_t b = 0; b < fs_tl.buckets(); ++b) {
    rows.push_back({Num(b * kBucketS / 3600.0), Num(base_tl.Rate(b), 6), Num(fs_tl.Rate(b), 6)});
  }
  FS_RETURN_IF_ERROR(WriteCsv(out_dir + "/offline_gcp_step.csv",
                              {"hour", "baseline_tokens_per_s", "failsafe_tokens_per_s"}, rows));
  return json{{"failsafe_over_baseline", RatioOrNull(fs_tl.total(), base_tl.total())},
              {"baseline", StatsJson(base_st, base_tl)},
              {"failsafe", StatsJson(fs_st, fs_tl)},
              {"failsafe_placement_by_gpus", placement},
              {"period_s", o.period_s},
              {"skip_passes", o.skip_passes},
              {"settle_s", o.settle_s},
              {"skip", o.skip},
              {"simulation_seconds", (MonotonicNanos() - wall0) * 1e-9}};
}

}  // namespace failsafe
