// A trace-replay client: sends a trace's requests at their (scaled) arrival
// times to a running server over streaming HTTP, and reports TTFT and
// time-between-tokens percentiles, throughput and SLO attainment.
#include <httplib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "cli/commands.h"
#include "cli/load_bench.h"
#include "common/clock.h"
#include "common/fd_limit.h"
#include "common/rng.h"
#include "common/sse.h"
#include "engine/offline_run.h"
#include "trace/workload.h"

namespace failsafe {

namespace {

struct Sample {
  bool ok = false;
  double send_s = 0;  // since the start of the replay
  double ttft_s = 0;
  double max_tbt_s = 0;
  double mean_tbt_s = 0;  // time per output token after the first
  int output_tokens = 0;
  std::vector<double> token_times;  // since the start
  std::string error;
};

Sample RunRequest(const std::string& host, int port, const std::string& model,
                  const WorkloadRequest& r, int index, uint64_t seed, int64_t t0) {
  Sample s;
  nlohmann::json prompt = WorkloadPrompt(r, index, seed, 32, 200);
  nlohmann::json body = {{"model", model},
                         {"prompt", prompt},
                         {"max_tokens", r.output_len},
                         {"temperature", 0},
                         {"ignore_eos", true},
                         {"stream", true},
                         {"stream_options", {{"include_usage", true}}}};
  httplib::Client c(host, port);
  c.set_read_timeout(600, 0);
  c.set_connection_timeout(30, 0);
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  std::string buf;
  const int64_t sent = MonotonicNanos();
  s.send_s = (sent - t0) * 1e-9;
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    buf.append(data, n);
    for (const std::string& ev : TakeSseData(&buf)) {
      if (ev == "[DONE]") continue;
      auto j = nlohmann::json::parse(ev, nullptr, false);
      if (j.is_discarded()) continue;
      if (j.contains("usage") && j["usage"].is_object())
        s.output_tokens = j["usage"].value("completion_tokens", 0);
      if (j.contains("choices") && !j["choices"].empty() &&
          !j["choices"][0]["text"].get<std::string>().empty()) {
        s.token_times.push_back((MonotonicNanos() - t0) * 1e-9);
      }
    }
    return true;
  };
  auto res = c.send(req);
  if (!res || res->status != 200) {
    s.error = res ? fmt::format("HTTP {}", res->status) : httplib::to_string(res.error());
    return s;
  }
  s.ok = !s.token_times.empty();
  if (!s.ok) {
    s.error = "no tokens";
    return s;
  }
  s.ttft_s = s.token_times.front() - s.send_s;
  for (size_t i = 1; i < s.token_times.size(); ++i) {
    s.max_tbt_s = std::max(s.max_tbt_s, s.token_times[i] - s.token_times[i - 1]);
  }
  if (s.token_times.size() > 1) {
    s.mean_tbt_s = (s.token_times.back() - s.token_times.front()) / (s.token_times.size() - 1);
  }
  return s;
}

// Load mode: one level of concurrent streams after another, a line each.
int RunLoadLevels(const LoadOptions& lo, const std::vector<int>& levels, bool json, bool timeline) {
  std::printf("%7s %7s %6s %6s %6s %7s | %-23s | %-23s | %-20s | %-20s\n", "clients", "served",
              "429", "failed", "peak", "server", "TTFT ms p50/p90/p99", "TBT ms p50/p90/p99",
              "/health ms p50/p99/max", "/metrics ms p50/p99/max");
  nlohmann::json out = nlohmann::json::array();
  bool all_answered = true;
  for (int n : levels) {
    if (n < 1) return Fail("--concurrency: levels must be positive");
    auto r = RunLoad(lo, n);
    if (!r.ok()) return Fail(r.status().ToString());
    std::printf(
        "%7d %7d %6d %6d %6d %7lld | %6.0f %7.0f %8.0f | %6.1f %7.1f %8.1f | %5.1f %6.1f %7.1f | "
        "%5.1f %6.1f %7.1f\n",
        n, r->served, r->refused_429, r->failed, r->peak_open,
        static_cast<long long>(r->peak_server_connections), r->ttft_ms.p50, r->ttft_ms.p90,
        r->ttft_ms.p99, r->tbt_ms.p50, r->tbt_ms.p90, r->tbt_ms.p99, r->health_ms.p50,
        r->health_ms.p99, r->health_ms.max, r->metrics_ms.p50, r->metrics_ms.p99,
        r->metrics_ms.max);
    if (r->failed || r->probes_failed) {
      std::printf("        %d probes failed%s%s\n", r->probes_failed,
                  r->first_error.empty() ? "" : "; first request error: ", r->first_error.c_str());
    }
    if (timeline) {
      // Per second of the level: the slowest probes, and the requests open.
      std::printf("        %6s %8s %12s %12s\n", "second", "open", "/health ms", "/metrics ms");
      for (size_t k = 0; k < r->probes.size();) {
        const int sec = static_cast<int>(r->probes[k].at_s);
        double h = 0, m = 0;
        int open = 0;
        for (; k < r->probes.size() && static_cast<int>(r->probes[k].at_s) == sec; ++k) {
          h = r->probes[k].health_ms < 0 ? 1e9 : std::max(h, r->probes[k].health_ms);
          m = r->probes[k].metrics_ms < 0 ? 1e9 : std::max(m, r->probes[k].metrics_ms);
          open = std::max(open, r->probes[k].open);
        }
        std::printf("        %6d %8d %12.1f %12.1f\n", sec, open, h, m);
      }
    }
    std::fflush(stdout);
    all_answered &= r->failed == 0;
    auto pct = [](const Percentiles& p) {
      return nlohmann::json{{"p50", p.p50}, {"p90", p.p90}, {"p99", p.p99}, {"max", p.max}};
    };
    out.push_back({{"clients", n},
                   {"served", r->served},
                   {"refused_429", r->refused_429},
                   {"failed", r->failed},
                   {"first_error", r->first_error},
                   {"peak_open", r->peak_open},
                   {"peak_server_connections", r->peak_server_connections},
                   {"ttft_ms", pct(r->ttft_ms)},
                   {"tbt_ms", pct(r->tbt_ms)},
                   {"health_ms", pct(r->health_ms)},
                   {"metrics_ms", pct(r->metrics_ms)},
                   {"probes_failed", r->probes_failed},
                   {"completion_tokens", r->tokens},
                   {"seconds", r->seconds}});
  }
  std::printf(
      "(peak: requests open at once, client view; server: failsafe_http_connections_open "
      "at its highest probe)\n");
  if (json) std::printf("%s\n", out.dump().c_str());
  return all_answered ? 0 : 1;
}

}  // namespace

