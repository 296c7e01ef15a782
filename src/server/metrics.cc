#include "server/metrics.h"

#include <fmt/format.h>

namespace failsafe {
namespace {

// A Prometheus label value: backslash, double quote and newline escaped.
std::string EscapeLabel(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

}  // namespace

void Histogram::Observe(double v) {
  std::lock_guard<std::mutex> lock(mu_);
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  counts_[i]++;
  sum_ += v;
  count_++;
}

void Histogram::Render(const std::string& name, const std::string& help, std::string* out) const {
  std::lock_guard<std::mutex> lock(mu_);
  *out += fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
  uint64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    *out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, bounds_[i], cum);
  }
  cum += counts_.back();
  *out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, cum, name,
                      sum_, name, count_);
}

Metrics::Metrics()
    : ttft_s({0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}),
      itl_s({0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5}),
      e2e_s({0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300}),
      recovery_stall_s({0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60}) {}

void Metrics::AddTokens(int64_t prompt, int64_t generated) {
  std::lock_guard<std::mutex> lock(mu_);
  prompt_tokens_ += prompt;
  generation_tokens_ += generated;
}

void Metrics::AddRequest(const std::string& finish_reason) {
  std::lock_guard<std::mutex> lock(mu_);
  requests_[finish_reason]++;
}

void Metrics::AddRecovery(const RecoveryReport& r) {
  if (r.rebalance && r.failed_devices.empty()) {
    std::lock_guard<std::mutex> lock(mu_);
    rebalances_++;
    return;
  }
  recovery_stall_s.Observe(r.stall_ms() * 1e-3);
  std::lock_guard<std::mutex> lock(mu_);
  recoveries_[RecoveryModeName(r.mode)]++;
  last_recovery_s_[RecoveryModeName(r.mode)] = r.stall_ms() * 1e-3;
  last_recovery_ = r;
  any_recovery_ = true;
}

void Metrics::SetGauges(EngineGauges g) {
  std::lock_guard<std::mutex> lock(mu_);
  gauges_ = std::move(g);
}

