// A chaos soak: the same workload again and again under seeded random
// SIGKILLs and rejoins (and kills during recoveries), each run checked against
// the fault-free run: every request completed once, outputs token-identical.
// With --shared-prefixes the prompts share leading blocks; with --prefix-cache
// on the chaos runs reuse them while the fault-free run computes everything,
// so a mismatch also catches a cached block whose KV differs.
#include <cstdio>

#include "cli/commands.h"
#include "cli/engine_flags.h"
#include "cli/model_cache.h"
#include "common/clock.h"
#include "common/rng.h"
#include "common/units.h"
#include "engine/faults.h"
#include "engine/offline_run.h"
#include "engine/worker_group.h"

namespace failsafe {

namespace {

Result<RunSummary> RunOnce(const std::string& model, int devices, Policy policy, RecoveryMode mode,
                           const Workload& w, const std::vector<FaultEvent>& faults, uint64_t seed,
                           const DeviceFlags& timeouts, bool prefix_cache) {
  WorkerGroupOptions o;
  FS_RETURN_IF_ERROR(ApplyTimeoutFlags(timeouts, &o));
  o.model_dir = model;
  o.num_devices = devices;
  o.policy = policy;
  o.backup_bytes = 256 << 20;
  o.max_step_tokens = 256;
  o.max_logits_rows = 128;
  o.max_seqs = 128;
  FS_ASSIGN_OR_RETURN(auto group, WorkerGroup::Start(o));
  SchedulerConfig sc;
  sc.max_batch_tokens = 256;
  sc.max_num_seqs = 128;
  sc.max_model_len = 4096;
  sc.prefix_cache = prefix_cache;
  EngineOptions eo;
  eo.recovery = mode;
  Rng rng(seed);
  WorkerGroup* g = group.get();
  eo.before_apply = [&rng, g](int attempt) {
    if (attempt == 1 && rng.Below(5) == 0) {
      const auto alive = g->alive_devices();
      if (alive.size() > 3) (void)g->KillDevice(alive[rng.Below(alive.size())]);
    }
  };
  Engine engine(group.get(), sc, eo);
  OfflineRunOptions ro;
  ro.faults = faults;
  ro.seed = 1;
  return RunOffline(engine, w, ro);
}

}  // namespace

CommandFn RegisterChaos(CLI::App& app) {
  struct Opts {
    std::string model, cache_dir, duration = "10min";
    int devices = 8, requests = 120, events = 30;
    uint64_t seed = 1;
    bool shared_prefixes = false;
    std::string prefix_cache = "off";
    DeviceFlags timeouts;
  };
  auto o = std::make_shared<Opts>();
  app.add_option("--model", o->model, "model directory (default: the synthetic tiny-llama)");
  app.add_option("--cache-dir", o->cache_dir, "where the default model is kept");
  app.add_option("--devices", o->devices)->capture_default_str();
  app.add_option("--duration", o->duration, "how long to keep going")->capture_default_str();
  app.add_option("--requests", o->requests, "requests per run")->capture_default_str();
  app.add_option("--events", o->events, "failures and rejoins per run")->capture_default_str();
  app.add_option("--seed", o->seed, "first chaos seed")->capture_default_str();
  app.add_flag("--shared-prefixes", o->shared_prefixes,
               "prompts share leading blocks (a few groups of common prefixes)");
  app.add_option("--prefix-cache", o->prefix_cache,
                 "on: the chaos runs reuse cached prefixes (the fault-free run never does)")
      ->capture_default_str();
  AddTimeoutFlags(app, &o->timeouts);
  return [o] {
    if (o->prefix_cache != "on" && o->prefix_cache != "off")
      return Fail("--prefix-cache: expected on or off");
    const bool cache = o->prefix_cache == "on";
    auto dir = ResolveModel(o->model, o->cache_dir, "tiny-llama");
    if (!dir.ok()) return Fail(dir.status().ToString());
    auto duration = ParseDuration(o->duration);
    if (!duration.ok()) return Fail(duration.status().ToString());
    Workload w;
    Rng wr(o->seed);
    for (int i = 0; i < o->requests; ++i) {
      w.requests.push_back(
          {0.001 * i, 4 + static_cast<int>(wr.Below(300)), 4 + static_cast<int>(wr.Below(60))});
      if (!o->shared_prefixes) continue;
      // One of four prefixes of up to 6 blocks of 32 tokens, then its own blocks.
      WorkloadRequest& r = w.requests.back();
      r.block_tokens = 32;
      const int64_t group = static_cast<int64_t>(wr.Below(4));
      const int shared = 1 + static_cast<int>(wr.Below(6));
      for (int b = 0; b * r.block_tokens < r.input_len; ++b)
        r.hash_ids.push_back(b < shared ? group * 100 + b : 1000000 + i * 100LL + b);
    }
    auto want = RunOnce(*dir, o->devices, Policy::kHybrid, RecoveryMode::kFull, w, {}, 0,
                        o->timeouts, false);
    if (!want.ok()) return Fail(want.status().ToString());
    std::printf("fault-free: %d requests, %lld output tokens, digest %s\n",
                want->requests_completed, static_cast<long long>(want->output_tokens),
                want->output_digest.c_str());
    const int64_t end = MonotonicNanos() + static_cast<int64_t>(*duration * 1e9);
    int runs = 0, recoveries = 0;
    for (uint64_t seed = o->seed; MonotonicNanos() < end; ++seed) {
      const Policy policy = seed % 2 ? Policy::kHybrid : Policy::kCyclic;
      const RecoveryMode mode = seed % 3 == 0 ? RecoveryMode::kHost : RecoveryMode::kFull;
      auto faults = ChaosSchedule(seed, o->devices, 3, o->events, 4);
      auto got = RunOnce(*dir, o->devices, policy, mode, w, faults, seed, o->timeouts, cache);
      if (!got.ok()) return Fail(fmt::format("seed {}: {}", seed, got.status().ToString()));
      const bool same = got->requests_completed == want->requests_completed &&
                        got->requests_failed == 0 && got->output_digest == want->output_digest;
      ++runs;
      recoveries += static_cast<int>(got->recoveries.size());
      std::printf(
          "seed %llu (%s, %s): %d recoveries, %d completed, %.0f%% prefix blocks hit, "
          "digest %s %s\n",
          static_cast<unsigned long long>(seed), PolicyName(policy), RecoveryModeName(mode),
          static_cast<int>(got->recoveries.size()), got->requests_completed,
          100 * got->prefix.hit_rate(), got->output_digest.c_str(), same ? "ok" : "MISMATCH");
      std::fflush(stdout);
      if (!same) return 1;
    }
    std::printf("%d runs, %d recoveries, every output identical to the fault-free run\n", runs,
                recoveries);
    return 0;
  };
}

}  // namespace failsafe
