// `failsafe simulate prefix-cache`: the Mooncake conversation trace with the
// prefix cache off and on (block hit rate, throughput, TTFT, recovery with
// shared prefixes), and the router's trade-off between a prefix hit on one
// DP rank and load balance.
#include <algorithm>

#include "common/log.h"
#include "common/percentiles.h"
#include "sim/experiments_internal.h"
#include "sim/report.h"

namespace failsafe {

using nlohmann::json;

namespace {

struct CacheRun {
  PrefixCacheStats prefix;
  double tokens_per_s = 0;  // prompt + output tokens over the makespan
  Percentiles ttft_s;
  int64_t prompt_tokens_computed = 0;
  double recovery_ms = 0;  // 0: no failure injected
  int64_t tokens_recomputed = 0;
};

// Replays `reqs` at their arrival times (all at 0 when `offline`) on `spec`;
// with `fail_at` >= 0 device 3 fails then.
Result<CacheRun> Replay(const ModelConfig& m, const HardwareProfile& hw, const SystemSpec& spec,
                        const std::vector<SimRequest>& reqs, bool offline, double fail_at) {
  FS_ASSIGN_OR_RETURN(auto inst, MakeInstance(m, hw, spec, RecoveryMode::kFull));
  FS_RETURN_IF_ERROR(ReplayRequests(inst.get(), reqs, offline, fail_at, 3));
  int64_t tokens = 0;
  for (const SimRequest& r : reqs) tokens += r.input + r.output;
  CacheRun out;
  out.prefix = inst->scheduler().prefix_cache_stats();
  out.tokens_per_s = tokens / std::max(1e-9, inst->last_step_end());
  std::vector<double> ttft;
  for (const auto& r : inst->results()) {
    if (r.first_token >= 0) ttft.push_back(r.first_token - r.arrival);
  }
  out.ttft_s = ComputePercentiles(ttft);
  out.prompt_tokens_computed = inst->tokens_in();
  if (!inst->recoveries().empty()) {
    out.recovery_ms = inst->recoveries().front().total_s() * 1e3;
    out.tokens_recomputed = inst->recoveries().front().tokens_recomputed;
  }
  return out;
}

json ToJson(const CacheRun& r) {
  return {{"block_hit_rate", r.prefix.hit_rate()},
          {"blocks_looked_up", r.prefix.lookup_blocks},
          {"blocks_hit", r.prefix.hit_blocks},
          {"host_blocks_hit", r.prefix.host_hit_blocks},
          {"host_block_hit_rate", r.prefix.host_hit_rate()},
          {"prompt_tokens_saved", r.prefix.hit_tokens},
          {"preempted_tokens_saved", r.prefix.readmitted_hit_tokens},
          {"prompt_tokens_computed", r.prompt_tokens_computed},
          {"evicted_blocks", r.prefix.evicted_blocks},
          {"tokens_per_s", r.tokens_per_s},
          {"ttft_mean_s", r.ttft_s.mean},
          {"ttft_p50_s", r.ttft_s.p50},
          {"ttft_p90_s", r.ttft_s.p90},
          {"recovery_ms", r.recovery_ms},
          {"tokens_recomputed", r.tokens_recomputed}};
}

std::vector<std::string> Row(const std::string& name, const std::string& mode, const CacheRun& r) {
  return {name,
          mode,
          Num(r.prefix.hit_rate()),
          Num(r.prefix.host_hit_rate()),
          std::to_string(r.prefix.hit_tokens),
          std::to_string(r.prefix.host_hit_tokens),
          std::to_string(r.prefix.readmitted_hit_tokens),
          std::to_string(r.prompt_tokens_computed),
          Num(r.tokens_per_s, 6),
          Num(r.ttft_s.mean),
          Num(r.ttft_s.p50),
          Num(r.ttft_s.p90),
          Num(r.recovery_ms),
          std::to_string(r.tokens_recomputed)};
}

}  // namespace

Result<json> PrefixCache(const ExperimentOptions& o) {
  FS_ASSIGN_OR_RETURN(ModelConfig m, GetModelProfile(o.model));
  FS_ASSIGN_OR_RETURN(HardwareProfile hw, GetHardwareProfile(o.hardware));
  FS_ASSIGN_OR_RETURN(auto reqs, MooncakeRequests(o, 0, o.quick ? 200 : 1000));
  const int truncated = FitToContext(m, &reqs);
  if (reqs.size() < 2) return InvalidArgument("prefix-cache needs at least two requests");
  const double t0 = reqs.front().arrival;
  for (auto& r : reqs) r.arrival -= t0;
  const double fail_at = reqs[reqs.size() / 2].arrival + 0.1;
  json out = json::object();
  std::vector<std::vector<std::string>> rows;
  // Caching off, on (device memory only), and on with the host tier, on all
  // eight devices (no DP heads) and on seven (hybrid: a DP head, so device
  // hits depend on the DP rank; host hits do not). The host tier's backup
  // gets the node's host memory for it (HardwareProfile::host_backup_bytes).
  enum class Tier { kOff, kDevice, kHost };
  for (int devices : {8, 7}) {
    for (Tier tier : {Tier::kOff, Tier::kDevice, Tier::kHost}) {
      SystemSpec s = FailsafeTp(devices);
      s.prefix_cache = tier != Tier::kOff;
      s.prefix_cache_host = tier == Tier::kHost;
      if (tier == Tier::kHost) s.backup_bytes = hw.host_backup_bytes;
      const std::string name = s.name + (tier == Tier::kOff      ? " cache off"
                                         : tier == Tier::kDevice ? " cache on"
                                                                 : " cache on + host");
      FS_ASSIGN_OR_RETURN(CacheRun offline, Replay(m, hw, s, reqs, true, -1));
      FS_ASSIGN_OR_RETURN(CacheRun online, Replay(m, hw, s, reqs, false, -1));
      FS_ASSIGN_OR_RETURN(CacheRun failure, Replay(m, hw, s, reqs, false, fail_at));
      rows.push_back(Row(name, "offline", offline));
      rows.push_back(Row(name, "online", online));
      rows.push_back(Row(name, "online-device-3-fails", failure));
      out[name] = {
          {"offline", ToJson(offline)}, {"online", ToJson(online)}, {"failure", ToJson(failure)}};
      FS_LOG_INFO(
          "{}: hit rate {:.3f}, offline {:.0f} tok/s, online TTFT p50 {:.3f} s, recovery "
          "{:.0f} ms",
          name, online.prefix.hit_rate(), offline.tokens_per_s, online.ttft_s.p50,
          failure.recovery_ms);
    }
  }
  // The router's trade-off with DP heads: load only (bound 0), the default
  // bound, and hits whatever the load.
  for (int64_t bound : {int64_t{0}, SchedulerConfig().prefix_affinity_tokens, int64_t{1} << 40}) {
    SystemSpec s = FailsafeTp(7);
    s.prefix_cache = true;
    s.prefix_affinity_tokens = bound;
    const std::string name =
        fmt::format("{} cache on affinity-bound {}", s.name,
                    bound >= (int64_t{1} << 40) ? std::string("none") : std::to_string(bound));
    FS_ASSIGN_OR_RETURN(CacheRun offline, Replay(m, hw, s, reqs, true, -1));
    FS_ASSIGN_OR_RETURN(CacheRun online, Replay(m, hw, s, reqs, false, -1));
    rows.push_back(Row(name, "offline", offline));
    rows.push_back(Row(name, "online", online));
    out[name] = {{"offline", ToJson(offline)}, {"online", ToJson(online)}};
  }
  FS_RETURN_IF_ERROR(
      WriteCsv(o.out_dir + "/prefix_cache.csv",
               {"system", "arrivals", "block_hit_rate", "host_block_hit_rate",
                "prompt_tokens_saved", "host_prompt_tokens_saved", "preempted_tokens_saved",
                "prompt_tokens_computed", "tokens_per_s", "ttft_mean_s", "ttft_p50_s", "ttft_p90_s",
                "recovery_ms", "tokens_recomputed"},
               rows));
  out["requests"] = reqs.size();
  out["prompts_truncated"] = truncated;
  return out;
}

}  // namespace failsafe
