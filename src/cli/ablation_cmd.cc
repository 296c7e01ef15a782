// The paper's ablation on the real engine: 7 devices under TP4 (standard),
// nonuniform TP7, + memory balancing (cyclic), + compute balancing (hybrid
// placement, load-aware routing, adaptive prefill: FailSafe), and 8-device TP8
// as the fault-free reference; for a prefill-heavy and a decode-heavy
// workload. Throughput is emulated (one core per device); KV capacity is the
// peak number of concurrent sequences.
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/engine_flags.h"
#include "cli/model_cache.h"
#include "engine/offline_run.h"
#include "trace/workload.h"

namespace failsafe {

namespace {

struct AblationConfig {
  const char* name;
  int devices;
  const char* placement;
  const char* router;
  const char* prefill;
};

const AblationConfig kConfigs[] = {
    {"TP4 (standard, 7 alive)", 7, "standard", "round-robin", "fifo"},
    {"+ nonuniform TP7", 7, "nonuniform", "round-robin", "fifo"},
    {"+ memory balancing (cyclic)", 7, "cyclic", "round-robin", "fifo"},
    {"+ compute balancing (FailSafe)", 7, "hybrid", "load-aware", "adaptive"},
    {"TP8 fault-free (standard, 8)", 8, "standard", "round-robin", "fifo"},
};

}  // namespace

CommandFn RegisterAblation(CLI::App& app) {
  struct Opts {
    std::string model, cache_dir, data_dir, workloads = "prefill,decode", device_memory = "96MiB";
    int requests = 48, max_batch_tokens = 1024, max_num_seqs = 256;
    double prefill_scale = 0.05, decode_scale = 0.05;
    bool json = false, no_progress = false;
    DeviceFlags timeouts;
  };
  auto o = std::make_shared<Opts>();
  app.add_option("--model", o->model, "model directory (default: the synthetic small-llama)");
  app.add_option("--cache-dir", o->cache_dir, "where the default model is kept");
  app.add_option("--data-dir", o->data_dir, "where the traces live");
  app.add_option("--workloads", o->workloads, "prefill, decode or both (prefill,decode)")
      ->capture_default_str();
  app.add_option("--requests", o->requests, "requests per run")->capture_default_str();
  app.add_option("--device-memory", o->device_memory, "memory of one device")
      ->capture_default_str();
  app.add_option("--max-batch-tokens", o->max_batch_tokens, "tokens per step")
      ->capture_default_str();
  app.add_option("--prefill-scale", o->prefill_scale,
                 "length scale of the Mooncake (prefill-heavy) workload")
      ->capture_default_str();
  app.add_option("--decode-scale", o->decode_scale,
                 "length scale of the OpenThoughts-like (decode-heavy) workload")
      ->capture_default_str();
  app.add_flag("--no-progress", o->no_progress, "no progress bar");
  AddTimeoutFlags(app, &o->timeouts);
  app.add_flag("--json", o->json, "print the table as one JSON object on the last line");
  return [o] {
    auto dir = ResolveModel(o->model, o->cache_dir, "small-llama");
    if (!dir.ok()) return Fail(dir.status().ToString());
    auto config = ModelConfig::Load(*dir);
    if (!config.ok()) return Fail(config.status().ToString());
    nlohmann::json out = nlohmann::json::object();
    for (std::string kind : {"prefill", "decode"}) {
      if (o->workloads.find(kind) == std::string::npos) continue;
      WorkloadOptions wo;
      wo.max_requests = o->requests;
      wo.max_context = config->max_position_embeddings;
      wo.length_scale = kind == "prefill" ? o->prefill_scale : o->decode_scale;
      wo.skip_invalid = true;
      auto w = LoadWorkload(kind == "prefill" ? "mooncake" : "openthoughts",
                            FindDataDir(o->data_dir), wo);
      if (!w.ok()) return Fail(w.status().ToString());
      // All requests arrive at once: a throughput run.
      for (auto& r : w->requests) r.arrival_s = 0;
      std::printf("\n%s-heavy: %s, %zu requests, length scale %.3g, device memory %s\n",
                  kind.c_str(), w->description.c_str(), w->requests.size(), wo.length_scale,
                  o->device_memory.c_str());
      std::printf("%-32s %12s %8s %13s %10s %13s %12s %8s\n", "configuration", "emul. tok/s",
                  "vs TP4", "output tok/s", "peak seqs", "peak KV tok", "preemptions", "wall s");
      std::fflush(stdout);
      double tp4 = 0;
      nlohmann::json rows = nlohmann::json::array();
      for (const AblationConfig& c : kConfigs) {
        DeviceFlags df;
        df.devices = c.devices;
        df.placement = c.placement;
        df.device_memory = o->device_memory;
        df.max_step_tokens = o->max_batch_tokens;
        df.max_seqs = o->max_num_seqs;
        CopyTimeoutFlags(o->timeouts, &df);
        auto exec = MakeExecutor(*dir, df);
        if (!exec.ok()) return Fail(std::string(c.name) + ": " + exec.status().ToString());
        Engine engine(exec->get(),
                      *MakeSchedulerConfig(c.router, c.prefill, o->max_batch_tokens,
                                           o->max_num_seqs, config->max_position_embeddings));
        OfflineRunOptions ro;
        ro.progress = !o->no_progress;
        auto s = RunOffline(engine, *w, ro);
        if (!s.ok()) return Fail(std::string(c.name) + ": " + s.status().ToString());
        const double tps = s->emulated_tokens_per_s();
        if (tp4 == 0) tp4 = tps;
        std::printf("%-32s %12.1f %7.2fx %13.1f %10d %13lld %12d %8.1f\n", c.name, tps, tps / tp4,
                    s->output_tokens / s->emulated_s, s->peak_concurrent_seqs,
                    static_cast<long long>(s->peak_kv_tokens), s->preemptions, s->wall_s);
        std::fflush(stdout);
        rows.push_back({{"configuration", c.name},
                        {"emulated_tokens_per_s", tps},
                        {"ratio_to_tp4", tps / tp4},
                        {"emulated_output_tokens_per_s", s->output_tokens / s->emulated_s},
                        {"peak_concurrent_seqs", s->peak_concurrent_seqs},
                        {"peak_kv_tokens", s->peak_kv_tokens},
                        {"preemptions", s->preemptions},
                        {"output_digest", s->output_digest}});
      }
      out[kind] = rows;
    }
    if (o->json) std::printf("%s\n", out.dump().c_str());
    return 0;
  };
}

}  // namespace failsafe
