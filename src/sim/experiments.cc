// The paper's experiments, each from one command: `failsafe simulate NAME`.
#include "sim/experiments.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "common/clock.h"
#include "common/log.h"
#include "common/percentiles.h"
#include "common/rng.h"
#include "sim/experiments_internal.h"
#include "sim/report.h"

namespace failsafe {

using nlohmann::json;

namespace {

std::string Path(const ExperimentOptions& o, const std::string& file) {
  return o.out_dir + "/" + file;
}

// Saturated prefill and decode throughput of each system, for the ablation
// and the TP sweep.
Result<json> Throughputs(const ExperimentOptions& o, const std::vector<SystemSpec>& systems,
                         const char* csv, std::map<std::string, std::pair<double, double>>* out) {
  FS_ASSIGN_OR_RETURN(ModelConfig m, GetModelProfile(o.model));
  FS_ASSIGN_OR_RETURN(HardwareProfile hw, GetHardwareProfile(o.hardware));
  FS_ASSIGN_OR_RETURN(auto reqs, MooncakeRequests(o, 0, o.quick ? 400 : 3000));
  FitToContext(m, &reqs);
  std::vector<std::vector<std::string>> rows;
  for (const SystemSpec& s : systems) {
    FS_ASSIGN_OR_RETURN(double pre,
                        ThroughputOrZero(m, hw, s, Phase::kPrefill, reqs, o.quick ? 60 : 300));
    FS_ASSIGN_OR_RETURN(double dec,
                        ThroughputOrZero(m, hw, s, Phase::kDecode, reqs, o.quick ? 30 : 120));
    (*out)[s.name] = {pre, dec};
    rows.push_back({s.name, Num(pre, 6), Num(dec, 6)});
    FS_LOG_INFO("{}: prefill {:.0f} tok/s, decode {:.0f} tok/s", s.name, pre, dec);
  }
  FS_RETURN_IF_ERROR(
      WriteCsv(Path(o, csv), {"system", "prefill_tokens_per_s", "decode_tokens_per_s"}, rows));
  return json::object();
}

Result<json> Ablation(const ExperimentOptions& o) {
  std::map<std::string, std::pair<double, double>> t;
  FS_RETURN_IF_ERROR(Throughputs(o, {Tp4(), NonuniformTp(7), CyclicTp(7), FailsafeTp(7), Tp8()},
                                 "ablation.csv", &t)
                         .status());
  const auto& tp4 = t["TP4"];
  const auto& nu = t["nonuniform-TP7"];
  const auto& cy = t["cyclic-TP7"];
  const auto& fs = t["failsafe-TP7"];
  // Ratios are null where the denominator cannot serve the model (TP4 for
  // Mixtral-8x22B in bf16).
  json j = {{"prefill_vs_tp4",
             {{"nonuniform", RatioOrNull(nu.first, tp4.first)},
              {"cyclic", RatioOrNull(cy.first, tp4.first)},
              {"failsafe", RatioOrNull(fs.first, tp4.first)},
              {"tp8", RatioOrNull(t["TP8"].first, tp4.first)}}},
            {"decode_vs_tp4",
             {{"nonuniform", RatioOrNull(nu.second, tp4.second)},
              {"cyclic", RatioOrNull(cy.second, tp4.second)},
              {"failsafe", RatioOrNull(fs.second, tp4.second)},
              {"tp8", RatioOrNull(t["TP8"].second, tp4.second)}}},
            {"memory_balancing_decode_gain", RatioOrNull(cy.second, nu.second)},
            {"compute_balancing_decode_gain", RatioOrNull(fs.second, cy.second)},
            {"compute_balancing_prefill_gain", RatioOrNull(fs.first, cy.first)},
            {"memory_balancing_prefill_gain", RatioOrNull(cy.first, nu.first)}};
  PlotPng(Path(o, "ablation.png"), "ablation, " + o.model + " (tokens/s)",
          "system (1 TP4, 2 nonuniform, 3 cyclic, 4 FailSafe, 5 TP8)", "tokens/s",
          {{"prefill (input)", Path(o, "ablation.csv"), 0, 2, "linespoints"},
           {"decode (output)", Path(o, "ablation.csv"), 0, 3, "linespoints"}});
  return j;
}

Result<json> TpSweep(const ExperimentOptions& o) {
  std::vector<SystemSpec> systems;
  for (int n : {5, 6, 7}) {
    systems.push_back(NonuniformTp(n));
    systems.push_back(CyclicTp(n));
    systems.push_back(FailsafeTp(n));
  }
  std::map<std::string, std::pair<double, double>> t;
  FS_RETURN_IF_ERROR(Throughputs(o, systems, "tp_sweep.csv", &t).status());
  json j = json::object();
  for (int n : {5, 6, 7}) {
    const auto& nu = t[NonuniformTp(n).name];
    const auto& cy = t[CyclicTp(n).name];
    const auto& fs = t[FailsafeTp(n).name];
    // Hybrid attention replicates the DP head groups' weights on every
    // device; where that costs more than it balances, cyclic placement alone
    // is the better FailSafe configuration, so both are reported.
    j["TP" + std::to_string(n)] = {
        {"prefill_gain", RatioOrNull(fs.first, nu.first)},
        {"decode_gain", RatioOrNull(fs.second, nu.second)},
        {"cyclic_prefill_gain", RatioOrNull(cy.first, nu.first)},
        {"cyclic_decode_gain", RatioOrNull(cy.second, nu.second)},
        {"best_prefill_gain", RatioOrNull(std::max(fs.first, cy.first), nu.first)},
        {"best_decode_gain", RatioOrNull(std::max(fs.second, cy.second), nu.second)}};
  }
  return j;
}

// The throughput at which a latency curve (points by increasing load) first
// crosses `slo`, interpolated linearly between the sweep's points: 0 when
// even the lightest load misses it, the highest throughput when none does.
double ThroughputAtSlo(const std::vector<std::pair<double, double>>& curve, double slo) {
  double best = 0;
  for (size_t i = 0; i < curve.size(); ++i) {
    const auto [thr, lat] = curve[i];
    if (lat <= slo) {
      best = std::max(best, thr);
      continue;
    }
    if (i == 0) return 0;
    const auto [thr0, lat0] = curve[i - 1];
    if (lat0 > slo) return best;
    return std::max(best, thr0 + (thr - thr0) * (slo - lat0) / (lat - lat0));
  }
  return best;
}

// Online serving: the first 3,000 Mooncake requests at scaled rates, on a
// prefill instance (TTFT) and a decode instance (time between tokens).
Result<json> Online(const ExperimentOptions& o) {
  FS_ASSIGN_OR_RETURN(ModelConfig m, GetModelProfile(o.model));
  FS_ASSIGN_OR_RETURN(HardwareProfile hw, GetHardwareProfile(o.hardware));
  FS_ASSIGN_OR_RETURN(auto reqs, MooncakeRequests(o, 0, o.quick ? 300 : 3000));
  const int truncated = FitToContext(m, &reqs);
  const std::vector<SystemSpec> systems = {Tp4(), NonuniformTp(7), FailsafeTp(7), Tp8()};
  // Rate scales (1 = the trace's own arrival rate), from light load to past
  // saturation.
  const std::vector<double> prefill_scales =
      o.quick ? std::vector<double>{0.05, 0.2, 0.6}
              : std::vector<double>{0.02, 0.04, 0.06, 0.08, 0.1, 0.12, 0.15, 0.2,  0.25,
                                    0.3,  0.35, 0.4,  0.5,  0.6, 0.8,  1.0,  1.25, 1.5};
  const std::vector<double> decode_scales =
      o.quick ? std::vector<double>{0.5, 4}
              : std::vector<double>{0.25, 0.5, 0.75, 1, 1.25, 1.5, 2, 3, 4, 6};
  const double ttft_slo = 10.0, tbt_slo = 0.040;
  std::vector<std::vector<std::string>> pre_rows, dec_rows;
  json best = json::object();
  for (const SystemSpec& s : systems) {
    std::vector<std::pair<double, double>> pre_curve, dec_curve;  // (throughput, P90)
    // A system that cannot hold the model or one of the requests serves none.
    auto serves = [](const Status& st) { return st.code() != StatusCode::kResourceExhausted; };
    bool fits = true;
    for (double scale : prefill_scales) {
      auto made = MakeInstance(m, hw, s, RecoveryMode::kFull);
      if (!made.ok() && !serves(made.status())) fits = false;
      if (!fits) break;
      FS_RETURN_IF_ERROR(made.status());
      auto inst = std::move(*made);
      size_t next = 0;
      while (next < reqs.size() && fits) {
        SimRequest r = reqs[next++];
        r.arrival /= scale;
        r.output = 1;
        inst->RunUntil(r.arrival);
        Status st = inst->Submit(r);
        if (!serves(st))
          fits = false;
        else
          FS_RETURN_IF_ERROR(st);
      }
      if (!fits) break;
      inst->RunToCompletion(1e9);
      std::vector<double> ttft;
      double input = 0;
      for (const auto& r : inst->results()) {
        if (r.first_token >= 0) ttft.push_back(r.first_token - r.arrival);
        input += r.input;
      }
      const Percentiles p = ComputePercentiles(ttft);
      const double thr = input / inst->last_step_end();
      pre_rows.push_back({s.name, Num(scale), Num(thr, 6), Num(p.p50), Num(p.p90), Num(p.p99)});
      pre_curve.push_back({thr, p.p90});
    }
    for (double scale : decode_scales) {
      if (!fits) break;
      FS_ASSIGN_OR_RETURN(auto inst, MakeInstance(m, hw, s, RecoveryMode::kFull));
      size_t next = 0;
      while (next < reqs.size()) {
        SimRequest r = reqs[next++];
        r.arrival /= scale;
        r.migrated = true;
        inst->RunUntil(r.arrival);
        FS_RETURN_IF_ERROR(inst->Submit(r));
      }
      inst->RunToCompletion(1e9);
      std::vector<double> tbt;
      double out = 0;
      for (const auto& r : inst->results()) {
        if (r.tokens > 1 && r.finish > 0)
          tbt.push_back((r.finish - r.first_token) / (r.tokens - 1));
        out += r.tokens;
      }
      const Percentiles p = ComputePercentiles(tbt);
      const double thr = out / inst->last_step_end();
      dec_rows.push_back(
          {s.name, Num(scale), Num(thr, 6), Num(p.p50 * 1e3), Num(p.p90 * 1e3), Num(p.p99 * 1e3)});
      dec_curve.push_back({thr, p.p90});
    }
    if (!fits) {
      FS_LOG_INFO("{} cannot serve this model and workload", s.name);
      pre_curve.clear();
      dec_curve.clear();
    }
    const double best_pre = ThroughputAtSlo(pre_curve, ttft_slo);
    const double best_dec = ThroughputAtSlo(dec_curve, tbt_slo);
    double cap_pre = 0, cap_dec = 0;  // the most each sustained at any rate
    for (auto [thr, lat] : pre_curve) cap_pre = std::max(cap_pre, thr);
    for (auto [thr, lat] : dec_curve) cap_dec = std::max(cap_dec, thr);
    best[s.name] = {{"fits", fits},
                    {"prefill_tokens_per_s_at_ttft_slo", best_pre},
                    {"decode_tokens_per_s_at_tbt_slo", best_dec},
                    {"prefill_tokens_per_s_max", cap_pre},
                    {"decode_tokens_per_s_max", cap_dec}};
    FS_LOG_INFO(
        "{}: prefill {:.0f} tok/s at P90 TTFT <= 10 s, decode {:.0f} tok/s at P90 TPOT <= 40 ms",
        s.name, best_pre, best_dec);
  }
  FS_RETURN_IF_ERROR(WriteCsv(
      Path(o, "online_prefill.csv"),
      {"system", "rate_scale", "input_tokens_per_s", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s"},
      pre_rows));
  FS_RETURN_IF_ERROR(WriteCsv(
      Path(o, "online_decode.csv"),
      {"system", "rate_scale", "output_tokens_per_s", "tpot_p50_ms", "tpot_p90_ms", "tpot_p99_ms"},
      dec_rows));
  // One CSV per system for the curves.
  std::vector<PlotSeries> pre_series, dec_series;
  for (const SystemSpec& s : systems) {
    std::vector<std::vector<std::string>> a, b;
    for (auto& r : pre_rows) {
      if (r[0] == s.name) a.push_back({r[2], r[4]});
    }
    for (auto& r : dec_rows) {
      if (r[0] == s.name) b.push_back({r[2], r[4]});
    }
    FS_RETURN_IF_ERROR(
        WriteCsv(Path(o, "online_prefill_" + s.name + ".csv"), {"throughput", "p90"}, a));
    FS_RETURN_IF_ERROR(
        WriteCsv(Path(o, "online_decode_" + s.name + ".csv"), {"throughput", "p90"}, b));
    pre_series.push_back({s.name, Path(o, "online_prefill_" + s.name + ".csv"), 1, 2});
    dec_series.push_back({s.name, Path(o, "online_decode_" + s.name + ".csv"), 1, 2});
  }
  PlotPng(Path(o, "online_prefill.png"), "prefill: P90 TTFT vs input throughput, " + o.model,
          "input tokens/s", "P90 TTFT (s)", pre_series, false, true);
  PlotPng(Path(o, "online_decode.png"),
          "decode: P90 time per output token vs output throughput, " + o.model, "output tokens/s",
          "P90 TPOT (ms)", dec_series);
  auto ratio = [&](const std::string& a, const std::string& b, const char* key) {
    return RatioOrNull(best[a][key].get<double>(), best[b][key].get<double>());
  };
  return json{
      {"at_slo", best},
      {"prompts_truncated", truncated},
      {"prefill_failsafe_over_tp4",
       ratio("failsafe-TP7", "TP4", "prefill_tokens_per_s_at_ttft_slo")},
      {"prefill_failsafe_over_nonuniform",
       ratio("failsafe-TP7", "nonuniform-TP7", "prefill_tokens_per_s_at_ttft_slo")},
      {"decode_failsafe_over_tp4", ratio("failsafe-TP7", "TP4", "decode_tokens_per_s_at_tbt_slo")},
      {"decode_failsafe_over_nonuniform",
       ratio("failsafe-TP7", "nonuniform-TP7", "decode_tokens_per_s_at_tbt_slo")},
      {"prefill_max_failsafe_over_nonuniform",
       ratio("failsafe-TP7", "nonuniform-TP7", "prefill_tokens_per_s_max")},
      {"decode_max_failsafe_over_nonuniform",
       ratio("failsafe-TP7", "nonuniform-TP7", "decode_tokens_per_s_max")},
      {"prefill_max_failsafe_over_tp4", ratio("failsafe-TP7", "TP4", "prefill_tokens_per_s_max")},
      {"decode_max_failsafe_over_tp4", ratio("failsafe-TP7", "TP4", "decode_tokens_per_s_max")}};
}

// One failure in a TP8 decode instance serving a 500-request window, under
// each recovery mode: latency and the longest gap between tokens per request.
Result<json> Recovery(const ExperimentOptions& o) {
  FS_ASSIGN_OR_RETURN(ModelConfig m, GetModelProfile(o.model));
  FS_ASSIGN_OR_RETURN(HardwareProfile hw, GetHardwareProfile(o.hardware));
  const int n = o.quick ? 120 : 500;
  FS_ASSIGN_OR_RETURN(auto reqs, MooncakeRequests(o, 1000, n));
  const int truncated = FitToContext(m, &reqs);
  const double t0 = reqs.front().arrival;
  for (auto& r : reqs) {
    r.arrival -= t0;
    r.migrated = true;
  }
  const double fail_at = reqs[n / 2].arrival + 0.1;
  json out = json::object();
  std::vector<std::vector<std::string>> rows, cdf_rows;
  std::vector<PlotSeries> series;
  for (RecoveryMode mode : {RecoveryMode::kRecompute, RecoveryMode::kHost, RecoveryMode::kFull,
                            RecoveryMode::kOracle}) {
    FS_ASSIGN_OR_RETURN(auto inst, MakeInstance(m, hw, FailsafeTp(8), mode));
    bool failed = false;
    for (const SimRequest& r : reqs) {
      if (!failed && r.arrival > fail_at) {
        inst->RunUntil(fail_at);
        FS_RETURN_IF_ERROR(inst->Fail(3).status());
        failed = true;
      }
      inst->RunUntil(r.arrival);
      FS_RETURN_IF_ERROR(inst->Submit(r));
    }
    inst->RunToCompletion(1e9);
    const SimRecovery& rec = inst->recoveries().front();
    std::vector<double> max_tbt;
    for (const auto& r : inst->results()) {
      if (r.tokens > 1) max_tbt.push_back(r.max_tbt * 1e3);
    }
    const Percentiles p = ComputePercentiles(max_tbt);
    const std::string name = RecoveryModeName(mode);
    rows.push_back({name, Num(rec.total_s() * 1e3), Num(rec.detect_s * 1e3),
                    Num(rec.weights_s * 1e3), Num(rec.kv_s * 1e3), Num(rec.recompute_s * 1e3),
                    std::to_string(rec.tokens_recomputed), Num(p.p90), Num(p.p99)});
    out[name] = {{"latency_ms", rec.total_s() * 1e3},
                 {"weights_ms", rec.weights_s * 1e3},
                 {"kv_restore_ms", rec.kv_s * 1e3},
                 {"recompute_ms", rec.recompute_s * 1e3},
                 {"tokens_recomputed", rec.tokens_recomputed},
                 {"max_tbt_p90_ms", p.p90},
                 {"max_tbt_p99_ms", p.p99}};
    std::sort(max_tbt.begin(), max_tbt.end());
    std::vector<std::vector<std::string>> cdf;
    for (size_t i = 0; i < max_tbt.size(); ++i) {
      cdf.push_back({Num(max_tbt[i]), Num((i + 1.0) / max_tbt.size())});
    }
    FS_RETURN_IF_ERROR(
        WriteCsv(Path(o, "recovery_tbt_cdf_" + name + ".csv"), {"max_tbt_ms", "cdf"}, cdf));
    series.push_back({name, Path(o, "recovery_tbt_cdf_" + name + ".csv"), 1, 2, "lines"});
  }
  FS_RETURN_IF_ERROR(
      WriteCsv(Path(o, "recovery.csv"),
               {"mode", "latency_ms", "detect_ms", "weights_ms", "kv_restore_ms", "recompute_ms",
                "tokens_recomputed", "max_tbt_p90_ms", "max_tbt_p99_ms"},
               rows));
  PlotPng(Path(o, "recovery_tbt_cdf.png"),
          "max time between tokens per request, one failure, " + o.model, "max TBT (ms)", "CDF",
          series, true);
  const double rc = out["recompute"]["latency_ms"], full = out["full"]["latency_ms"],
               host = out["host"]["latency_ms"];
  out["prompts_truncated"] = truncated;
  out["full_speedup_over_recompute"] = rc / full;
  out["host_speedup_over_recompute"] = rc / host;
  return out;
}

}  // namespace

Result<json> OfflineGcp(const ExperimentOptions& o);

Result<json> RunExperiment(const std::string& name, const ExperimentOptions& o) {
  ::mkdir(o.out_dir.c_str(), 0755);
  if (name == "ablation") return Ablation(o);
  if (name == "tp-sweep") return TpSweep(o);
  if (name == "online") return Online(o);
  if (name == "recovery") return Recovery(o);
  if (name == "offline-gcp") return OfflineGcp(o);
  return InvalidArgument(
      "unknown experiment '{}' (known: offline-gcp, online, tp-sweep, ablation, recovery, "
      "validate)",
      name);
}

}  // namespace failsafe
