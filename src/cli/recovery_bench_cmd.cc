// The paper's recovery experiment at this machine's scale: 8 devices, a
// decode-heavy run, one device killed mid-run, each recovery mode in turn.
// Prints the recovery latency breakdown, ratios to `recompute`, and the
// P90/P99 of each request's longest gap between tokens.
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/engine_flags.h"
#include "cli/offline_bench.h"
#include "engine/offline_run.h"

namespace failsafe {

CommandFn RegisterRecoveryBench(CLI::App& app) {
  struct Opts {
    std::string model, cache_dir, modes = "recompute,host,full";
    int requests = 32, fail_step = 120, device = 3, devices = 8;
    double length_scale = 0.05;
    bool json = false;
    DeviceFlags timeouts;
  };
  auto o = std::make_shared<Opts>();
  app.add_option("--model", o->model, "model directory (default: the synthetic small-llama)");
  app.add_option("--cache-dir", o->cache_dir, "where the default model is kept");
  app.add_option("--devices", o->devices)->capture_default_str();
  app.add_option("--requests", o->requests, "decode-heavy requests (OpenThoughts-like lengths)")
      ->capture_default_str();
  app.add_option("--length-scale", o->length_scale, "length scale of the workload")
      ->capture_default_str();
  app.add_option("--fail-step", o->fail_step, "step during which the device is killed")
      ->capture_default_str();
  app.add_option("--device", o->device, "device to kill")->capture_default_str();
  app.add_option("--modes", o->modes, "recovery modes to run")->capture_default_str();
  app.add_flag("--json", o->json, "print the table as one JSON object on the last line");
  AddTimeoutFlags(app, &o->timeouts);
  return [o] {
    auto in = LoadOfflineBenchInput(o->model, o->cache_dir, o->requests, o->length_scale);
    if (!in.ok()) return Fail(in.status().ToString());
    const std::string& dir = in->model_dir;
    const ModelConfig& config = in->config;
    const Workload& w = in->workload;
    std::vector<std::string> modes = {"none"};
    for (size_t p = 0; p <= o->modes.size();) {
      size_t q = o->modes.find(',', p);
      if (q == std::string::npos) q = o->modes.size();
      modes.push_back(o->modes.substr(p, q - p));
      p = q + 1;
    }
    std::printf("%d devices, %zu decode-heavy requests, device %d killed during step %d\n\n",
                o->devices, w.requests.size(), o->device, o->fail_step);
    std::printf("%-10s %10s %8s %8s %8s %8s %10s %12s %10s %12s %10s %9s %9s %9s\n", "mode",
                "total ms", "vs rec.", "detect", "abort", "replan", "weights", "weight MiB",
                "KV rest.", "recompute", "tokens", "TBT p50", "TBT p90", "TBT p99");
    nlohmann::json rows = nlohmann::json::array();
    double recompute_total = 0;
    std::string digest;
    for (const std::string& m : modes) {
      DeviceFlags df;
      df.devices = o->devices;
      df.placement = "hybrid";
      df.recovery = m == "none" ? "full" : m;
      df.max_step_tokens = 1024;
      df.max_seqs = 256;
      CopyTimeoutFlags(o->timeouts, &df);
      auto mode = ParseRecoveryMode(df.recovery);
      if (!mode.ok()) return Fail("--modes: " + mode.status().message());
      auto exec = MakeExecutor(dir, df);
      if (!exec.ok()) return Fail(exec.status().ToString());
      SchedulerConfig sc;
      sc.max_batch_tokens = 1024;
      sc.max_model_len = config.max_position_embeddings;
      EngineOptions eo;
      eo.recovery = *mode;
      Engine engine(exec->get(), sc, eo);
      OfflineRunOptions ro;
      if (m != "none") ro.faults = {{false, o->device, o->fail_step, -1}};
      auto s = RunOffline(engine, w, ro);
      if (!s.ok()) return Fail(s.status().ToString());
      if (digest.empty()) digest = s->output_digest;
      const bool same = s->output_digest == digest;
      RecoveryReport r;
      if (!s->recoveries.empty()) r = s->recoveries.front();
      if (m == "recompute") recompute_total = r.total_ms();
      const double ratio =
          recompute_total > 0 && r.total_ms() > 0 ? recompute_total / r.total_ms() : 0;
      std::printf(
          "%-10s %10.1f %7.1fx %8.1f %8.1f %8.1f %10.1f %12.1f %10.1f %12.1f %10lld %9.1f %9.1f "
          "%9.1f%s\n",
          m.c_str(), r.total_ms(), ratio, r.detect_ms, r.abort_ms, r.replan_ms + r.group_ms,
          r.weights_ms, (r.weight_host_bytes + r.weight_peer_bytes) / 1048576.0, r.kv_ms,
          r.recompute_ms, static_cast<long long>(r.tokens_recomputed), s->max_tbt_ms.p50,
          s->max_tbt_ms.p90, s->max_tbt_ms.p99, same ? "" : "  (outputs differ!)");
      std::fflush(stdout);
      rows.push_back(
          {{"mode", m},
           {"total_ms", r.total_ms()},
           {"speedup_over_recompute", ratio},
           {"detect_ms", r.detect_ms},
           {"abort_ms", r.abort_ms},
           {"replan_ms", r.replan_ms + r.group_ms},
           {"weights_ms", r.weights_ms},
           {"weight_host_bytes", r.weight_host_bytes},
           {"weight_peer_bytes", r.weight_peer_bytes},
           {"kv_restore_ms", r.kv_ms},
           {"kv_restored_bytes", r.kv_restored_bytes},
           {"recompute_ms", r.recompute_ms},
           {"tokens_recomputed", r.tokens_recomputed},
           {"max_tbt_ms",
            {{"p50", s->max_tbt_ms.p50}, {"p90", s->max_tbt_ms.p90}, {"p99", s->max_tbt_ms.p99}}},
           {"output_digest", s->output_digest}});
    }
    if (o->json) std::printf("%s\n", nlohmann::json{{"recovery", rows}}.dump().c_str());
    return 0;
  };
}

}  // namespace failsafe
