#include <cstdio>

#include "cli/commands.h"
#include "cli/engine_flags.h"
#include "cli/model_cache.h"
#include "engine/faults.h"
#include "engine/offline_run.h"
#include "trace/workload.h"

namespace failsafe {

CommandFn RegisterRun(CLI::App& app) {
  struct Opts {
    std::string model, cache_dir, workload = "mooncake", data_dir, router = "load-aware",
                                  prefill = "adaptive";
    int requests = 100, max_batch_tokens = 2048, max_num_seqs = 256;
    double length_scale = 1.0, time_scale = 1.0;
    uint64_t seed = 0;
    bool json = false, skip_invalid = false, no_progress = false;
    std::vector<std::string> fail;
    std::string prefix_cache = "on";
    DeviceFlags dev;
  };
  auto o = std::make_shared<Opts>();
  o->dev.devices = 8;  // a scale-up domain of 8 devices, as serve
  app.add_option("--model", o->model, "model directory (default: the real stories260K model)");
  app.add_option("--cache-dir", o->cache_dir, "where the default model is kept");
  AddDeviceFlags(app, &o->dev);
  app.add_option("--router", o->router, "round-robin or load-aware")->capture_default_str();
  app.add_option("--prefill", o->prefill, "fifo or adaptive")->capture_default_str();
  AddPrefixCacheFlag(app, &o->prefix_cache);
  app.add_option("--workload", o->workload, "mooncake, openthoughts, or a JSONL file")
      ->capture_default_str();
  app.add_option("--data-dir", o->data_dir,
                 "where the traces live (default: ../shared/data or ./data)");
  app.add_option("--requests", o->requests, "requests to run (0: the whole trace)")
      ->capture_default_str();
  app.add_option("--length-scale", o->length_scale, "multiply every length by this")
      ->capture_default_str();
  app.add_option("--time-scale", o->time_scale, "multiply every arrival time by this")
      ->capture_default_str();
  app.add_option("--max-batch-tokens", o->max_batch_tokens, "tokens per step")
      ->capture_default_str();
  app.add_option("--max-num-seqs", o->max_num_seqs, "running sequences")->capture_default_str();
  app.add_option("--seed", o->seed, "seed of prompts and generated workloads")
      ->capture_default_str();
  app.add_flag("--skip-invalid", o->skip_invalid,
               "skip invalid workload lines (and count them) instead of failing");
  app.add_flag("--no-progress", o->no_progress, "no progress bar on stderr");
  app.add_flag("--json", o->json, "print the summary as one JSON object on the last line");
  app.add_option(
      "--fail", o->fail,
      "inject a failure: device=N@step=K, device=N@t=2.5s, rejoin=N@t=6s, trace=FILE (repeatable)");
  return [o] {
    auto dir = ResolveModelOrDefault(o->model, o->cache_dir);
    if (!dir.ok()) return Fail(dir.status().ToString());
    auto config = ModelConfig::Load(*dir);
    if (!config.ok()) return Fail(config.status().ToString());
    auto sc = MakeSchedulerConfig(o->router, o->prefill, o->max_batch_tokens, o->max_num_seqs,
                                  config->max_position_embeddings);
    if (!sc.ok()) return Fail(sc.status().message());
    if (Status st = ApplyPrefixCacheFlag(o->prefix_cache, &*sc); !st.ok())
      return Fail(st.message());
    WorkloadOptions wo;
    wo.max_requests = o->requests;
    wo.length_scale = o->length_scale;
    wo.time_scale = o->time_scale;
    wo.max_context = config->max_position_embeddings;
    wo.skip_invalid = o->skip_invalid;
    wo.seed = o->seed;
    auto workload = LoadWorkload(o->workload, FindDataDir(o->data_dir), wo);
    if (!workload.ok()) return Fail(workload.status().ToString());
    if (workload->skipped > 0)
      std::fprintf(stderr, "skipped %d invalid workload lines\n", workload->skipped);
    if (workload->reordered > 0)
      std::fprintf(stderr, "%d workload rows were out of timestamp order (run in arrival order)\n",
                   workload->reordered);
    auto faults = ParseFaults(o->fail, o->dev.devices, o->time_scale);
    if (!faults.ok()) return Fail(faults.status().ToString());
    if (!faults->empty() && o->dev.devices == 1) return Fail("--fail needs more than one device");
    auto mode = ParseDeviceRecoveryMode(o->dev.recovery);
    if (!mode.ok()) return Fail("--recovery: " + mode.status().message());
    o->dev.max_step_tokens = o->max_batch_tokens;
    o->dev.max_seqs = o->max_num_seqs;
    auto exec = MakeExecutor(*dir, o->dev);
    if (!exec.ok()) return Fail(exec.status().ToString());
    if (Status st = CheckPrefixCacheTier(o->prefix_cache, **exec); !st.ok())
      return Fail(st.ToString());
    EngineOptions eo;
    eo.recovery = *mode;
    eo.rebalance_slow = o->dev.rebalance_slow;
    Engine engine(exec->get(), *sc, eo);
    OfflineRunOptions ro;
    ro.seed = o->seed;
    ro.progress = !o->no_progress;
    ro.faults = *faults;
    auto summary = RunOffline(engine, *workload, ro);
    if (!summary.ok()) return Fail(summary.status().ToString());
    summary->config = fmt::format(
        "{} devices, placement {}, router {}, prefill {}, prefix cache {}, workload {} "
        "({} requests)",
        o->dev.devices, o->dev.placement, o->router, o->prefill, o->prefix_cache,
        workload->description, workload->requests.size());
    if (o->json) {
      std::printf("%s\n", summary->ToJson().c_str());
    } else {
      std::printf("%s", summary->ToText().c_str());
    }
    return 0;
  };
}

}  // namespace failsafe
