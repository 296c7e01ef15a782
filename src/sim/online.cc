// online: the first 3,000 requests of the request trace (Mooncake by
// default) at scaled arrival rates, on a prefill instance (P90 TTFT against
// input tokens/s) and a decode instance (P90 time per output token against
// output tokens/s).
//
// The rate is searched, not taken from a fixed grid: it grows until the
// system's P90 crosses the SLO, then the crossing is bracketed by bisection;
// when throughput stops growing before the SLO is crossed, the system is
// reported as never crossing it (its figure at the SLO is then its maximum).
// Beside the paper's baselines (FIFO prefill), the same baselines with the
// adaptive prefill policy are separate rows, so that what placement and
// what the scheduler contribute can be told apart.
#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>

#include "common/log.h"
#include "common/percentiles.h"
#include "sim/experiments.h"
#include "sim/experiments_internal.h"
#include "sim/report.h"

namespace failsafe {

using nlohmann::json;

namespace {

struct SweepPoint {
  double scale = 0;       // arrival rate / the trace's
  double throughput = 0;  // tokens/s
  Percentiles latency;    // TTFT or time per output token, seconds
};

struct Sweep {
  std::vector<SweepPoint> points;   // by increasing scale
  bool serves = true;               // false: the system cannot hold the model or a request
  bool crossed = false;             // P90 above the SLO at some measured rate
  bool misses_at_lightest = false;  // P90 above the SLO at every rate tried
};

// Measures one rate; nullopt when the system cannot serve the workload.
using MaybePoint = std::optional<SweepPoint>;
using Measure = std::function<Result<MaybePoint>(double scale)>;

// Raises the rate from `start` by `factor` until P90 crosses `slo`, then
// bisects (geometrically) the last rate under it and the first over it
// `refine` times, then doubles the rate past the SLO until throughput grows
// by less than 2% (the capacity). Stops without crossing when the best
// throughput has not grown by 1% over the last four rates (the system
// saturates below the SLO) or after `max_points`. When even `start` misses the SLO, lowers the rate
// by `factor` up to eight times.
Result<Sweep> SearchRate(const Measure& measure, double start, double factor, double slo,
                         int refine, int max_points) {
  Sweep s;
  auto add = [&](double scale) -> Result<bool> {
    FS_ASSIGN_OR_RETURN(MaybePoint p, measure(scale));
    if (!p) {
      s.serves = false;
      return false;
    }
    s.points.push_back(*p);
    return true;
  };
  FS_ASSIGN_OR_RETURN(bool ok, add(start));
  if (!ok) return s;
  double lo = 0, hi = 0;  // scales under and over the SLO
  if (s.points.back().latency.p90 > slo) {
    hi = start;
    for (int i = 0; i < 8 && lo == 0; ++i) {
      const double scale = hi / factor;
      FS_RETURN_IF_ERROR(add(scale).status());
      (s.points.back().latency.p90 > slo ? hi : lo) = scale;
    }
    if (lo == 0) s.misses_at_lightest = true;
  } else {
    lo = start;
    double best = s.points.back().throughput;
    int stale = 0;
    while (static_cast<int>(s.points.size()) < max_points) {
      const double scale = lo * factor;
      FS_RETURN_IF_ERROR(add(scale).status());
      const SweepPoint& p = s.points.back();
      if (p.latency.p90 > slo) {
        hi = scale;
        break;
      }
      lo = scale;
      stale = p.throughput > best * 1.01 ? 0 : stale + 1;
      best = std::max(best, p.throughput);
      if (stale >= 4) break;
    }
  }
  s.crossed = hi > 0;
  for (int i = 0; s.crossed && lo > 0 && i < refine; ++i) {
    const double scale = std::sqrt(lo * hi);
    FS_RETURN_IF_ERROR(add(scale).status());
    (s.points.back().latency.p90 > slo ? hi : lo) = scale;
  }
  std::sort(s.points.begin(), s.points.end(),
            [](const SweepPoint& a, const SweepPoint& b) { return a.scale < b.scale; });
  // Past the SLO, double the rate until throughput stops growing: the
  // system's capacity, and the curve's rise.
  if (s.crossed && !s.misses_at_lightest) {
    double scale = s.points.back().scale, best = 0;
    for (const SweepPoint& p : s.points) best = std::max(best, p.throughput);
    for (int extra = 0; extra < 4 && static_cast<int>(s.points.size()) < max_points; ++extra) {
      scale *= 2;
      FS_RETURN_IF_ERROR(add(scale).status());
      const double thr = s.points.back().throughput;
      if (thr < best * 1.02) break;
      best = thr;
    }
  }
  return s;
}

// The throughput at which P90 first crosses `slo`, interpolated linearly
// between the sweep's points (by increasing rate): 0 when even the lightest
// rate misses it, the highest throughput when none does.
double ThroughputAtSlo(const std::vector<SweepPoint>& curve, double slo) {
  double best = 0;
  for (size_t i = 0; i < curve.size(); ++i) {
    const double thr = curve[i].throughput, lat = curve[i].latency.p90;
    if (lat <= slo) {
      best = std::max(best, thr);
      continue;
    }
    if (i == 0) return 0;
    const double thr0 = curve[i - 1].throughput, lat0 = curve[i - 1].latency.p90;
    if (lat0 > slo) return best;
    return std::max(best, thr0 + (thr - thr0) * (slo - lat0) / (lat - lat0));
  }
  return best;
}

// The baseline `s` with the adaptive prefill policy (FailSafe's scheduler).
SystemSpec WithAdaptivePrefill(SystemSpec s) {
  s.name += "+adaptive";
  s.prefill = PrefillPolicy::kAdaptive;
  return s;
}

bool Serves(const Status& st) { return st.code() != StatusCode::kResourceExhausted; }

}  // namespace

Result<json> Online(const ExperimentOptions& o) {
  FS_ASSIGN_OR_RETURN(ModelConfig m, GetModelProfile(o.model));
  FS_ASSIGN_OR_RETURN(HardwareProfile hw, GetHardwareProfile(o.hardware));
  FS_ASSIGN_OR_RETURN(auto reqs, MooncakeRequests(o, 0, o.quick ? 300 : 3000));
  const int truncated = FitToContext(m, &reqs);
  const std::vector<SystemSpec> systems = {Tp4(),
                                           WithAdaptivePrefill(Tp4()),
                                           NonuniformTp(7),
                                           WithAdaptivePrefill(NonuniformTp(7)),
                                           FailsafeTp(7),
                                           Tp8(),
                                           WithAdaptivePrefill(Tp8())};
  const double ttft_slo = o.ttft_slo_s, tbt_slo = o.tbt_slo_s;  // seconds
  const double paper_tbt_slo = 0.040;
  // The SLOs as logs and plots spell them.
  const std::string ttft_slo_text = fmt::format("{:g} s", ttft_slo);
  const std::string tbt_slo_text = fmt::format("{:g} ms", tbt_slo * 1e3);
  // Every request at `scale` times the trace's rate, on a prefill instance
  // (one output token) or a decode instance (the prompt's KV arrives
  // computed), to completion; null when the system cannot serve them.
  auto replay = [&](const SystemSpec& s, double scale,
                    bool prefill) -> Result<std::unique_ptr<SimInstance>> {
    auto made = MakeInstance(m, hw, s, RecoveryMode::kFull);
    if (!made.ok() && !Serves(made.status())) return std::unique_ptr<SimInstance>();
    FS_RETURN_IF_ERROR(made.status());
    auto inst = std::move(*made);
    for (SimRequest r : reqs) {
      r.arrival /= scale;
      if (prefill) {
        r.output = 1;
      } else {
        r.migrated = true;
      }
      inst->RunUntil(r.arrival);
      Status st = inst->Submit(r);
      if (!Serves(st)) return std::unique_ptr<SimInstance>();
      FS_RETURN_IF_ERROR(st);
    }
    inst->RunToCompletion(1e9);
    return inst;
  };
  // Prefill: TTFT against input tokens/s.
  auto prefill_at = [&](const SystemSpec& s) -> Measure {
    return [&, s](double scale) -> Result<MaybePoint> {
      FS_ASSIGN_OR_RETURN(auto inst, replay(s, scale, true));
      if (!inst) return MaybePoint();
      std::vector<double> ttft;
      double input = 0;
      for (const auto& r : inst->results()) {
        if (r.first_token >= 0) ttft.push_back(r.first_token - r.arrival);
        input += r.input;
      }
      return MaybePoint(SweepPoint{scale, input / inst->last_step_end(), ComputePercentiles(ttft)});
    };
  };
  // Decode: time per output token against output tokens/s.
  auto decode_at = [&](const SystemSpec& s) -> Measure {
    return [&, s](double scale) -> Result<MaybePoint> {
      FS_ASSIGN_OR_RETURN(auto inst, replay(s, scale, false));
      if (!inst) return MaybePoint();
      std::vector<double> tbt;
      double out = 0;
      for (const auto& r : inst->results()) {
        if (r.tokens > 1 && r.finish > 0)
          tbt.push_back((r.finish - r.first_token) / (r.tokens - 1));
        out += r.tokens;
      }
      return MaybePoint(SweepPoint{scale, out / inst->last_step_end(), ComputePercentiles(tbt)});
    };
  };
  const int refine = o.quick ? 0 : 3, max_points = o.quick ? 6 : 40;
  std::vector<std::vector<std::string>> pre_rows, dec_rows;
  json best = json::object();
  std::vector<PlotSeries> pre_series, dec_series;
  json placements = json::object();
  for (const SystemSpec& s : systems) {
    // FailSafe's placement for each instance: the better for its phase at
    // saturation (hybrid attention or cyclic placement alone).
    SystemSpec pre_s = s, dec_s = s;
    if (s.choose_placement) {
      FS_ASSIGN_OR_RETURN(pre_s,
                          ChoosePlacement(m, hw, s, Phase::kPrefill, reqs, o.quick ? 60 : 300));
      FS_ASSIGN_OR_RETURN(dec_s,
                          ChoosePlacement(m, hw, s, Phase::kDecode, reqs, o.quick ? 30 : 120));
      placements[s.name] = {{"prefill", PolicyName(pre_s.policy)},
                            {"decode", PolicyName(dec_s.policy)}};
    }
    FS_ASSIGN_OR_RETURN(Sweep pre, SearchRate(prefill_at(pre_s), 0.02, o.quick ? 3 : 1.3, ttft_slo,
                                              refine, max_points));
    Sweep dec;
    if (pre.serves) {
      FS_ASSIGN_OR_RETURN(
          dec, SearchRate(decode_at(dec_s), 0.25, o.quick ? 4 : 1.5, tbt_slo, refine, max_points));
    }
    const bool fits = pre.serves && dec.serves;
    if (!fits) {
      FS_LOG_INFO("{} cannot serve this model and workload", s.name);
      pre.points.clear();
      dec.points.clear();
    }
    std::vector<std::vector<std::string>> a, b;
    for (const SweepPoint& p : pre.points) {
      pre_rows.push_back({s.name, Num(p.scale), Num(p.throughput, 6), Num(p.latency.p50),
                          Num(p.latency.p90), Num(p.latency.p99)});
      a.push_back({Num(p.throughput, 6), Num(p.latency.p90)});
    }
    for (const SweepPoint& p : dec.points) {
      dec_rows.push_back({s.name, Num(p.scale), Num(p.throughput, 6), Num(p.latency.p50 * 1e3),
                          Num(p.latency.p90 * 1e3), Num(p.latency.p99 * 1e3)});
      b.push_back({Num(p.throughput, 6), Num(p.latency.p90 * 1e3)});
    }
    const double best_pre = ThroughputAtSlo(pre.points, ttft_slo);
    const double best_dec = ThroughputAtSlo(dec.points, tbt_slo);
    // Past the crossing the search runs on to the capacity, so the points
    // reach the paper's target too (or show it is never crossed).
    const double paper_dec = ThroughputAtSlo(dec.points, paper_tbt_slo);
    bool paper_crossed = false;
    for (const SweepPoint& p : dec.points) paper_crossed |= p.latency.p90 > paper_tbt_slo;
    double cap_pre = 0, cap_dec = 0;  // the most each sustained at any rate
    for (const SweepPoint& p : pre.points) cap_pre = std::max(cap_pre, p.throughput);
    for (const SweepPoint& p : dec.points) cap_dec = std::max(cap_dec, p.throughput);
    best[s.name] = {{"fits", fits},
                    {"prefill_tokens_per_s_at_ttft_slo", best_pre},
                    {"decode_tokens_per_s_at_tbt_slo", best_dec},
                    {"decode_tokens_per_s_at_40ms", paper_dec},
                    {"tbt_40ms_crossed", fits && paper_crossed},
                    {"prefill_tokens_per_s_max", cap_pre},
                    {"decode_tokens_per_s_max", cap_dec},
                    {"ttft_slo_crossed", fits && pre.crossed},
                    {"tbt_slo_crossed", fits && dec.crossed},
                    {"prefill_rates_tried", pre.points.size()},
                    {"decode_rates_tried", dec.points.size()}};
    for (const auto& [sweep, what] :
         {std::pair{&pre, "P90 TTFT " + ttft_slo_text}, {&dec, "P90 TPOT " + tbt_slo_text}}) {
      if (!fits) break;
      if (sweep->misses_at_lightest) {
        FS_LOG_WARN("{} misses {} even at the lightest rate tried", s.name, what);
      } else if (!sweep->crossed) {
        FS_LOG_WARN(
            "{} never crosses {}: its throughput saturates first; its figure at the SLO "
            "is its maximum",
            s.name, what);
      }
    }
    FS_LOG_INFO("{}: prefill {:.0f} tok/s at P90 TTFT <= {}, decode {:.0f} tok/s at P90 TPOT <= {}",
                s.name, best_pre, ttft_slo_text, best_dec, tbt_slo_text);
    // One CSV per system for the curves.
    const std::string pre_csv = o.out_dir + "/online_prefill_" + s.name + ".csv";
    const std::string dec_csv = o.out_dir + "/online_decode_" + s.name + ".csv";
    FS_RETURN_IF_ERROR(WriteCsv(pre_csv, {"throughput", "p90"}, a));
    FS_RETURN_IF_ERROR(WriteCsv(dec_csv, {"throughput", "p90"}, b));
    if (fits) {
      pre_series.push_back({s.name, pre_csv, 1, 2});
      dec_series.push_back({s.name, dec_csv, 1, 2});
    }
  }
  FS_RETURN_IF_ERROR(WriteCsv(
      o.out_dir + "/online_prefill.csv",
      {"system", "rate_scale", "input_tokens_per_s", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s"},
      pre_rows));
  FS_RETURN_IF_ERROR(WriteCsv(
      o.out_dir + "/online_decode.csv",
      {"system", "rate_scale", "output_tokens_per_s", "tpot_p50_ms", "tpot_p90_ms", "tpot_p99_ms"},
      dec_rows));
  PlotPng(o.out_dir + "/online_prefill.png", "prefill: P90 TTFT vs input throughput, " + o.model,
          "input tokens/s", "P90 TTFT (s)", pre_series, false, true,
          {{"SLO: P90 TTFT " + ttft_slo_text, ttft_slo}});
  PlotPng(o.out_dir + "/online_decode.png",
          "decode: P90 time per output token vs output throughput, " + o.model, "output tokens/s",
          "P90 TPOT (ms)", dec_series, false, false,
          {{"SLO: P90 TPOT " + tbt_slo_text, tbt_slo * 1e3},
           {"the paper's 40 ms", paper_tbt_slo * 1e3}});
  auto ratio = [&](const std::string& a, const std::string& b, const char* key) {
    return RatioOrNull(best[a][key].get<double>(), best[b][key].get<double>());
  };
  const char* at_pre = "prefill_tokens_per_s_at_ttft_slo";
  const char* at_dec = "decode_tokens_per_s_at_tbt_slo";
  return json{
      {"ttft_slo_s", ttft_slo},
      {"tbt_slo_ms", tbt_slo * 1e3},
      {"at_slo", best},
      {"failsafe_placement", placements},
      {"prompts_truncated", truncated},
      {"prefill_failsafe_over_tp4", ratio("failsafe-TP7", "TP4", at_pre)},
      {"prefill_failsafe_over_nonuniform", ratio("failsafe-TP7", "nonuniform-TP7", at_pre)},
      {"prefill_failsafe_over_nonuniform_adaptive",
       ratio("failsafe-TP7", "nonuniform-TP7+adaptive", at_pre)},
      {"prefill_failsafe_over_tp8", ratio("failsafe-TP7", "TP8", at_pre)},
      {"prefill_failsafe_over_tp8_adaptive", ratio("failsafe-TP7", "TP8+adaptive", at_pre)},
      {"decode_failsafe_over_tp4", ratio("failsafe-TP7", "TP4", at_dec)},
      {"decode_failsafe_over_tp8", ratio("failsafe-TP7", "TP8", at_dec)},
      {"decode_40ms_failsafe_over_nonuniform",
       ratio("failsafe-TP7", "nonuniform-TP7", "decode_tokens_per_s_at_40ms")},
      {"decode_failsafe_over_nonuniform", ratio("failsafe-TP7", "nonuniform-TP7", at_dec)},
      {"decode_failsafe_over_nonuniform_adaptive",
       ratio("failsafe-TP7", "nonuniform-TP7+adaptive", at_dec)},
      {"prefill_max_failsafe_over_nonuniform",
       ratio("failsafe-TP7", "nonuniform-TP7", "prefill_tokens_per_s_max")},
      {"decode_max_failsafe_over_nonuniform",
       ratio("failsafe-TP7", "nonuniform-TP7", "decode_tokens_per_s_max")},
      {"prefill_max_failsafe_over_tp4", ratio("failsafe-TP7", "TP4", "prefill_tokens_per_s_max")},
      {"decode_max_failsafe_over_tp4", ratio("failsafe-TP7", "TP4", "decode_tokens_per_s_max")}};
}

}  // namespace failsafe
