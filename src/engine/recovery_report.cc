#include "engine/recovery_report.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

namespace failsafe {

namespace {

double Ms(int64_t from_ns, int64_t to_ns) {
  return from_ns > 0 && to_ns >= from_ns ? (to_ns - from_ns) * 1e-6 : 0;
}

std::string List(const std::vector<int>& v) {
  std::string s;
  for (int d : v) s += (s.empty() ? "" : ",") + std::to_string(d);
  return s;
}

}  // namespace

double RecoveryReport::total_ms() const { return resumed() ? Ms(detected_ns, resumed_ns) : 0; }

double RecoveryReport::stall_ms() const {
  return resumed() ? Ms(failed_ns > 0 ? failed_ns : detected_ns, resumed_ns) : 0;
}

double RecoveryReport::outage_ms() const { return Ms(detected_ns, recovered_ns); }

std::string RecoveryReport::ToText() const {
  std::string who;
  if (!failed_devices.empty()) who += ", failed " + List(failed_devices);
  if (!joined_devices.empty()) who += ", joined " + List(joined_devices);
  if (rebalance) who += ", rebalance for slow devices";
  return fmt::format(
      "recovery ({}{}) stall {:.1f} ms, {:.1f} ms from detection: detect {:.1f}, abort {:.1f}, "
      "replan {:.1f}, group {:.1f}, weights {:.1f} ({:.1f} MiB host, {:.1f} MiB peer), KV restore "
      "{:.1f} ({:.1f} MiB), first step {:.1f}, recompute {:.1f} ({} tokens){}{}",
      RecoveryModeName(mode), who, stall_ms(), total_ms(), detect_ms, abort_ms, replan_ms, group_ms,
      weights_ms, weight_host_bytes / 1048576.0, weight_peer_bytes / 1048576.0, kv_ms,
      kv_restored_bytes / 1048576.0, first_step_ms, recompute_ms, tokens_recomputed,
      attempts > 1 ? fmt::format(", {} attempts", attempts) : "",
      resumed() ? "" : " (not resumed yet)");
}

std::string RecoveryReport::ToJson() const {
  nlohmann::json j = {{"mode", RecoveryModeName(mode)},
                      {"failed_devices", failed_devices},
                      {"joined_devices", joined_devices},
                      {"causes", causes},
                      {"rebalance", rebalance},
                      {"shares", shares},
                      {"attempts", attempts},
                      {"resumed", resumed()},
                      {"stall_ms", stall_ms()},
                      {"total_ms", total_ms()},
                      {"outage_ms", outage_ms()},
                      {"detect_ms", detect_ms},
                      {"abort_ms", abort_ms},
                      {"replan_ms", replan_ms},
                      {"group_ms", group_ms},
                      {"weights_ms", weights_ms},
                      {"kv_restore_ms", kv_ms},
                      {"apply_ms", apply_ms},
                      {"first_step_ms", first_step_ms},
                      {"recompute_ms", recompute_ms},
                      {"weight_host_bytes", weight_host_bytes},
                      {"weight_peer_bytes", weight_peer_bytes},
                      {"kv_restored_bytes", kv_restored_bytes},
                      {"tokens_recomputed", tokens_recomputed},
                      {"finished", finished}};
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace failsafe
