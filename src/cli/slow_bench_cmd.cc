// A slow device's cost, with and without rebalancing: the same offline
// workload on worker processes, one device throttled to a fraction of its
// speed, run without EngineOptions::rebalance_slow and with it (and
// unthrottled, as the reference), interleaved over several rounds so that
// load on the machine hits every configuration alike. Prints wall-clock
// throughput per run, the ratios, and checks that every run produced the
// same outputs.
//
// Two throttles, both real. `worker` (the default): the device's worker
// stretches each compute segment of a step to 1/speed of its time (a
// down-clocked or throttled accelerator: it is slow on every share of work).
// `signals`: a SIGSTOP/SIGCONT duty cycle on the worker process
// (engine/throttle.h), as a CPU quota holds a process: a device whose share
// leaves it idle part of the time absorbs its stops while it waits, and the
// whole group stalls while it is stopped, so a smaller share gains little.
// Each stop is far shorter than the step deadline's floor, so the device is
// slow, never hung.

#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/engine_flags.h"
#include "cli/offline_bench.h"
#include "common/clock.h"
#include "engine/offline_run.h"
#include "engine/throttle.h"

namespace failsafe {

CommandFn RegisterSlowBench(CLI::App& app) {
  struct Opts {
    std::string model, cache_dir, placement = "nonuniform", throttle = "worker";
    int requests = 24, device = 1, devices = 2, rounds = 2, period_ms = 20;
    double length_scale = 0.05, speed = 0.5;
    bool json = false;
    DeviceFlags timeouts;
  };
  auto o = std::make_shared<Opts>();
  app.add_option("--model", o->model, "model directory (default: the synthetic small-llama)");
  app.add_option("--cache-dir", o->cache_dir, "where the default model is kept");
  app.add_option("--devices", o->devices)->capture_default_str();
  app.add_option("--placement", o->placement)->capture_default_str();
  app.add_option("--device", o->device, "device to throttle")->capture_default_str();
  app.add_option("--speed", o->speed, "fraction of each period the throttled device runs")
      ->capture_default_str();
  app.add_option("--period-ms", o->period_ms, "duty-cycle period (--throttle signals)")
      ->capture_default_str();
  app.add_option("--throttle", o->throttle,
                 "worker: the device stretches its compute to 1/speed; signals: a "
                 "SIGSTOP/SIGCONT duty cycle on its process")
      ->capture_default_str();
  app.add_option("--requests", o->requests, "requests (OpenThoughts-like lengths), all at once")
      ->capture_default_str();
  app.add_option("--length-scale", o->length_scale, "length scale of the workload")
      ->capture_default_str();
  app.add_option("--rounds", o->rounds, "rounds of the three configurations, interleaved")
      ->capture_default_str();
  app.add_flag("--json", o->json, "print the runs as one JSON object on the last line");
  AddTimeoutFlags(app, &o->timeouts);
  return [o] {
    if (o->speed <= 0 || o->speed > 1) return Fail("--speed must be in (0, 1]");
    if (o->device < 0 || o->device >= o->devices) return Fail("--device is not one of --devices");
    const bool signals = o->throttle == "signals";
    if (!signals && o->throttle != "worker") return Fail("--throttle must be worker or signals");
    auto in = LoadOfflineBenchInput(o->model, o->cache_dir, o->requests, o->length_scale);
    if (!in.ok()) return Fail(in.status().ToString());
    const std::string& dir = in->model_dir;
    const ModelConfig& config = in->config;
    const Workload& w = in->workload;
    if (signals) {
      std::printf(
          "%d devices (%s), %zu requests; device %d throttled to %.2f of each %d ms "
          "(SIGSTOP/SIGCONT)\n\n",
          o->devices, o->placement.c_str(), w.requests.size(), o->device, o->speed, o->period_ms);
    } else {
      std::printf(
          "%d devices (%s), %zu requests; device %d at %.2f of its compute speed (its worker "
          "stretches each compute segment)\n\n",
          o->devices, o->placement.c_str(), w.requests.size(), o->device, o->speed);
    }
    std::printf("%-6s %-14s %10s %10s %11s %8s %9s %s\n", "round", "run", "wall s", "tokens/s",
                "rebalances", "share", "rel speed", "outputs");
    struct Run {
      const char* name;
      bool throttled, rebalance;
    };
    const Run runs[] = {
        {"unthrottled", false, false}, {"slow", true, false}, {"slow+rebalance", true, true}};
    nlohmann::json rows = nlohmann::json::array();
    std::string digest;
    std::vector<double> sum_tps(3, 0);
    for (int round = 0; round < o->rounds; ++round) {
      for (int k = 0; k < 3; ++k) {
        const Run& run = runs[k];
        DeviceFlags df;
        df.devices = o->devices;
        df.placement = o->placement;
        df.max_step_tokens = 1024;
        df.max_seqs = 256;
        CopyTimeoutFlags(o->timeouts, &df);
        auto exec = MakeExecutor(dir, df);
        if (!exec.ok()) return Fail(exec.status().ToString());
        SchedulerConfig sc;
        sc.max_batch_tokens = 1024;
        sc.max_model_len = config.max_position_embeddings;
        EngineOptions eo;
        eo.rebalance_slow = run.rebalance;
        Engine engine(exec->get(), sc, eo);
        const pid_t pid = (*exec)->device_pid(o->device);
        if (pid <= 0) return Fail("the devices are not worker processes");
        if (run.throttled && !signals) {
          DeviceFaults* faults = FaultsOf(exec->get());
          if (!faults) return Fail("the devices cannot be slowed");
          if (Status st = faults->SetDeviceSpeed(o->device, o->speed); !st.ok())
            return Fail(st.ToString());
        }
        Result<RunSummary> s = [&] {
          ProcessThrottle throttle(pid, run.throttled && signals ? o->speed : 1.0, o->period_ms);
          return RunOffline(engine, w, {});
        }();
        if (!s.ok()) return Fail(s.status().ToString());
        if (digest.empty()) digest = s->output_digest;
        const bool same = s->output_digest == digest;
        int rebalances = 0;
        for (const RecoveryReport& r : s->recoveries) rebalances += r.rebalance;
        const double share = engine.device_speeds()[o->device].share;
        // The slowed device's speed over its peers' in the last full window.
        const double relative = engine.device_speeds()[o->device].relative_speed;
        sum_tps[k] += s->tokens_per_s();
        std::printf("%-6d %-14s %10.2f %10.1f %11d %8.3g %9.2f %s\n", round, run.name, s->wall_s,
                    s->tokens_per_s(), rebalances, share, relative, same ? "same" : "DIFFER");
        std::fflush(stdout);
        rows.push_back({{"round", round},
                        {"run", run.name},
                        {"wall_s", s->wall_s},
                        {"tokens_per_s", s->tokens_per_s()},
                        {"rebalances", rebalances},
                        {"share", share},
                        {"relative_speed", relative},
                        {"same_outputs", same}});
      }
    }
    std::printf(
        "\nmean tokens/s: unthrottled %.1f, slow %.1f (%.2fx), slow+rebalance %.1f (%.2fx); "
        "rebalancing recovers %.2fx over not rebalancing\n",
        sum_tps[0] / o->rounds, sum_tps[1] / o->rounds, sum_tps[1] / sum_tps[0],
        sum_tps[2] / o->rounds, sum_tps[2] / sum_tps[0], sum_tps[2] / sum_tps[1]);
    if (o->json) std::printf("%s\n", nlohmann::json{{"slow_device", rows}}.dump().c_str());
    return 0;
  };
}

}  // namespace failsafe
