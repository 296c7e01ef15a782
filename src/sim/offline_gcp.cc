// offline-gcp: nodes x GPUs per node (8 x 8) under an availability trace
// (the GCP A100 trace, or --availability FILE scaled to the cluster), an
// OpenThoughts-like offline workload (or --requests FILE's lengths).
//
// The failure model and each node's systems are in sim/offline_gcp.h. This
// file is the steady-state mode: the throughput of an instance on n GPUs
// comes from a saturated simulation with the engine's scheduler (a steady
// state: the workload is offline and the queue never empties); the trace
// then decides, event by event, how many GPUs each node has. A node changing
// its GPUs pauses: the baseline restarts its instance (reloads its weights
// and recomputes its in-flight KV); FailSafe recovers in place (its modelled
// recovery); each pause grows by the switching delay when one is set. With
// --mode step the trace also runs step by step (sim/offline_gcp_step.cc)
// and both are reported.
#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <map>

#include "common/clock.h"
#include "common/log.h"
#include "common/rng.h"
#include "sim/availability.h"
#include "sim/experiments.h"
#include "sim/experiments_internal.h"
#include "sim/offline_gcp.h"
#include "sim/report.h"
#include "trace/workload.h"

namespace failsafe {

using nlohmann::json;

int BaselineTp(int n, const std::map<int, double>& tp_thr) {
  int tp = 0;
  for (const auto& [t, thr] : tp_thr) {
    if (t <= n && thr > 0) tp = t;
  }
  return tp;
}

bool BaselineGroup::Update(uint64_t alive, int new_tp) {
  if (new_tp == tp && (devices & ~alive) == 0) return false;
  tp = new_tp;
  devices = 0;
  for (int d = 0, n = 0; d < 64 && n < new_tp; ++d) {
    if (alive >> d & 1) {
      devices |= uint64_t{1} << d;
      ++n;
    }
  }
  return true;
}

std::vector<std::vector<uint64_t>> NodeAliveMasks(const std::vector<AvailabilityPoint>& trace,
                                                  int nodes, int gpus_per_node, uint64_t seed) {
  Rng rng(HashCombine(seed, 0x6c9)), device_rng(HashCombine(seed, 0xd3f));
  const uint64_t full = gpus_per_node == 64 ? ~uint64_t{0} : (uint64_t{1} << gpus_per_node) - 1;
  std::vector<uint64_t> alive(nodes, full);
  int current = nodes * gpus_per_node;
  // The n-th (from 0) set bit of `mask`.
  auto nth = [](uint64_t mask, uint64_t n) {
    for (; n > 0; --n) mask &= mask - 1;
    return std::countr_zero(mask);
  };
  std::vector<std::vector<uint64_t>> out;
  out.reserve(trace.size());
  for (const AvailabilityPoint& p : trace) {
    while (current > p.count) {  // a GPU lost, on a random node that has one
      int node;
      do node = static_cast<int>(rng.Below(nodes));
      while (alive[node] == 0);
      const uint64_t k = device_rng.Below(static_cast<uint64_t>(std::popcount(alive[node])));
      alive[node] &= ~(uint64_t{1} << nth(alive[node], k));
      current--;
    }
    while (current < p.count) {  // a GPU regained, on a random node missing one
      int node;
      do node = static_cast<int>(rng.Below(nodes));
      while (alive[node] == full);
      const uint64_t dead = full & ~alive[node];
      const uint64_t k = device_rng.Below(static_cast<uint64_t>(std::popcount(dead)));
      alive[node] |= uint64_t{1} << nth(dead, k);
      current++;
    }
    out.push_back(alive);
  }
  return out;
}

namespace {

// The throughput timeline above the availability trace, each system's mean
// as a horizontal line of its own dash pattern (black and white).
void PlotOfflineTimeline(const std::string& dir, const std::string& trace_path,
                         const std::string& model, int cluster_gpus,
                         const std::vector<double>& means) {
  const std::string csv = dir + "/offline_gcp.csv", avail = dir + "/offline_gcp_availability.csv";
  const char* names[] = {"baseline (TP 1/2/4/8)", "FailSafe", "fault-free", "fault-scaled"};
  std::string script = fmt::format(
      "set datafile separator ','\nset multiplot\nset lmargin at screen 0.09\nset rmargin at "
      "screen 0.72\nset autoscale xfix\n"
      "set size 1,0.68\nset origin 0,0.32\nset title '{} under {}'\nset ylabel 'output tokens/s'\n"
      "set format x ''\nset key outside right top\nset grid\nplot ",
      GnuplotText(model), GnuplotText(trace_path));
  for (int i = 0; i < 4; ++i) {
    script += fmt::format(
        "'{}' using 1:{} every ::1 with steps {} title '{}', {} with lines {} title '{} (mean)', ",
        GnuplotText(csv), i + 2, MonoStyle(i, false), names[i], means[i], MonoStyle(i, false, 1),
        names[i]);
  }
  script.resize(script.size() - 2);
  script += fmt::format(
      "\nset size 1,0.32\nset origin 0,0\nunset title\nset format x '%g'\nset xlabel 'hour'\n"
      "set ylabel 'GPUs alive'\nset yrange [0:{}]\nplot '{}' using 1:2 every ::1 with steps {} "
      "title 'GPUs alive'\nunset multiplot\n",
      cluster_gpus * 1.05, GnuplotText(avail), MonoStyle(0, false));
  RunGnuplot(dir + "/offline_gcp.png", script, 1000, 720);
}

}  // namespace

Result<json> OfflineGcp(const ExperimentOptions& o) {
  const int64_t wall0 = MonotonicNanos();
  if (o.offline_mode != "steady" && o.offline_mode != "step")
    return InvalidArgument("offline-gcp mode '{}': steady or step", o.offline_mode);
  if (!(o.switch_delay_s >= 0) || !(o.step_period_s > 0))
    return InvalidArgument("a switching delay of {} s and a period of {} s: need >= 0 and > 0",
                           o.switch_delay_s, o.step_period_s);
  FS_ASSIGN_OR_RETURN(ModelConfig m, GetModelProfile(o.model));
  FS_ASSIGN_OR_RETURN(HardwareProfile hw, GetHardwareProfile(o.hardware));
  // A node recovers in place from a lost GPU: it needs two.
  if (o.nodes < 1 || o.nodes > 4096 || o.gpus_per_node < 2 || o.gpus_per_node > 64) {
    return InvalidArgument("{} nodes of {} GPUs: need 1-4096 nodes of 2-64 GPUs", o.nodes,
                           o.gpus_per_node);
  }
  const std::string trace_path =
      o.availability_file.empty()
          ? FindDataDir(o.data_dir) + "/availability/bamboo/gcloud/a100x1-east1b.txt"
          : o.availability_file;
  FS_ASSIGN_OR_RETURN(AvailabilityTrace raw, ReadAvailabilityTrace(trace_path));
  if (raw.reordered > 0) {
    FS_LOG_WARN("{}: {} rows out of time order, sorted by time", trace_path, raw.reordered);
  }
  FS_ASSIGN_OR_RETURN(AvailabilityScale scale, ParseAvailabilityScale(o.availability_scale));
  const int kNodes = o.nodes, kGpus = o.gpus_per_node;
  FS_ASSIGN_OR_RETURN(ScaledAvailability avail, ScaleAvailability(raw, kNodes * kGpus, scale));
  const std::vector<AvailabilityPoint>& trace = avail.points;
  // Throughput of one node's instance for every GPU count, both systems.
  FS_ASSIGN_OR_RETURN(auto reqs, OfflineRequests(o, o.quick ? 300 : 1200));
  if (!o.requests_file.empty()) FitToContext(m, &reqs);
  // Sustained rates: past the first batches (all started at once, at short
  // contexts) to the mix of contexts that follows as requests finish and
  // new ones start.
  const double warmup = o.steady_warmup_s >= 0 ? o.steady_warmup_s : o.quick ? 120 : 900;
  const double window = o.steady_window_s > 0 ? o.steady_window_s : o.quick ? 60 : 600;
  const double short_window = o.quick ? 60 : 200;  // prefill speed, the recovery pause
  std::vector<double> base_thr(kGpus + 1, 0), fs_thr(kGpus + 1, 0);
  // Baseline instances: throughput, KV in flight, and prefill speed (to
  // recompute that KV after a restart).
  std::map<int, double> tp_thr, tp_prefill;
  std::map<int, int64_t> tp_inflight;
  for (int tp = 1; tp <= kGpus; tp *= 2) {
    SystemSpec s{"TP" + std::to_string(tp), tp, Policy::kStandard, RouterPolicy::kRoundRobin,
                 PrefillPolicy::kFifo};
    FS_ASSIGN_OR_RETURN(tp_thr[tp],
                        SustainedThroughput(m, hw, s, reqs, warmup, window, &tp_inflight[tp]));
    FS_ASSIGN_OR_RETURN(tp_prefill[tp],
                        ThroughputOrZero(m, hw, s, Phase::kPrefill, reqs, short_window * 0.25));
  }
  // FailSafe runs each GPU count with the better of its placements: hybrid
  // attention, or cyclic placement alone where replicating the DP head
  // groups' weights costs more than their balance gains.
  std::vector<std::string> fs_choice(kGpus + 1);
  std::vector<double> hybrid_thr(kGpus + 1, 0), cyclic_thr(kGpus + 1, 0);
  int min_gpus = 0;
  for (int n = 1; n <= kGpus; ++n) {
    for (const SystemSpec& s : {HybridTp(n), CyclicTp(n)}) {
      FS_ASSIGN_OR_RETURN(double thr, SustainedThroughput(m, hw, s, reqs, warmup, window));
      (s.policy == Policy::kCyclic ? cyclic_thr : hybrid_thr)[n] = thr;
      if (thr > fs_thr[n]) {
        fs_thr[n] = thr;
        fs_choice[n] = PolicyName(s.policy);
      }
    }
    if (fs_thr[n] > 0 && min_gpus == 0) min_gpus = n;
    base_thr[n] = tp_thr[BaselineTp(n, tp_thr)];
  }
  if (min_gpus == 0) return ResourceExhausted("{} does not fit on {} GPUs", o.model, kGpus);
  // Pauses when a node's GPUs change: the baseline restarts on its new TP
  // degree, reloading its weights over PCIe and recomputing the KV the old
  // instance had in flight at the new instance's prefill speed; FailSafe
  // recovers in place (its modelled full recovery).
  for (const auto& [tp, thr] : tp_thr) {
    if (thr > 0 && !(tp_prefill[tp] > 0))
      return Internal("TP{} serves {:.0f} tokens/s but its prefill rate measured {}", tp, thr,
                      tp_prefill[tp]);
  }
  auto base_pause = [&](int old_tp, int new_tp) {
    if (new_tp == 0) return 0.0;
    const double inflight = old_tp > 0 ? static_cast<double>(tp_inflight[old_tp]) : 0.0;
    return ColdStartS(m, hw, new_tp) + (inflight > 0 ? inflight / tp_prefill[new_tp] : 0.0);
  };
  double fs_pause = 0;
  {
    FS_ASSIGN_OR_RETURN(auto inst, MakeInstance(m, hw, FailsafeTp(kGpus), RecoveryMode::kFull));
    for (SimRequest r : reqs) {
      r.arrival = 0;
      FS_RETURN_IF_ERROR(inst->Submit(r));
    }
    inst->RunUntil(short_window * 0.5);
    FS_ASSIGN_OR_RETURN(SimRecovery rec, inst->Fail(kGpus - 1));
    fs_pause = rec.stall_s();
  }
  // Replay the trace: GPUs lost and regained on random nodes.
  const std::vector<std::vector<uint64_t>> masks = NodeAliveMasks(trace, kNodes, kGpus, o.seed);
  const uint64_t full = kGpus == 64 ? ~uint64_t{0} : (uint64_t{1} << kGpus) - 1;
  std::vector<BaselineGroup> groups(kNodes);
  for (BaselineGroup& g : groups) g.Update(full, BaselineTp(kGpus, tp_thr));
  std::vector<int> alive(kNodes, kGpus);
  std::vector<std::vector<std::string>> rows;
  double sum_base = 0, sum_fs = 0, sum_free = 0, sum_scaled = 0, span = 0;
  int changes = 0;
  const double bucket = 600;  // seconds per row of the timeline
  double bucket_start = 0, b_base = 0, b_fs = 0, b_free = 0, b_scaled = 0, b_len = 0;
  const double free_node = fs_thr[kGpus];
  for (size_t i = 0; i + 1 < trace.size(); ++i) {
    const int current = trace[i].count;
    const std::vector<int> before = alive;
    std::vector<char> restarted(kNodes, 0);
    for (int nd = 0; nd < kNodes; ++nd) {
      alive[nd] = std::popcount(masks[i][nd]);
      restarted[nd] = groups[nd].Update(masks[i][nd], BaselineTp(alive[nd], tp_thr));
    }
    const double dt = trace[i + 1].t_s - trace[i].t_s;
    double base = 0, fs = 0, scaled = 0;
    for (int nd = 0; nd < kNodes; ++nd) {
      const bool changed = i == 0 ? masks[0][nd] != full : masks[i][nd] != masks[i - 1][nd];
      changes += changed;
      const int old_tp = BaselineTp(before[nd], tp_thr), new_tp = groups[nd].tp;
      // The baseline restarts when its TP degree changes or it lost a device
      // of its group (not a spare).
      const double bp =
          restarted[nd] ? std::min(dt, base_pause(old_tp, new_tp) + o.switch_delay_s) : 0;
      const double fp = changed ? std::min(dt, fs_pause + o.switch_delay_s) : 0;
      base += base_thr[alive[nd]] * (dt - bp);
      fs += fs_thr[alive[nd]] * (dt - fp);
      scaled += free_node * alive[nd] / kGpus * dt;
    }
    sum_base += base;
    sum_fs += fs;
    sum_scaled += scaled;
    sum_free += free_node * kNodes * dt;
    span += dt;
    b_base += base;
    b_fs += fs;
    b_scaled += scaled;
    b_free += free_node * kNodes * dt;
    b_len += dt;
    if (trace[i + 1].t_s - bucket_start >= bucket || i + 2 == trace.size()) {
      rows.push_back({Num(bucket_start / 3600.0), Num(b_base / b_len, 6), Num(b_fs / b_len, 6),
                      Num(b_free / b_len, 6), Num(b_scaled / b_len, 6), std::to_string(current)});
      bucket_start = trace[i + 1].t_s;
      b_base = b_fs = b_free = b_scaled = b_len = 0;
    }
  }
  FS_RETURN_IF_ERROR(
      WriteCsv(o.out_dir + "/offline_gcp.csv",
               {"hour", "baseline_tokens_per_s", "failsafe_tokens_per_s", "fault_free_tokens_per_s",
                "fault_scaled_tokens_per_s", "gpus_alive"},
               rows));
  std::vector<std::vector<std::string>> configs;
  for (int n = min_gpus; n <= kGpus; ++n) {
    configs.push_back({std::to_string(n), std::to_string(BaselineTp(n, tp_thr)),
                       Num(base_thr[n], 6), Num(fs_thr[n], 6), fs_choice[n]});
  }
  FS_RETURN_IF_ERROR(WriteCsv(o.out_dir + "/offline_gcp_per_node.csv",
                              {"gpus", "baseline_tp", "baseline_tokens_per_s",
                               "failsafe_tokens_per_s", "failsafe_placement"},
                              configs));
  std::vector<std::vector<std::string>> avail_rows;
  for (const AvailabilityPoint& p : trace) {
    avail_rows.push_back({Num(p.t_s / 3600.0, 6), std::to_string(p.count)});
  }
  FS_RETURN_IF_ERROR(
      WriteCsv(o.out_dir + "/offline_gcp_availability.csv", {"hour", "gpus_alive"}, avail_rows));
  PlotOfflineTimeline(o.out_dir, trace_path, o.model, kNodes * kGpus,
                      {sum_base / span, sum_fs / span, sum_free / span, sum_scaled / span});
  const double seconds = (MonotonicNanos() - wall0) * 1e-9;
  json out{{"failsafe_over_baseline", RatioOrNull(sum_fs, sum_base)},
           {"failsafe_over_fault_scaled", RatioOrNull(sum_fs, sum_scaled)},
           {"baseline_over_fault_scaled", RatioOrNull(sum_base, sum_scaled)},
           {"fault_scaled_over_fault_free", RatioOrNull(sum_scaled, sum_free)},
           {"mean_tokens_per_s",
            {{"baseline", sum_base / span},
             {"failsafe", sum_fs / span},
             {"fault_free", sum_free / span},
             {"fault_scaled", sum_scaled / span}}},
           {"trace_hours", span / 3600},
           {"availability",
            {{"file", trace_path},
             {"format", AvailabilityFormatName(raw.format)},
             {"rows", raw.rows},
             {"rows_reordered", raw.reordered},
             {"peak", raw.peak()},
             {"gpus_per_unit", avail.factor},
             {"cluster_gpus", kNodes * kGpus},
             {"mean_gpus", raw.mean() * avail.factor}}},
           {"node_changes", changes},
           {"failsafe_pause_s", fs_pause},
           {"min_gpus", min_gpus},
           {"mode", o.offline_mode},
           {"switch_delay_s", o.switch_delay_s},
           {"simulation_seconds", seconds}};
  if (o.offline_mode == "step") {
    OfflineTables t{m, hw, trace, masks, reqs, kNodes, kGpus, tp_thr, hybrid_thr, cyclic_thr};
    OfflineStepOptions so;
    so.switch_delay_s = o.switch_delay_s;
    so.skip = o.skip_steady;
    so.period_s = o.step_period_s;
    FS_ASSIGN_OR_RETURN(out["step"], OfflineGcpStep(t, so, o.out_dir));
    out["step"]["over_steady"] = {
        {"baseline",
         RatioOrNull(out["step"]["baseline"]["mean_tokens_per_s"].get<double>(), sum_base / span)},
        {"failsafe",
         RatioOrNull(out["step"]["failsafe"]["mean_tokens_per_s"].get<double>(), sum_fs / span)}};
  }
  return out;
}

}  // namespace failsafe
