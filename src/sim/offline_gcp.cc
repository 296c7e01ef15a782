// offline-gcp: nodes x GPUs per node (8 x 8) under an availability trace
// (the GCP A100 trace, or --availability FILE scaled to the cluster), an
// OpenThoughts-like offline workload (or --requests FILE's lengths).
//
// Each node runs one instance on its alive GPUs. The throughput of an
// instance on n GPUs comes from a saturated simulation with the engine's
// scheduler (a steady state: the workload is offline and the queue never
// empties); the trace then decides, event by event, how many GPUs each node
// has. When the trace loses or gains GPUs they are taken from or given to
// nodes chosen at random (seeded). A node changing its GPUs pauses: the
// baseline restarts its instance (reloads its weights and recomputes its
// in-flight KV); FailSafe recovers in place (its modelled recovery).
#include <fmt/format.h>
#include <algorithm>
#include <cmath>

#include <map>

#include "common/clock.h"
#include "common/log.h"
#include "common/rng.h"
#include "sim/availability.h"
#include "sim/experiments.h"
#include "sim/experiments_internal.h"
#include "sim/report.h"
#include "trace/workload.h"

namespace failsafe {

using nlohmann::json;

namespace {

// The baseline's TP degree on n GPUs: the largest power of two <= n that
// serves the model (tp_thr > 0), or 0.
int BaselineTp(int n, const std::map<int, double>& tp_thr) {
  int tp = 0;
  for (const auto& [t, thr] : tp_thr) {
    if (t <= n && thr > 0) tp = t;
  }
  return tp;
}

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
  const double window = o.quick ? 60 : 200;
  std::vector<double> base_thr(kGpus + 1, 0), fs_thr(kGpus + 1, 0);
  // Baseline instances: throughput, KV in flight, and prefill speed (to
  // recompute that KV after a restart).
  std::map<int, double> tp_thr, tp_prefill;
  std::map<int, int64_t> tp_inflight;
  for (int tp = 1; tp <= kGpus; tp *= 2) {
    SystemSpec s{"TP" + std::to_string(tp), tp, Policy::kStandard, RouterPolicy::kRoundRobin,
                 PrefillPolicy::kFifo};
    FS_ASSIGN_OR_RETURN(tp_thr[tp],
                        ThroughputOrZero(m, hw, s, Phase::kMixed, reqs, window, &tp_inflight[tp]));
    FS_ASSIGN_OR_RETURN(tp_prefill[tp],
                        ThroughputOrZero(m, hw, s, Phase::kPrefill, reqs, window * 0.25));
  }
  // FailSafe runs each GPU count with the better of its placements: hybrid
  // attention, or cyclic placement alone where replicating the DP head
  // groups' weights costs more than their balance gains.
  std::vector<std::string> fs_choice(kGpus + 1);
  int min_gpus = 0;
  for (int n = 1; n <= kGpus; ++n) {
    for (const SystemSpec& s : {FailsafeTp(n), CyclicTp(n)}) {
      FS_ASSIGN_OR_RETURN(double thr, ThroughputOrZero(m, hw, s, Phase::kMixed, reqs, window));
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
  const double model_bytes = static_cast<double>(m.NumParameters()) * hw.bytes_per_element;
  auto base_pause = [&](int old_tp, int new_tp) {
    if (new_tp == 0) return 0.0;
    const double inflight = old_tp > 0 ? static_cast<double>(tp_inflight[old_tp]) : 0.0;
    return model_bytes / new_tp / hw.pcie_bytes_per_s + inflight / tp_prefill[new_tp];
  };
  double fs_pause = 0;
  {
    FS_ASSIGN_OR_RETURN(auto inst, MakeInstance(m, hw, FailsafeTp(kGpus), RecoveryMode::kFull));
    for (SimRequest r : reqs) {
      r.arrival = 0;
      FS_RETURN_IF_ERROR(inst->Submit(r));
    }
    inst->RunUntil(window * 0.5);
    FS_ASSIGN_OR_RETURN(SimRecovery rec, inst->Fail(kGpus - 1));
    fs_pause = rec.stall_s();
  }
  // Replay the trace: GPUs lost and regained on random nodes.
  Rng rng(HashCombine(o.seed, 0x6c9));
  std::vector<int> alive(kNodes, kGpus);
  std::vector<std::vector<std::string>> rows;
  double sum_base = 0, sum_fs = 0, sum_free = 0, sum_scaled = 0, span = 0;
  int changes = 0;
  const double bucket = 600;  // seconds per row of the timeline
  double bucket_start = 0, b_base = 0, b_fs = 0, b_free = 0, b_scaled = 0, b_len = 0;
  const double free_node = fs_thr[kGpus];
  for (size_t i = 0; i + 1 < trace.size(); ++i) {
    const int target = trace[i].count;  // <= kNodes * kGpus (ScaleAvailability)
    int current = 0;
    for (int a : alive) current += a;
    std::vector<int> before = alive;
    while (current > target) {  // lose a GPU on a random node that has one
      int node;
      do node = static_cast<int>(rng.Below(kNodes));
      while (alive[node] == 0);
      alive[node]--;
      current--;
    }
    while (current < target) {
      int node;
      do node = static_cast<int>(rng.Below(kNodes));
      while (alive[node] == kGpus);
      alive[node]++;
      current++;
    }
    const double dt = trace[i + 1].t_s - trace[i].t_s;
    double base = 0, fs = 0, scaled = 0;
    for (int nd = 0; nd < kNodes; ++nd) {
      const bool changed = alive[nd] != before[nd];
      changes += changed;
      const int old_tp = BaselineTp(before[nd], tp_thr), new_tp = BaselineTp(alive[nd], tp_thr);
      // The baseline restarts when its TP degree changes, or when a GPU it
      // lost was one of its group's rather than a spare (drawn: the lost
      // GPUs are random among the node's alive ones).
      bool restart = old_tp != new_tp;
      for (int k = before[nd]; !restart && k > alive[nd]; --k) {
        restart = rng.Below(static_cast<uint64_t>(k)) < static_cast<uint64_t>(old_tp);
      }
      const double bp = restart ? std::min(dt, base_pause(old_tp, new_tp)) : 0;
      const double fp = changed ? std::min(dt, fs_pause) : 0;
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
  return json{{"failsafe_over_baseline", RatioOrNull(sum_fs, sum_base)},
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
              {"simulation_seconds", seconds}};
}

}  // namespace failsafe
