// The paper's recovery experiment: N devices, a decode-heavy run, one device
// killed mid-run, each recovery mode in turn. Prints the recovery latency
// breakdown, ratios to `recompute`, the P90/P99 of each request's longest
// gap between tokens, and the steady state: decode throughput before the
// failure and after the recovery, beside N - 1 devices started fresh.
//
// On CPU devices the run's clock is emulated (one core per device); on GPUs
// (--gpus) it is the wall clock. With --prompt-tokens the requests are all
// alike (the paper's setting: every sequence holds that many positions when
// the device dies); --fail-decode-step then places the failure that many
// steps into the decode, once every prompt is in. Exits 1 if a run's
// outputs differ from the fault-free run's or a request failed.
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>

#include "cli/commands.h"
#include "cli/engine_flags.h"
#include "cli/offline_bench.h"
#include "engine/offline_run.h"

namespace failsafe {
namespace {

// Decode throughput over a window of steps that only decode.
struct Window {
  int steps = 0;
  int64_t tokens = 0;
  int64_t wall_ns = 0;
  double tokens_per_s() const { return wall_ns > 0 ? tokens * 1e9 / wall_ns : 0; }
  nlohmann::json Json() const {
    return {{"steps", steps}, {"tokens", tokens}, {"tokens_per_s", tokens_per_s()}};
  }
};

// What one run's steps say: where decode began (every prompt in), and the
// decode-only steps before the failure (in a run with no fault, the first
// ones) and after the recovery.
struct StepLog {
  int fail_step = -1;    // the step index the fault was due at (-1: none)
  int window = 16;       // steps per throughput window
  bool wall = false;     // windows on the wall clock (else emulated)
  int steps = 0;         // steps that ran
  int decode_from = -1;  // the first step with no prefill once every request is in
  int after_skip = 2;    // decode-only steps after the recovery left out (transients)
  Window before, after;

