// The paper's experiments, each from one command: `failsafe simulate NAME`.
// offline-gcp and online have files of their own.
#include "sim/experiments.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "common/clock.h"
#include "common/log.h"
#include "common/percentiles.h"
#include "common/rng.h"
#include "sim/cost_model.h"
#include "sim/experiments_internal.h"
#include "sim/report.h"

namespace failsafe {

using nlohmann::json;

namespace {

std::string Path(const ExperimentOptions& o, const std::string& file) {
  return o.out_dir + "/" + file;
}

// Saturated prefill and decode throughput of each system, for the ablation
// and the TP sweep; a system choosing its placement (FailsafeTp) does so per
// phase, and `placements` (optional) gets what it chose: {prefill, decode}.
using Placements = std::map<std::string, std::pair<std::string, std::string>>;
Result<json> Throughputs(const ExperimentOptions& o, const std::vector<SystemSpec>& systems,
                         const char* csv, std::map<std::string, std::pair<double, double>>* out,
                         Placements* placements = nullptr) {
  FS_ASSIGN_OR_RETURN(ModelConfig m, GetModelProfile(o.model));
  FS_ASSIGN_OR_RETURN(HardwareProfile hw, GetHardwareProfile(o.hardware));
  FS_ASSIGN_OR_RETURN(auto reqs, MooncakeRequests(o, 0, o.quick ? 400 : 3000));
  FitToContext(m, &reqs);
  std::vector<std::vector<std::string>> rows;
  for (const SystemSpec& s : systems) {
    double thr[2] = {0, 0};
    std::string chosen[2];
    for (int i = 0; i < 2; ++i) {
      const Phase phase = i == 0 ? Phase::kPrefill : Phase::kDecode;
      const double window = i == 0 ? (o.quick ? 60 : 300) : (o.quick ? 30 : 120);
      SystemSpec run = s;
      if (s.choose_placement) {
        double h = 0, c = 0;
        FS_ASSIGN_OR_RETURN(run, ChoosePlacement(m, hw, s, phase, reqs, window, &h, &c));
        thr[i] = std::max(h, c);
      } else {
        FS_ASSIGN_OR_RETURN(thr[i], ThroughputOrZero(m, hw, s, phase, reqs, window));
      }
      chosen[i] = PolicyName(run.policy);
    }
    (*out)[s.name] = {thr[0], thr[1]};
    if (placements != nullptr) (*placements)[s.name] = {chosen[0], chosen[1]};
    rows.push_back({s.name, Num(thr[0], 6), Num(thr[1], 6), chosen[0], chosen[1]});
    FS_LOG_INFO("{}: prefill {:.0f} tok/s ({}), decode {:.0f} tok/s ({})", s.name, thr[0],
                chosen[0], thr[1], chosen[1]);
  }
  FS_RETURN_IF_ERROR(WriteCsv(Path(o, csv),
                              {"system", "prefill_tokens_per_s", "decode_tokens_per_s",
                               "prefill_placement", "decode_placement"},
                              rows));
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
  PlotBars(Path(o, "ablation.png"), "ablation, " + o.model + ", saturated throughput",
           Path(o, "ablation.csv"),
           {{"prefill", "input tokens/s", {{"prefill", 2}}},
            {"decode", "output tokens/s", {{"decode", 3}}}});
  return j;
}

Result<json> TpSweep(const ExperimentOptions& o) {
  auto of = [](int n) {
    return std::vector<SystemSpec>{NonuniformTp(n), CyclicTp(n), HybridTp(n), FailsafeTp(n)};
  };
  std::vector<SystemSpec> systems = {Tp4()};
  for (int n : {5, 6, 7}) {
    for (const SystemSpec& s : of(n)) systems.push_back(s);
  }
  systems.push_back(Tp8());
  std::map<std::string, std::pair<double, double>> t;
  Placements chosen;
  FS_RETURN_IF_ERROR(Throughputs(o, systems, "tp_sweep.csv", &t, &chosen).status());
  // One row per GPU count, a column per system and phase, for the figure.
  std::vector<std::vector<std::string>> by_n;
  for (int n : {5, 6, 7}) {
    std::vector<std::string> row = {"TP" + std::to_string(n)};
    for (int phase = 0; phase < 2; ++phase) {
      for (const SystemSpec& s : of(n)) {
        const auto& v = t[s.name];
        row.push_back(Num(phase == 0 ? v.first : v.second, 6));
      }
    }
    by_n.push_back(row);
  }
  FS_RETURN_IF_ERROR(WriteCsv(
      Path(o, "tp_sweep_by_gpus.csv"),
      {"gpus", "nonuniform_prefill", "cyclic_prefill", "hybrid_prefill", "failsafe_prefill",
       "nonuniform_decode", "cyclic_decode", "hybrid_decode", "failsafe_decode"},
      by_n));
  PlotBars(Path(o, "tp_sweep.png"), "TP sweep, " + o.model + ", saturated throughput",
           Path(o, "tp_sweep_by_gpus.csv"),
           {{"prefill",
             "input tokens/s",
             {{"nonuniform", 2}, {"cyclic", 3}, {"hybrid", 4}, {"FailSafe", 5}}},
            {"decode",
             "output tokens/s",
             {{"nonuniform", 6}, {"cyclic", 7}, {"hybrid", 8}, {"FailSafe", 9}}}});
  // The paper's figure: every system over TP4 (the fallback on a node with
  // a failed GPU), fault-free TP8 beside them; a row per GPU count.
  const auto& tp4 = t[Tp4().name];
  const auto& tp8 = t[Tp8().name];
  auto over_tp4 = [&](double v, int phase) {
    const double base = phase == 0 ? tp4.first : tp4.second;
    return base > 0 ? Num(v / base, 4) : std::string();
  };
  std::vector<std::vector<std::string>> normalised;
  for (int n = 4; n <= 8; ++n) {
    std::vector<std::string> row = {"TP" + std::to_string(n)};
    for (int phase = 0; phase < 2; ++phase) {
      if (n == 4 || n == 8) {
        const auto& v = n == 4 ? tp4 : tp8;
        row.push_back(over_tp4(phase == 0 ? v.first : v.second, phase));
        for (int k = 0; k < 4; ++k) row.push_back("");
        continue;
      }
      row.push_back("");
      for (const SystemSpec& s : of(n)) {
        const auto& v = t[s.name];
        row.push_back(over_tp4(phase == 0 ? v.first : v.second, phase));
      }
    }
    normalised.push_back(row);
  }
  FS_RETURN_IF_ERROR(
      WriteCsv(Path(o, "tp_sweep_vs_tp4.csv"),
               {"gpus", "standard_prefill", "nonuniform_prefill", "cyclic_prefill",
                "hybrid_prefill", "failsafe_prefill", "standard_decode", "nonuniform_decode",
                "cyclic_decode", "hybrid_decode", "failsafe_decode"},
               normalised));
  // (Where TP4 cannot hold the model every cell is empty: no figure.)
  if (tp4.first > 0 && tp4.second > 0)
    PlotBars(
        Path(o, "tp_sweep_vs_tp4.png"), "TP sweep over TP4, " + o.model + ", saturated",
        Path(o, "tp_sweep_vs_tp4.csv"),
        {{"prefill",
          "input tokens/s over TP4",
          {{"TP4 / TP8", 2}, {"nonuniform", 3}, {"cyclic", 4}, {"hybrid", 5}, {"FailSafe", 6}}},
         {"decode",
          "output tokens/s over TP4",
          {{"TP4 / TP8", 7}, {"nonuniform", 8}, {"cyclic", 9}, {"hybrid", 10}, {"FailSafe", 11}}}});
  json j = json::object();
  j["TP8_over_TP4"] = {{"prefill", RatioOrNull(tp8.first, tp4.first)},
                       {"decode", RatioOrNull(tp8.second, tp4.second)}};
  for (int n : {5, 6, 7}) {
    const auto& nu = t[NonuniformTp(n).name];
    const auto& cy = t[CyclicTp(n).name];
    const auto& hy = t[HybridTp(n).name];
    const auto& fs = t[FailsafeTp(n).name];
    // FailSafe serves each phase with hybrid attention or, where replicating
    // the DP head groups' weights costs more than their balance gains, with
    // cyclic placement alone; each alone is reported beside it.
    const auto& placement = chosen[FailsafeTp(n).name];
    j["TP" + std::to_string(n)] = {{"prefill_gain", RatioOrNull(fs.first, nu.first)},
                                   {"decode_gain", RatioOrNull(fs.second, nu.second)},
                                   {"prefill_placement", placement.first},
                                   {"decode_placement", placement.second},
                                   {"hybrid_prefill_gain", RatioOrNull(hy.first, nu.first)},
                                   {"hybrid_decode_gain", RatioOrNull(hy.second, nu.second)},
                                   {"cyclic_prefill_gain", RatioOrNull(cy.first, nu.first)},
                                   {"cyclic_decode_gain", RatioOrNull(cy.second, nu.second)},
                                   {"prefill_over_tp4", RatioOrNull(fs.first, tp4.first)},
                                   {"decode_over_tp4", RatioOrNull(fs.second, tp4.second)}};
  }
  return j;
}

// The paper's design figures from the plans and the cost model, no
// workload: on 5, 6 and 7 GPUs, per device under nonuniform TP, cyclic
// placement and hybrid attention, its weights, the room left for KV, the KV
// every token costs it, the tokens of KV it can hold, and the attention
// (query heads) every token costs it. Each token's KV lives on every active
// device, so a node holds as many tokens as its fullest device. A hybrid
// device's DP head groups count as 1/n of their KV and attention (each
// sequence's DP heads live on one device, spread by the router).
Result<json> Design(const ExperimentOptions& o) {
  FS_ASSIGN_OR_RETURN(ModelConfig m, GetModelProfile(o.model));
  FS_ASSIGN_OR_RETURN(HardwareProfile hw, GetHardwareProfile(o.hardware));
  constexpr int kBlock = 16, kBatchTokens = 8192;
  const Policy policies[] = {Policy::kNonUniform, Policy::kCyclic, Policy::kHybrid};
  std::vector<std::vector<std::string>> rows, per_device_tp7;
  json j = json::object();
  for (int n : {5, 6, 7}) {
    std::vector<int> alive(n);
    for (int d = 0; d < n; ++d) alive[d] = d;
    json at_n = json::object();
    std::vector<std::vector<double>> kv_kb(n), tokens_k(n);
    for (Policy policy : policies) {
      FS_ASSIGN_OR_RETURN(Plan plan, MakePlan(m, policy, 8, alive));
      const ClusterCostModel cost(plan, m, hw);
      const std::vector<int64_t> pages = cost.KvCapacityPages(kBlock, kBatchTokens);
      const double slot = static_cast<double>(cost.KvBytesPerTokenSlot());
      const double dp_slots = static_cast<double>(plan.num_dp_heads_total()) / n;
      const double dp_queries = dp_slots * m.group_size();
      double node_tokens = 1e300, kv_lo = 1e300, kv_hi = 0, attn_lo = 1e300, attn_hi = 0,
             weights_hi = 0;
      for (int d : plan.active) {
        const double weights = static_cast<double>(cost.WeightBytes(d));
        const double room = static_cast<double>(pages[d]) * cost.PageBytes(kBlock);
        const double per_token = (plan.num_tp_heads_total(d) + dp_slots) * slot;
        const double attention = plan.num_tp_queries_total(d) + dp_queries;
        const double tokens = per_token > 0 ? room / per_token : 0;
        node_tokens = std::min(node_tokens, tokens);
        kv_lo = std::min(kv_lo, per_token);
        kv_hi = std::max(kv_hi, per_token);
        attn_lo = std::min(attn_lo, attention);
        attn_hi = std::max(attn_hi, attention);
        weights_hi = std::max(weights_hi, weights);
        rows.push_back({std::to_string(n), PolicyName(policy), std::to_string(d),
                        Num(weights / 1e9, 5), Num(room / 1e9, 5), Num(per_token / 1e3, 5),
                        Num(tokens, 7), Num(attention, 5)});
        kv_kb[d].push_back(per_token / 1e3);
        tokens_k[d].push_back(tokens / 1e3);
      }
      // Every layer ends in an all-reduce: its attention lasts as long as
      // its busiest device's.
      double layer_hi = 0;
      for (const LayerPlan& lp : plan.layers) {
        for (int d : plan.active) {
          layer_hi =
              std::max(layer_hi, lp.tp_queries[d].size() +
                                     static_cast<double>(lp.dp_heads.size()) * m.group_size() / n);
        }
      }
      at_n[PolicyName(policy)] = {{"node_kv_tokens", node_tokens},
                                  {"kv_per_token_max_over_min", kv_hi / kv_lo},
                                  {"attention_max_over_min", attn_hi / attn_lo},
                                  {"layer_attention_max_over_mean", layer_hi * n / m.num_heads},
                                  {"weights_gb_max", weights_hi / 1e9}};
    }
    auto tokens = [&](Policy p) { return at_n[PolicyName(p)]["node_kv_tokens"].get<double>(); };
    at_n["cyclic_kv_tokens_over_nonuniform"] =
        RatioOrNull(tokens(Policy::kCyclic), tokens(Policy::kNonUniform));
    at_n["hybrid_kv_tokens_over_nonuniform"] =
        RatioOrNull(tokens(Policy::kHybrid), tokens(Policy::kNonUniform));
    j["TP" + std::to_string(n)] = at_n;
    if (n == 7) {
      for (int d = 0; d < n; ++d) {
        std::vector<std::string> row = {"GPU" + std::to_string(d)};
        for (double v : kv_kb[d]) row.push_back(Num(v, 5));
        for (double v : tokens_k[d]) row.push_back(Num(v, 5));
        per_device_tp7.push_back(row);
      }
    }
  }
  FS_RETURN_IF_ERROR(WriteCsv(Path(o, "design.csv"),
                              {"gpus", "placement", "device", "weights_gb", "kv_room_gb",
                               "kv_kb_per_token", "kv_tokens", "query_heads_per_token"},
                              rows));
  FS_RETURN_IF_ERROR(WriteCsv(Path(o, "design_tp7.csv"),
                              {"device", "nonuniform_kv_kb", "cyclic_kv_kb", "hybrid_kv_kb",
                               "nonuniform_tokens_k", "cyclic_tokens_k", "hybrid_tokens_k"},
                              per_device_tp7));
  PlotBars(
      Path(o, "design_tp7.png"), "7 GPUs, " + o.model + ", per device", Path(o, "design_tp7.csv"),
      {{"KV every token costs", "KB per token", {{"nonuniform", 2}, {"cyclic", 3}, {"hybrid", 4}}},
       {"tokens of KV it can hold",
        "thousand tokens",
        {{"nonuniform", 5}, {"cyclic", 6}, {"hybrid", 7}}}});
  return j;
}

// One failure in a TP8 decode instance serving a 500-request window, under
// each recovery mode: latency and the longest gap between tokens per request.
Result<json> Recovery(const ExperimentOptions& o) {
  FS_ASSIGN_OR_RETURN(ModelConfig m, GetModelProfile(o.model));
  FS_ASSIGN_OR_RETURN(HardwareProfile hw, GetHardwareProfile(o.hardware));
  const int n = o.quick ? 120 : 500;
  FS_ASSIGN_OR_RETURN(auto reqs, MooncakeRequests(o, 1000, n));
  const int truncated = FitToContext(m, &reqs);
  if (reqs.size() < 2) return InvalidArgument("recovery needs at least two requests");
  const double t0 = reqs.front().arrival;
  for (auto& r : reqs) {
    r.arrival -= t0;
    r.migrated = true;
  }
  const double fail_at = reqs[reqs.size() / 2].arrival + 0.1;
  json out = json::object();
  std::vector<std::vector<std::string>> rows, cdf_rows;
  std::vector<PlotSeries> series;
  for (RecoveryMode mode : {RecoveryMode::kRecompute, RecoveryMode::kHost, RecoveryMode::kFull,
                            RecoveryMode::kOracle}) {
    FS_ASSIGN_OR_RETURN(auto inst, MakeInstance(m, hw, FailsafeTp(8), mode));
    FS_RETURN_IF_ERROR(ReplayRequests(inst.get(), reqs, false, fail_at, 3));
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

Result<json> RunExperiment(const std::string& name, const ExperimentOptions& o) {
  FS_RETURN_IF_ERROR(MakeDirs(o.out_dir));
  if (name == "ablation") return Ablation(o);
  if (name == "tp-sweep") return TpSweep(o);
  if (name == "design") return Design(o);
  if (name == "online") return Online(o);
  if (name == "recovery") return Recovery(o);
  if (name == "offline-gcp") return OfflineGcp(o);
  if (name == "prefix-cache") return PrefixCache(o);
  if (name == "slow-device") return SlowDevice(o);
  return InvalidArgument(
      "unknown experiment '{}' (known: offline-gcp, online, tp-sweep, design, ablation, "
      "recovery, prefix-cache, slow-device, validate)",
      name);
}

}  // namespace failsafe