std::string Metrics::Render(const std::string& model_name) const {
  std::string out;
  ttft_s.Render("failsafe_time_to_first_token_seconds",
                "Time from request arrival to its first token.", &out);
  itl_s.Render("failsafe_inter_token_latency_seconds",
               "Time between consecutive tokens of a request.", &out);
  e2e_s.Render("failsafe_e2e_request_latency_seconds",
               "Time from request arrival to its last token.", &out);
  recovery_stall_s.Render("failsafe_recovery_stall_seconds",
                          "Per recovery: wall time from the failure to the first step after it.",
                          &out);
  std::lock_guard<std::mutex> lock(mu_);
  auto gauge = [&](const char* name, const char* help, double v) {
    out += fmt::format("# HELP {} {}\n# TYPE {} gauge\n{} {}\n", name, help, name, name, v);
  };
  gauge("failsafe_num_requests_running", "Requests being computed.", gauges_.running);
  gauge("failsafe_num_requests_waiting", "Requests queued.", gauges_.waiting);
  gauge("failsafe_devices_alive", "Devices alive.", gauges_.devices_alive);
  gauge("failsafe_devices_total", "Devices configured.", gauges_.devices_total);
  gauge("failsafe_min_devices", "Devices below which /health answers 503.", gauges_.min_devices);
  gauge("failsafe_capacity_fraction",
        "The current plan's expected throughput over the fault-free plan's (1: all devices).",
        gauges_.capacity);
  gauge("failsafe_kv_cache_usage_fraction", "KV pages in use over every active device's pages.",
        gauges_.kv_usage);
  if (gauges_.prefix_cache) {
    const PrefixCacheStats& p = gauges_.prefix;
    auto counter = [&](const char* name, const char* help, double v) {
      out += fmt::format("# HELP {} {}\n# TYPE {} counter\n{} {}\n", name, help, name, name, v);
    };
    counter("failsafe_prefix_cache_lookup_blocks_total",
            "Full prompt blocks of admitted requests looked up in the prefix cache.",
            p.lookup_blocks);
    counter("failsafe_prefix_cache_hit_blocks_total",
            "Looked-up blocks found in the cache on the devices (device tier).", p.hit_blocks);
    counter("failsafe_prefix_cache_hit_tokens_total",
            "Prompt tokens not computed because their KV was cached on the devices.", p.hit_tokens);
    counter("failsafe_prefix_cache_host_hit_blocks_total",
            "Looked-up blocks copied from the host KV backup (host tier) instead of computed.",
            p.host_hit_blocks);
    counter("failsafe_prefix_cache_host_hit_tokens_total",
            "Prompt tokens copied from the host KV backup instead of computed.", p.host_hit_tokens);
    counter("failsafe_prefix_cache_evicted_blocks_total",
            "Unreferenced cached blocks evicted for room.", p.evicted_blocks);
    gauge("failsafe_prefix_cache_hit_rate",
          "Device-tier hit blocks over looked-up blocks since start.", p.hit_rate());
    gauge("failsafe_prefix_cache_host_hit_rate",
          "Host-tier hit blocks over looked-up blocks since start.", p.host_hit_rate());
    gauge("failsafe_prefix_cache_blocks", "Blocks in the prefix cache.", p.cached_blocks);
  }
  // What fleet routers (llm-d's endpoint picker, vLLM's production-stack
  // router) read from vLLM: requests running and waiting, KV usage as a
  // fraction (1 = full), also under its older name.
  const std::string label = fmt::format("{{model_name=\"{}\"}}", EscapeLabel(model_name));
  auto vllm_gauge = [&](const char* name, const char* help, double v) {
    out +=
        fmt::format("# HELP {} {}\n# TYPE {} gauge\n{}{} {}\n", name, help, name, name, label, v);
  };
  vllm_gauge("vllm:num_requests_running", "Requests being computed (as vLLM names it).",
             gauges_.running);
  vllm_gauge("vllm:num_requests_waiting", "Requests queued (as vLLM names it).", gauges_.waiting);
  vllm_gauge("vllm:kv_cache_usage_perc", "KV-cache usage, 1 means 100 percent (as vLLM names it).",
             gauges_.kv_usage);
  vllm_gauge("vllm:gpu_cache_usage_perc",
             "KV-cache usage, 1 means 100 percent (vLLM's older name).", gauges_.kv_usage);
  out +=
      "# HELP failsafe_kv_cache_usage Fraction of a device's KV pages in use.\n"
      "# TYPE failsafe_kv_cache_usage gauge\n";
  for (const DeviceGauge& d : gauges_.devices) {
    out += fmt::format("failsafe_kv_cache_usage{{device=\"{}\"}} {}\n", d.device, d.kv_usage);
  }
  out +=
      "# HELP failsafe_device_alive 1 if the device is alive.\n# TYPE failsafe_device_alive "
      "gauge\n";
  for (const DeviceGauge& d : gauges_.devices) {
    out += fmt::format("failsafe_device_alive{{device=\"{}\"}} {}\n", d.device, d.alive ? 1 : 0);
  }
  out +=
      "# HELP failsafe_device_relative_speed A device's work per compute second over its "
      "peers', over the last measured window (1: as fast).\n"
      "# TYPE failsafe_device_relative_speed gauge\n";
  for (const DeviceGauge& d : gauges_.devices) {
    if (d.speed_measured)
      out += fmt::format("failsafe_device_relative_speed{{device=\"{}\"}} {}\n", d.device,
                         d.relative_speed);
  }
  out +=
      "# HELP failsafe_device_slow 1 if the device stayed slower than its peers over the last "
      "window.\n# TYPE failsafe_device_slow gauge\n";
  for (const DeviceGauge& d : gauges_.devices)
    out += fmt::format("failsafe_device_slow{{device=\"{}\"}} {}\n", d.device, d.slow ? 1 : 0);
  out +=
      "# HELP failsafe_device_share The device's share of work in the plan (1: an equal share; "
      "less after a rebalance (EngineOptions::rebalance_slow, off in serve) gave it less).\n# TYPE "
      "failsafe_device_share gauge\n";
  for (const DeviceGauge& d : gauges_.devices)
    out += fmt::format("failsafe_device_share{{device=\"{}\"}} {}\n", d.device, d.share);
  out +=
      "# HELP failsafe_device_work_fraction The device's part of the FLOPs of the last measured "
      "window.\n# TYPE failsafe_device_work_fraction gauge\n";
  for (const DeviceGauge& d : gauges_.devices) {
    out += fmt::format("failsafe_device_work_fraction{{device=\"{}\"}} {}\n", d.device,
                       d.work_fraction);
  }
  out +=
      "# HELP failsafe_device_respawns_total Times the device was started again after it died.\n"
      "# TYPE failsafe_device_respawns_total counter\n";
  for (const DeviceGauge& d : gauges_.devices) {
    out +=
        fmt::format("failsafe_device_respawns_total{{device=\"{}\"}} {}\n", d.device, d.respawns);
  }
  out +=
      "# HELP failsafe_device_crash_looping 1 if the device died too often to be started again "
      "until restored by hand.\n# TYPE failsafe_device_crash_looping gauge\n";
  for (const DeviceGauge& d : gauges_.devices) {
    out += fmt::format("failsafe_device_crash_looping{{device=\"{}\"}} {}\n", d.device,
                       d.crash_looping ? 1 : 0);
  }
  out += fmt::format(
      "# HELP failsafe_rebalances_total Plan changes that gave slow devices another share.\n"
      "# TYPE failsafe_rebalances_total counter\nfailsafe_rebalances_total {}\n",
      rebalances_);
  out += fmt::format(
      "# HELP failsafe_prompt_tokens_total Prompt tokens processed.\n# TYPE "
      "failsafe_prompt_tokens_total counter\n"
      "failsafe_prompt_tokens_total {}\n"
      "# HELP failsafe_generation_tokens_total Tokens generated.\n# TYPE "
      "failsafe_generation_tokens_total counter\n"
      "failsafe_generation_tokens_total {}\n",
      prompt_tokens_, generation_tokens_);
  out +=
      "# HELP failsafe_requests_total Finished requests by finish reason.\n# TYPE "
      "failsafe_requests_total counter\n";
  for (auto& [reason, n] : requests_)
    out += fmt::format("failsafe_requests_total{{finish_reason=\"{}\"}} {}\n", reason, n);
  out +=
      "# HELP failsafe_recoveries_total Recoveries from device failures and rejoins, by mode.\n"
      "# TYPE failsafe_recoveries_total counter\n";
  for (const char* m : {"recompute", "host", "full"}) {
    auto it = recoveries_.find(m);
    out += fmt::format("failsafe_recoveries_total{{mode=\"{}\"}} {}\n", m,
                       it == recoveries_.end() ? 0 : it->second);
  }
  out +=
      "# HELP failsafe_last_recovery_seconds The last recovery by mode: wall time from the failure "
      "(the kill, or a hung device's last progress) to the first step after it.\n"
      "# TYPE failsafe_last_recovery_seconds gauge\n";
  for (auto& [m, s] : last_recovery_s_)
    out += fmt::format("failsafe_last_recovery_seconds{{mode=\"{}\"}} {}\n", m, s);
  if (any_recovery_) {
    const RecoveryReport& r = last_recovery_;
    out +=
        "# HELP failsafe_last_recovery_phase_seconds The last recovery's phases, wall time.\n"
        "# TYPE failsafe_last_recovery_phase_seconds gauge\n";
    const std::pair<const char*, double> phases[] = {
        {"detect", r.detect_ms}, {"abort", r.abort_ms},           {"replan", r.replan_ms},
        {"group", r.group_ms},   {"weights", r.weights_ms},       {"kv", r.kv_ms},
        {"apply", r.apply_ms},   {"first_step", r.first_step_ms}, {"recompute", r.recompute_ms}};
    for (auto& [name, ms] : phases)
      out +=
          fmt::format("failsafe_last_recovery_phase_seconds{{phase=\"{}\"}} {}\n", name, ms * 1e-3);
  }
  return out;
}

}  // namespace failsafe