  // all_in: no request waits to be admitted; recovered: the engine has
  // recovered from a failure and resumed.
  void Add(const StepOutcome& out, bool all_in, bool recovered) {
    const int s = steps++;
    const bool decode_only = out.plan.prefill_tokens == 0 && out.plan.decode_tokens > 0;
    if (decode_from < 0 && decode_only && all_in) decode_from = s;
    if (!decode_only || decode_from < 0) return;
    auto take = [&](Window* w) {
      if (w->steps >= window) return;
      ++w->steps;
      w->tokens += out.plan.decode_tokens;
      w->wall_ns += wall ? out.timing.wall_ns : out.timing.emulated_ns;
    };
    if (!recovered) {
      if (fail_step < 0 || (s >= fail_step - window && s < fail_step)) take(&before);
    } else if (after_skip > 0) {
      --after_skip;
    } else {
      take(&after);
    }
  }
};

}  // namespace

CommandFn RegisterRecoveryBench(CLI::App& app) {
  struct Opts {
    std::string model, cache_dir, modes = "recompute,host,full", clock = "auto";
    int requests = 32, fail_step = 120, device = 3, devices = 8;
    int prompt_tokens = 0, output_tokens = 256, fail_decode_step = -1, window = 16;
    int max_step_tokens = 1024;
    double length_scale = 0.05;
    bool json = false, fresh = false;
    DeviceFlags dev;
  };
  auto o = std::make_shared<Opts>();
  app.add_option("--model", o->model, "model directory (default: the synthetic small-llama)");
  app.add_option("--cache-dir", o->cache_dir, "where the default model is kept");
  app.add_option("--devices", o->devices)->capture_default_str()->check(CLI::Range(2, 64));
  AddPlacementFlag(app, &o->dev);
  app.add_option("--requests", o->requests, "requests, all arriving at once")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  app.add_option("--length-scale", o->length_scale,
                 "without --prompt-tokens: the requests' lengths are OpenThoughts-like "
                 "(decode-heavy), scaled by this")
      ->capture_default_str();
  app.add_option("--prompt-tokens", o->prompt_tokens,
                 "every request this many prompt tokens (0: OpenThoughts-like lengths)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  app.add_option("--output-tokens", o->output_tokens,
                 "with --prompt-tokens: tokens each request generates")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--fail-step", o->fail_step, "step during which the device is killed")
      ->capture_default_str();
  app.add_option("--fail-decode-step", o->fail_decode_step,
                 "kill the device this many steps after decoding began with every request in "
                 "(found by the fault-free run; overrides --fail-step)")
      ->capture_default_str();
  app.add_option("--device", o->device, "device to kill")->capture_default_str();
  app.add_option("--modes", o->modes, "recovery modes to run")->capture_default_str();
  app.add_option("--window", o->window,
                 "decode-only steps per throughput window (before the failure, after the "
                 "recovery, and --fresh)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  app.add_flag("--fresh", o->fresh,
               "also run --devices - 1 devices started fresh, no failure: the steady state "
               "the survivors are measured against");
  app.add_option("--max-step-tokens", o->max_step_tokens, "tokens per step (chunked prefill)")
      ->capture_default_str()
      ->check(CLI::Range(16, 1 << 20));
  app.add_option("--clock", o->clock,
                 "the run's clock: emulated (one core per device), wall, or auto (wall on GPUs)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "emulated", "wall"}));
  app.add_flag("--json", o->json, "print the table as one JSON object on the last line");
  AddKvDtypeFlag(app, &o->dev);
  AddBackupMemoryFlag(app, &o->dev);
  AddGpuFlags(app, &o->dev);
  AddTimeoutFlags(app, &o->dev);
  return [o] {
    auto in = LoadOfflineBenchInput(o->model, o->cache_dir, o->requests, o->length_scale);
    if (!in.ok()) return Fail(in.status().ToString());
    const std::string& dir = in->model_dir;
    const ModelConfig& config = in->config;
    Workload w = in->workload;
    if (o->prompt_tokens > 0) {
      if (o->prompt_tokens + o->output_tokens > config.max_position_embeddings) {
        return Fail(
            fmt::format("--prompt-tokens {} + --output-tokens {} exceed the model's {} "
                        "positions",
                        o->prompt_tokens, o->output_tokens, config.max_position_embeddings));
      }
      w.requests.assign(o->requests, WorkloadRequest{});
      for (WorkloadRequest& r : w.requests) {
        r.input_len = o->prompt_tokens;
        r.output_len = o->output_tokens;
      }
    }
    if (o->device < 0 || o->device >= o->devices)
      return Fail(fmt::format("--device {}: not one of the {} devices", o->device, o->devices));
    const bool wall = o->clock == "wall" || (o->clock == "auto" && !o->dev.gpus.empty());
    std::vector<std::string> modes = {"none"};
    for (size_t p = 0; p <= o->modes.size();) {
      size_t q = o->modes.find(',', p);
      if (q == std::string::npos) q = o->modes.size();
      modes.push_back(o->modes.substr(p, q - p));
      p = q + 1;
    }
    if (o->fresh) modes.push_back("fresh");
    std::printf("%d devices%s, %zu requests%s, device %d killed ", o->devices,
                o->dev.gpus.empty() ? "" : fmt::format(" on GPUs {}", o->dev.gpus).c_str(),
                w.requests.size(),
                o->prompt_tokens > 0
                    ? fmt::format(" of {} + {} tokens", o->prompt_tokens, o->output_tokens).c_str()
                    : " (decode-heavy)",
                o->device);
    if (o->fail_decode_step >= 0) {
      std::printf("%d steps into the decode", o->fail_decode_step);
    } else {
      std::printf("during step %d", o->fail_step);
    }
    std::printf(", %s clock\n\n", wall ? "wall" : "emulated");
    std::printf("%-10s %10s %8s %8s %8s %8s %10s %12s %10s %12s %10s %9s %9s %9s\n", "mode",
                "total ms", "vs rec.", "detect", "abort", "replan", "weights", "weight MiB",
                "KV rest.", "recompute", "tokens", "TBT p50", "TBT p90", "TBT p99");
    nlohmann::json rows = nlohmann::json::array();
    double recompute_total = 0;
    std::string digest;
    bool all_same = true;
    int fail_step = o->fail_step;
    struct Steady {
      std::string mode;
      Window before, after;
    };
    std::vector<Steady> steady;
    std::optional<Window> fresh_window;
    for (const std::string& m : modes) {
      const bool fresh = m == "fresh";
      DeviceFlags df = o->dev;
      df.devices = fresh ? o->devices - 1 : o->devices;
      // Device processes even for one, with the measured runs' budgets.
      df.processes = true;
      if (fresh && df.gpus.find(',') != std::string::npos) {
        // One id per device: the first devices - 1 of them.
        df.gpus.resize(df.gpus.rfind(','));
      }
      df.recovery = m == "none" || fresh ? "full" : m;
      df.max_step_tokens = o->max_step_tokens;
      df.max_seqs = std::max(256, o->requests);
      auto mode = ParseDeviceRecoveryMode(df.recovery);
      if (!mode.ok()) return Fail("--modes: " + mode.status().message());
      auto exec = MakeExecutor(dir, df);
      if (!exec.ok()) return Fail(exec.status().ToString());
      SchedulerConfig sc;
      sc.max_batch_tokens = o->max_step_tokens;
      sc.max_num_seqs = df.max_seqs;
      sc.max_model_len = config.max_position_embeddings;
      EngineOptions eo;
      eo.recovery = *mode;
      Engine engine(exec->get(), sc, eo);
      const bool faulty = m != "none" && !fresh;
      StepLog log;
      log.window = o->window;
      log.fail_step = faulty ? fail_step : -1;
      log.wall = wall;
      OfflineRunOptions ro;
      ro.wall_clock = wall;
      if (faulty) ro.faults = {{false, o->device, fail_step, -1}};
      ro.on_step = [&](const StepOutcome& out) {
        const auto& rec = engine.recoveries();
        log.Add(out, engine.scheduler().num_waiting() == 0, !rec.empty() && rec.front().resumed());
      };
      auto s = RunOffline(engine, w, ro);
      if (!s.ok()) return Fail(s.status().ToString());
      if (m == "none" && o->fail_decode_step >= 0) {
        if (log.decode_from < 0)
          return Fail("the fault-free run never decoded with every request in");
        fail_step = log.decode_from + o->fail_decode_step;
      }
      if (fresh) {
        fresh_window = log.before;
        continue;
      }
      if (digest.empty()) digest = s->output_digest;
      const bool same = s->output_digest == digest;
      all_same = all_same && same && s->requests_failed == 0;
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
      if (faulty) steady.push_back({m, log.before, log.after});
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
           {"output_digest", s->output_digest},
           {"same_outputs", same},
           {"decode_before", log.before.Json()},
           {"decode_after", log.after.Json()}});
    }
    std::printf("\ndecode throughput (tokens/s over %d decode-only steps, %s clock)\n", o->window,
                wall ? "wall" : "emulated");
    std::printf("%-10s %12s %12s %8s%s\n", "mode", "before", "after", "after/before",
                fresh_window ? "   after/fresh" : "");
    for (const Steady& st : steady) {
      const double b = st.before.tokens_per_s(), a = st.after.tokens_per_s();
      std::printf("%-10s %12.1f %12.1f %12.2f", st.mode.c_str(), b, a, b > 0 ? a / b : 0.0);
      if (fresh_window && fresh_window->tokens_per_s() > 0)
        std::printf(" %14.2f", a / fresh_window->tokens_per_s());
      std::printf("\n");
    }
    if (fresh_window) {
      std::printf("%-10s %12s %12.1f   (%d devices started fresh)\n", "fresh", "",
                  fresh_window->tokens_per_s(), o->devices - 1);
    }
    if (o->json) {
      nlohmann::json j{{"recovery", rows}, {"fail_step", fail_step}, {"wall_clock", wall}};
      if (fresh_window) j["fresh"] = fresh_window->Json();
      std::printf("%s\n", j.dump().c_str());
    }
    if (!all_same) {
      std::fprintf(stderr, "outputs differ from the fault-free run, or requests failed\n");
      return 1;
    }
    return 0;
  };
}

}  // namespace failsafe
