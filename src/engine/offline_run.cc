#include "engine/offline_run.h"

#include <unistd.h>

#include <chrono>
#include <thread>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "common/clock.h"
#include "common/log.h"
#include "common/rng.h"

namespace failsafe {

namespace {

struct RequestTrack {
  int64_t id = -1;
  double arrival = 0;
  double last_token = -1;
  double first_token = -1;
  double max_gap = 0;
  std::vector<int32_t> output;
  bool done = false;
  bool failed = false;
};

void Progress(int done, int total, int64_t tokens, double emulated, bool final) {
  const int width = 30;
  const int filled = total ? done * width / total : width;
  std::string bar(filled, '=');
  if (filled < width) bar += '>' + std::string(width - filled - 1, ' ');
  std::fprintf(stderr, "\r[%s] %d/%d requests, %lld tokens, %.1f s emulated%s", bar.c_str(), done,
               total, static_cast<long long>(tokens), emulated, final ? "\n" : "");
  std::fflush(stderr);
}

}  // namespace

Result<RunSummary> RunOffline(Engine& engine, const Workload& w, const OfflineRunOptions& o) {
  const int n = static_cast<int>(w.requests.size());
  const int vocab = engine.config().vocab_size;
  std::vector<RequestTrack> tracks(n);
  std::unordered_map<int64_t, int> index_of;
  RunSummary sum;
  const Plan& plan = engine.executor().plan();
  std::vector<DeviceSummary> dev(plan.num_devices);
  const auto capacity = engine.executor().kv_capacity_pages();
  const int64_t page_bytes = engine.executor().kv_page_bytes();
  double clock = 0;
  int next = 0, done = 0;
  const int64_t wall0 = MonotonicNanos();
  int64_t last_progress = 0;
  std::vector<bool> fault_done(o.faults.size(), false);
  size_t charged_recoveries = 0;
  Rng jitter(HashCombine(o.seed, 0xfa17));
  DeviceFaults* faults = FaultsOf(&engine.executor());
  for (const FaultEvent& f : o.faults) {
    if (!f.rejoin && !faults)
      return FailedPrecondition("--fail: this engine's devices cannot be killed");
  }
  auto pending_rejoin = [&] {
    for (size_t i = 0; i < o.faults.size(); ++i) {
      if (!fault_done[i] && o.faults[i].rejoin) return true;
    }
    return false;
  };
  while (done < n) {
    while (next < n && w.requests[next].arrival_s <= clock) {
      const WorkloadRequest& r = w.requests[next];
      RequestSpec spec;
      spec.prompt = WorkloadPrompt(r, static_cast<int>(next), o.seed, 0, vocab);
      spec.max_new_tokens = r.output_len;
      if (o.sample_every > 0 && next % o.sample_every == 0) {
        spec.sampling.temperature = o.temperature;
        spec.sampling.top_p = o.top_p;
        spec.sampling.seed = HashCombine(o.seed, 0x5eed0000ULL + static_cast<uint64_t>(next));
      }
      spec.arrival = r.arrival_s;
      auto id = engine.Submit(std::move(spec));
      tracks[next].arrival = r.arrival_s;
      if (!id.ok()) {
        tracks[next].done = tracks[next].failed = true;
        ++done;
        ++sum.requests_failed;
        if (sum.failure.empty()) sum.failure = id.status().ToString();
      } else {
        tracks[next].id = *id;
        index_of[*id] = next;
      }
      ++next;
    }
    // Faults due now: rejoins between steps, kills in the middle of the next step.
    std::vector<int> kills;
    for (size_t i = 0; i < o.faults.size(); ++i) {
      const FaultEvent& f = o.faults[i];
      const bool due = f.at_step >= 0 ? f.at_step <= sum.steps : f.at_s <= clock;
      // While degraded, time stands still: the next rejoin comes now.
      const bool forced = engine.degraded() && f.rejoin;
      if (fault_done[i] || (!due && !forced)) continue;
      fault_done[i] = true;
      if (f.rejoin) {
        Status st = engine.Rejoin(f.device);
        if (!st.ok()) FS_LOG_WARN("rejoin of device {}: {}", f.device, st.ToString());
        if (forced) break;
      } else {
        kills.push_back(f.device);
      }
    }
    if (engine.degraded()) {
      if (pending_rejoin()) continue;
      if (sum.failure.empty()) sum.failure = engine.degraded_reason();
      for (const TokenEvent& e : engine.FailAll(Unavailable("{}", engine.degraded_reason()))) {
        auto it = index_of.find(e.id);
        if (it == index_of.end() || tracks[it->second].done) continue;
        tracks[it->second].done = tracks[it->second].failed = true;
        ++done;
        ++sum.requests_failed;
      }
      continue;
    }
    if (engine.idle() && kills.empty()) {
      if (next < n) {
        const double arrival = w.requests[next].arrival_s;
        if (o.wall_clock && arrival > clock)
          std::this_thread::sleep_for(std::chrono::duration<double>(arrival - clock));
        clock = std::max(o.wall_clock ? (MonotonicNanos() - wall0) * 1e-9 : clock, arrival);
      }
      if (next >= n && done < n) {
        // Failed requests finish through events; drain them.
        auto out = engine.Step();
        if (out.ok()) {
          for (const TokenEvent& e : out->events) {
            auto it = index_of.find(e.id);
            if (it == index_of.end() || !e.finished || tracks[it->second].done) continue;
            tracks[it->second].done = tracks[it->second].failed = true;
            ++done;
            ++sum.requests_failed;
          }
        }
        if (engine.idle() && done < n) break;
      }
      continue;
    }
    std::thread killer;
    if (!kills.empty()) {
      const int64_t delay_us = static_cast<int64_t>(jitter.Below(3000));
      killer = std::thread([faults, kills, delay_us] {
        ::usleep(static_cast<useconds_t>(delay_us));
        for (int d : kills) (void)faults->KillDevice(d);
      });
    }
    auto stepped = engine.Step();
    if (killer.joinable()) killer.join();
    if (!stepped.ok()) {
      if (stepped.status().code() == StatusCode::kUnavailable && engine.degraded()) continue;
      return stepped.status();
    }
    StepOutcome& out = *stepped;
    if (o.wall_clock) {
      clock = (MonotonicNanos() - wall0) * 1e-9;
    } else {
      // Serving stopped while the engine recovered: the clock moves on by
      // the detection and the recovery (the steps after it are charged as
      // steps, below).
      while (charged_recoveries < engine.recoveries().size() &&
             engine.recoveries()[charged_recoveries].resumed()) {
        const RecoveryReport& r = engine.recoveries()[charged_recoveries++];
        clock += (r.detect_ms + r.outage_ms()) * 1e-3;
      }
    }
    if (!out.ran) {
      if (out.recovered) continue;
      // Finished-without-token events (aborted, failed) still count.
      for (const TokenEvent& e : out.events) {
        auto it = index_of.find(e.id);
        if (it == index_of.end() || !e.finished || tracks[it->second].done) continue;
        tracks[it->second].done = tracks[it->second].failed = true;
        ++done;
        ++sum.requests_failed;
      }
      continue;
    }
    if (!o.wall_clock) clock += out.timing.emulated_ns * 1e-9;
    ++sum.steps;
    if (o.on_step) o.on_step(out);
    sum.preemptions += static_cast<int>(out.plan.preempted.size());
    sum.peak_concurrent_seqs = std::max(sum.peak_concurrent_seqs, engine.scheduler().num_running());
    int64_t kv_tokens = 0;
    for (const Sequence* s : engine.scheduler().Running()) kv_tokens += s->num_computed;
    sum.peak_kv_tokens = std::max(sum.peak_kv_tokens, kv_tokens);
    for (size_t i = 0; i < out.timing.devices.size(); ++i) {
      DeviceSummary& d = dev[out.timing.devices[i]];
      d.device = out.timing.devices[i];
      d.compute_s += out.timing.device_compute_ns[i] * 1e-9;
      d.attention_flops += out.timing.device_attention_flops[i];
      d.ffn_flops += out.timing.device_ffn_flops[i];
      d.peak_kv_bytes = std::max(d.peak_kv_bytes, out.timing.device_kv_bytes[i]);
    }
    for (const TokenEvent& e : out.events) {
      auto it = index_of.find(e.id);
      if (it == index_of.end()) continue;
      RequestTrack& t = tracks[it->second];
      if (e.token >= 0) {
        if (t.first_token < 0) t.first_token = clock;
        if (t.last_token >= 0) t.max_gap = std::max(t.max_gap, clock - t.last_token);
        t.last_token = clock;
        t.output.push_back(e.token);
      }
      if (e.finished && !t.done) {
        t.done = true;
        ++done;
        if (e.reason == FinishReason::kLength || e.reason == FinishReason::kStop) {
          ++sum.requests_completed;
        } else {
          t.failed = true;
          ++sum.requests_failed;
        }
      }
    }
    if (o.progress && MonotonicNanos() - last_progress > 250000000) {
      int64_t toks = 0;
      for (auto& t : tracks) toks += static_cast<int64_t>(t.output.size());
      Progress(done, n, toks, clock, false);
      last_progress = MonotonicNanos();
    }
  }
  sum.wall_s = (MonotonicNanos() - wall0) * 1e-9;
  sum.emulated_s = clock - (w.requests.empty() ? 0 : w.requests.front().arrival_s);
  std::vector<double> ttft, tbt;
  uint64_t digest = 1469598103934665603ULL;
  auto fold = [&](uint64_t v) {
    for (int b = 0; b < 8; ++b) digest = (digest ^ ((v >> (8 * b)) & 0xff)) * 1099511628211ULL;
  };
  for (int i = 0; i < n; ++i) {
    const RequestTrack& t = tracks[i];
    sum.input_tokens += w.requests[i].input_len;
    sum.output_tokens += static_cast<int64_t>(t.output.size());
    if (t.first_token >= 0) ttft.push_back((t.first_token - t.arrival) * 1e3);
    if (t.output.size() > 1) tbt.push_back(t.max_gap * 1e3);
    fold(static_cast<uint64_t>(i));
    fold(t.output.size());
    for (int32_t tok : t.output) fold(static_cast<uint64_t>(tok));
  }
  sum.output_digest = fmt::format("{:016x}", digest);
  sum.ttft_ms = ComputePercentiles(ttft);
  sum.max_tbt_ms = ComputePercentiles(tbt);
  double total_compute = 0;
  for (int d : plan.active) total_compute += dev[d].compute_s;
  for (int d = 0; d < plan.num_devices; ++d) {
    if (dev[d].device < 0) continue;
    dev[d].compute_share = total_compute > 0 ? dev[d].compute_s / total_compute : 0;
    dev[d].kv_capacity_bytes = d < static_cast<int>(capacity.size()) ? capacity[d] * page_bytes : 0;
    sum.devices.push_back(dev[d]);
  }
  if (o.progress) {
    Progress(done, n, sum.output_tokens, clock, true);
  }
  sum.recoveries = engine.recoveries();
  sum.prefix_cache = engine.scheduler().config().prefix_cache;
  sum.prefix_cache_host = engine.scheduler().host_tier();
  sum.prefix = engine.scheduler().prefix_cache_stats();
  if (const HostKvBackup* b = engine.executor().backup()) {
    sum.backup_capacity_blocks = b->capacity_blocks();
    sum.backup = b->stats();
  }
  return sum;
}

std::string RunSummary::ToText() const {
  std::string s;
  if (!config.empty()) s += config + "\n";
  s += fmt::format("requests completed   {} ({} failed)\n", requests_completed, requests_failed);
  s += fmt::format("tokens               {} input, {} output\n", input_tokens, output_tokens);
  s += fmt::format("wall time            {:.2f} s, {:.1f} tokens/s ({:.1f} output tokens/s)\n",
                   wall_s, tokens_per_s(), output_tokens / wall_s);
  s += fmt::format("emulated time        {:.2f} s, {:.1f} tokens/s ({:.1f} output tokens/s)\n",
                   emulated_s, emulated_tokens_per_s(), output_tokens / emulated_s);
  s += fmt::format(
      "steps                {} ({} preemptions), peak concurrent sequences {}, peak KV tokens {}\n",
      steps, preemptions, peak_concurrent_seqs, peak_kv_tokens);
  s += fmt::format("TTFT (emulated)      mean {:.1f} ms, p50 {:.1f}, p90 {:.1f}, p99 {:.1f}\n",
                   ttft_ms.mean, ttft_ms.p50, ttft_ms.p90, ttft_ms.p99);
  s += fmt::format("max TBT per request  p50 {:.1f} ms, p90 {:.1f}, p99 {:.1f}, max {:.1f}\n",
                   max_tbt_ms.p50, max_tbt_ms.p90, max_tbt_ms.p99, max_tbt_ms.max);
  s += fmt::format("{:>6} {:>14} {:>14} {:>12} {:>9}\n", "device", "peak KV MiB", "KV capacity",
                   "compute s", "share");
  for (auto& d : devices) {
    s += fmt::format("{:>6} {:>14.1f} {:>14.1f} {:>12.2f} {:>8.1f}%\n", d.device,
                     d.peak_kv_bytes / 1048576.0, d.kv_capacity_bytes / 1048576.0, d.compute_s,
                     100 * d.compute_share);
  }
  if (prefix_cache) {
    s += fmt::format(
        "prefix cache         {:.1f}% of {} blocks hit on the devices, {:.1f}% copied from the "
        "host; {} prompt tokens not computed ({} device, {} host; {} more of preempted "
        "requests), {} blocks cached, {} evicted\n",
        100 * prefix.hit_rate(), prefix.lookup_blocks, 100 * prefix.host_hit_rate(),
        prefix.hit_tokens + prefix.host_hit_tokens, prefix.hit_tokens, prefix.host_hit_tokens,
        prefix.readmitted_hit_tokens, prefix.cached_blocks, prefix.evicted_blocks);
  } else {
    s += "prefix cache         off\n";
  }
  if (backup_capacity_blocks > 0) {
    s += fmt::format(
        "host KV backup       {} blocks; {} named from shared copies instead of copied, {} "
        "indexed as complete, {} evicted\n",
        backup_capacity_blocks, backup.shared_blocks, backup.indexed_blocks, backup.evicted_blocks);
  }
  for (const RecoveryReport& r : recoveries) s += r.ToText() + "\n";
  if (!failure.empty()) s += "failure              " + failure + "\n";
  s += fmt::format("output digest        {}\n", output_digest);
  return s;
}

std::string RunSummary::ToJson() const {
  nlohmann::json devs = nlohmann::json::array();
  for (auto& d : devices) {
    devs.push_back({{"device", d.device},
                    {"peak_kv_bytes", d.peak_kv_bytes},
                    {"kv_capacity_bytes", d.kv_capacity_bytes},
                    {"compute_s", d.compute_s},
                    {"compute_share", d.compute_share},
                    {"attention_flops", d.attention_flops},
                    {"ffn_flops", d.ffn_flops}});
  }
  auto pct = [](const Percentiles& p) {
    return nlohmann::json{
        {"p50", p.p50}, {"p90", p.p90}, {"p99", p.p99}, {"max", p.max}, {"mean", p.mean}};
  };
  nlohmann::json j = {{"config", config},
                      {"requests_completed", requests_completed},
                      {"requests_failed", requests_failed},
                      {"input_tokens", input_tokens},
                      {"output_tokens", output_tokens},
                      {"wall_s", wall_s},
                      {"tokens_per_s", tokens_per_s()},
                      {"output_tokens_per_s", output_tokens / wall_s},
                      {"emulated_s", emulated_s},
                      {"emulated_tokens_per_s", emulated_tokens_per_s()},
                      {"emulated_output_tokens_per_s", output_tokens / emulated_s},
                      {"steps", steps},
                      {"preemptions", preemptions},
                      {"peak_concurrent_seqs", peak_concurrent_seqs},
                      {"peak_kv_tokens", peak_kv_tokens},
                      {"ttft_ms", pct(ttft_ms)},
                      {"max_tbt_ms", pct(max_tbt_ms)},
                      {"devices", devs},
                      {"output_digest", output_digest}};
  nlohmann::json recs = nlohmann::json::array();
  for (const RecoveryReport& r : recoveries) recs.push_back(nlohmann::json::parse(r.ToJson()));
  j["recoveries"] = recs;
  j["prefix_cache"] = {{"on", prefix_cache},
                       {"lookup_blocks", prefix.lookup_blocks},
                       {"hit_blocks", prefix.hit_blocks},
                       {"hit_rate", prefix.hit_rate()},
                       {"hit_tokens", prefix.hit_tokens},
                       {"host_tier", prefix_cache_host},
                       {"host_hit_blocks", prefix.host_hit_blocks},
                       {"host_hit_rate", prefix.host_hit_rate()},
                       {"host_hit_tokens", prefix.host_hit_tokens},
                       {"readmitted_hit_tokens", prefix.readmitted_hit_tokens},
                       {"cached_blocks", prefix.cached_blocks},
                       {"evicted_blocks", prefix.evicted_blocks}};
  j["host_backup"] = {{"capacity_blocks", backup_capacity_blocks},
                      {"shared_blocks", backup.shared_blocks},
                      {"indexed_blocks", backup.indexed_blocks},
                      {"evicted_blocks", backup.evicted_blocks}};
  if (!failure.empty()) j["failure"] = failure;
  return j.dump();
}

}  // namespace failsafe