CommandFn RegisterBench(CLI::App& app) {
  struct Opts {
    std::string url = "http://127.0.0.1:8000", trace, model, data_dir;
    int requests = 100;
    double rate_scale = 1.0, length_scale = 1.0, slo_ttft = 0, slo_tbt = 0;
    uint64_t seed = 0;
    bool json = false, timeline = false;
    std::vector<int> concurrency;
    int input_len = 32, output_len = 32;
    double level_timeout = 600;
  };
  auto o = std::make_shared<Opts>();
  app.add_option("--url", o->url, "the server")->capture_default_str();
  app.add_option("--trace", o->trace, "JSONL trace (default: the Mooncake conversation trace)");
  app.add_option("--data-dir", o->data_dir, "where the traces live");
  app.add_option("--model", o->model, "model name to send (default: the server's first model)");
  app.add_option("--requests", o->requests, "requests to replay")->capture_default_str();
  app.add_option("--rate-scale", o->rate_scale, "multiply the arrival rate by this")
      ->capture_default_str();
  app.add_option("--length-scale", o->length_scale, "multiply every length by this")
      ->capture_default_str();
  app.add_option("--slo-ttft", o->slo_ttft, "TTFT objective in seconds (0: none)");
  app.add_option("--slo-tbt", o->slo_tbt, "time-per-output-token objective in seconds (0: none)");
  app.add_option("--seed", o->seed, "prompt seed")->capture_default_str();
  app.add_flag("--timeline", o->timeline,
               "print output tokens/s and the worst gap per second of the replay (load mode: the "
               "slowest /health and /metrics probe and the requests open, per second)");
  app.add_flag("--json", o->json, "print the summary as one JSON object on the last line");
  app.add_option("--concurrency", o->concurrency,
                 "load mode instead of a trace: open this many streams at once (a list, e.g. "
                 "100,500,1000, runs one level after another) and report streams served, 429s, "
                 "TTFT/TBT, and /health and /metrics latency while they are open")
      ->delimiter(',');
  app.add_option("--input-len", o->input_len, "load mode: prompt tokens per request")
      ->capture_default_str();
  app.add_option("--output-len", o->output_len, "load mode: tokens generated per request")
      ->capture_default_str();
  app.add_option("--level-timeout", o->level_timeout,
                 "load mode: seconds a level may take before open requests count as failed")
      ->capture_default_str();
  return [o] {
    httplib::Client probe(o->url);
    auto models = probe.Get("/v1/models");
    if (!models || models->status != 200) return Fail("cannot reach " + o->url + "/v1/models");
    auto mj = nlohmann::json::parse(models->body, nullptr, false);
    std::string model = o->model;
    int max_len = 0;
    if (!mj.is_discarded() && mj.contains("data") && !mj["data"].empty()) {
      if (model.empty()) model = mj["data"][0].value("id", "");
      max_len = mj["data"][0].value("max_model_len", 0);
    }
    const std::string host_port = o->url.substr(o->url.find("//") + 2);
    const std::string host = host_port.substr(0, host_port.find(':'));
    const int port = std::stoi(host_port.substr(host_port.find(':') + 1));
    if (!o->concurrency.empty()) {
      LoadOptions lo;
      lo.host = host;
      lo.port = port;
      lo.model = model;
      lo.input_tokens = o->input_len;
      lo.output_tokens = o->output_len;
      lo.timeout_s = o->level_timeout;
      lo.seed = o->seed;
      return RunLoadLevels(lo, o->concurrency, o->json, o->timeline);
    }
    WorkloadOptions wo;
    wo.max_requests = o->requests;
    wo.length_scale = o->length_scale;
    wo.time_scale = 1.0 / o->rate_scale;
    wo.max_context = max_len;
    wo.skip_invalid = true;
    auto w = o->trace.empty() ? LoadWorkload("mooncake", FindDataDir(o->data_dir), wo)
                              : ReadJsonlWorkload(o->trace, wo);
    if (!w.ok()) return Fail(w.status().ToString());
    if (w->skipped)
      std::fprintf(stderr, "skipped %d requests that do not fit the context\n", w->skipped);
    if (w->reordered)
      std::fprintf(stderr, "%d rows were out of timestamp order (run in arrival order)\n",
                   w->reordered);
    const int n = static_cast<int>(w->requests.size());
    // Requests may all be open at once: one connection each.
    const FileLimit limit = RaiseOpenFileLimit(n + 64);
    if (limit.soft < n + 16) {
      std::fprintf(stderr,
                   "warning: the open-file limit (%lld) is below the %d requests; some may fail "
                   "to connect if they overlap (ulimit -n)\n",
                   static_cast<long long>(limit.soft), n);
    }
    std::vector<Sample> samples(n);
    std::vector<std::thread> threads;
    const int64_t t0 = MonotonicNanos();
    const double first = n ? w->requests[0].arrival_s : 0;
    for (int i = 0; i < n; ++i) {
      const double at = w->requests[i].arrival_s - first;
      const int64_t wait = static_cast<int64_t>(at * 1e9) - (MonotonicNanos() - t0);
      if (wait > 0) ::usleep(static_cast<useconds_t>(wait / 1000));
      threads.emplace_back(
          [&, i] { samples[i] = RunRequest(host, port, model, w->requests[i], i, o->seed, t0); });
    }
    for (auto& t : threads) t.join();
    const double makespan = (MonotonicNanos() - t0) * 1e-9;
    std::vector<double> ttft, gaps, max_tbt;
    int ok = 0, meet = 0;
    int64_t in_tokens = 0, out_tokens = 0;
    std::string first_error;
    for (int i = 0; i < n; ++i) {
      const Sample& s = samples[i];
      if (!s.ok) {
        if (first_error.empty()) first_error = s.error;
        continue;
      }
      ++ok;
      in_tokens += w->requests[i].input_len;
      out_tokens += s.output_tokens;
      ttft.push_back(s.ttft_s * 1e3);
      max_tbt.push_back(s.max_tbt_s * 1e3);
      for (size_t k = 1; k < s.token_times.size(); ++k)
        gaps.push_back((s.token_times[k] - s.token_times[k - 1]) * 1e3);
      const bool ttft_ok = o->slo_ttft <= 0 || s.ttft_s <= o->slo_ttft;
      const bool tbt_ok = o->slo_tbt <= 0 || s.mean_tbt_s <= o->slo_tbt;
      meet += ttft_ok && tbt_ok;
    }
    Percentiles pt = ComputePercentiles(ttft), pg = ComputePercentiles(gaps),
                pm = ComputePercentiles(max_tbt);
    std::printf("%d/%d requests ok (rate scale %.3g, length scale %.3g) in %.1f s%s%s\n", ok, n,
                o->rate_scale, o->length_scale, makespan,
                first_error.empty() ? "" : "; first error: ", first_error.c_str());
    std::printf("TTFT ms           p50 %8.1f  p90 %8.1f  p99 %8.1f\n", pt.p50, pt.p90, pt.p99);
    std::printf("TBT ms            p50 %8.1f  p90 %8.1f  p99 %8.1f\n", pg.p50, pg.p90, pg.p99);
    std::printf("max TBT/request   p50 %8.1f  p90 %8.1f  p99 %8.1f\n", pm.p50, pm.p90, pm.p99);
    std::printf("throughput        %.1f input tokens/s, %.1f output tokens/s\n",
                in_tokens / makespan, out_tokens / makespan);
    const double attainment = n ? static_cast<double>(meet) / n : 0;
    if (o->slo_ttft > 0 || o->slo_tbt > 0) {
      std::printf("SLO attainment    %.1f%% (TTFT <= %.3g s, TPOT <= %.3g s)\n", 100 * attainment,
                  o->slo_ttft, o->slo_tbt);
    }
    nlohmann::json timeline = nlohmann::json::array();
    if (o->timeline) {
      const int secs = static_cast<int>(makespan) + 1;
      std::vector<int> tokens(secs, 0);
      std::vector<double> worst(secs, 0);
      for (const Sample& s : samples) {
        for (size_t k = 0; k < s.token_times.size(); ++k) {
          const int b = std::min(secs - 1, static_cast<int>(s.token_times[k]));
          tokens[b]++;
          if (k > 0) worst[b] = std::max(worst[b], (s.token_times[k] - s.token_times[k - 1]) * 1e3);
        }
      }
      std::printf("%6s %14s %14s\n", "second", "output tok/s", "worst gap ms");
      for (int b = 0; b < secs; ++b) {
        std::printf("%6d %14d %14.1f\n", b, tokens[b], worst[b]);
        timeline.push_back({{"t", b}, {"output_tokens", tokens[b]}, {"worst_gap_ms", worst[b]}});
      }
    }
    if (o->json) {
      auto pct = [](const Percentiles& p) {
        return nlohmann::json{{"p50", p.p50}, {"p90", p.p90}, {"p99", p.p99}};
      };
      nlohmann::json j = {{"requests", n},
                          {"requests_ok", ok},
                          {"makespan_s", makespan},
                          {"ttft_ms", pct(pt)},
                          {"tbt_ms", pct(pg)},
                          {"max_tbt_ms", pct(pm)},
                          {"input_tokens_per_s", in_tokens / makespan},
                          {"output_tokens_per_s", out_tokens / makespan},
                          {"slo_attainment", attainment},
                          {"rate_scale", o->rate_scale}};
      if (o->timeline) j["timeline"] = timeline;
      std::printf("%s\n", j.dump().c_str());
    }
    return ok == n ? 0 : 1;
  };
}

}  // namespace failsafe
