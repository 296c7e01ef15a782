// `failsafe simulate NAME`: the paper's experiments on the cluster simulator
// (src/sim), and `validate`, which checks the simulator against this
// machine's real engine: it fits a CPU profile on a calibration run of the
// real engine, then simulates the ablation configurations of `failsafe
// ablation` and compares with their measured emulated throughput.
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/engine_flags.h"
#include "cli/model_cache.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/units.h"
#include "engine/offline_run.h"
#include "sim/chaos.h"
#include "sim/experiments.h"
#include "sim/fit.h"
#include "sim/report.h"
#include "trace/workload.h"

namespace failsafe {

namespace {

struct ValidateOptions {
  std::string model_dir, cache_dir, data_dir, out_dir, device_memory = "300MiB";
  int requests = 24, max_batch_tokens = 1024, max_num_seqs = 256;
  double prefill_scale = 0.05, decode_scale = 0.05;
  std::string workloads = "prefill,decode";
  DeviceFlags timeouts;
};

struct RealRun {
  RunSummary summary;
  Plan plan;
  std::vector<StepPlan> steps;
  std::vector<double> step_seconds;
  std::vector<int64_t> kv_pages;
  int block_size = 16;
};

struct EngineConfig {
  const char* name;
  int devices;
  int alive;
  const char* placement;
  const char* router;
  const char* prefill;
  const char* device_memory = nullptr;  // default: --device-memory
};

// The ablation's configurations (cli/ablation_cmd.cc), and the calibration
// one: two devices, standard TP.
// Two devices hold half the model each: they get room for it.
const EngineConfig kCalibration = {"TP2 (calibration)", 2,      2,     "standard",
                                   "round-robin",       "fifo", "1GiB"};
const EngineConfig kAblation[] = {
    {"TP4 (standard, 7 alive)", 7, 7, "standard", "round-robin", "fifo"},
    {"+ nonuniform TP7", 7, 7, "nonuniform", "round-robin", "fifo"},
    {"+ memory balancing (cyclic)", 7, 7, "cyclic", "round-robin", "fifo"},
    {"+ compute balancing (FailSafe)", 7, 7, "hybrid", "load-aware", "adaptive"},
    {"TP8 fault-free (standard, 8)", 8, 8, "standard", "round-robin", "fifo"},
};

SchedulerConfig SchedulerFor(const EngineConfig& c, const ValidateOptions& o,
                             const ModelConfig& m) {
  return *MakeSchedulerConfig(c.router, c.prefill, o.max_batch_tokens, o.max_num_seqs,
                              m.max_position_embeddings);
}

Result<RealRun> RunReal(const std::string& dir, const ModelConfig& m, const EngineConfig& c,
                        const ValidateOptions& o, const Workload& w) {
  DeviceFlags df;
  df.devices = c.devices;
  df.placement = c.placement;
  df.device_memory = c.device_memory != nullptr ? c.device_memory : o.device_memory;
  df.max_step_tokens = o.max_batch_tokens;
  df.max_seqs = o.max_num_seqs;
  CopyTimeoutFlags(o.timeouts, &df);
  FS_ASSIGN_OR_RETURN(auto exec, MakeExecutor(dir, df));
  Engine engine(exec.get(), SchedulerFor(c, o, m));
  RealRun run;
  run.plan = exec->plan();
  run.kv_pages = exec->kv_capacity_pages();
  run.block_size = exec->block_size();
  OfflineRunOptions ro;
  ro.on_step = [&](const StepOutcome& out) {
    run.steps.push_back(out.plan);
    run.step_seconds.push_back(out.timing.emulated_ns * 1e-9);
  };
  FS_ASSIGN_OR_RETURN(run.summary, RunOffline(engine, w, ro));
  return run;
}

struct SimRun {
  double emulated_s = 0;
  int64_t steps = 0, preemptions = 0;
};

// The same run on the simulator: the same plan, KV pools, scheduler and
// requests; step times from the cost model under `hw`.
Result<SimRun> RunSim(const ModelConfig& m, const HardwareProfile& hw, const EngineConfig& c,
                      const ValidateOptions& o, const RealRun& real, const Workload& w) {
  InstanceConfig ic;
  ic.model = m;
  ic.hw = hw;
  FS_ASSIGN_OR_RETURN(ic.policy, ParsePolicy(c.placement));
  ic.num_devices = c.devices;
  ic.sched = SchedulerFor(c, o, m);
  ic.block_size = real.block_size;
  ic.kv_pages = real.kv_pages;
  ic.scheduler_speed = DeviceSpeed();  // what the real engine's scheduler assumes
  FS_ASSIGN_OR_RETURN(auto inst, SimInstance::Create(ic));
  for (const WorkloadRequest& r : w.requests) {
    FS_RETURN_IF_ERROR(inst->Submit({r.arrival_s, r.input_len, r.output_len, false}));
  }
  inst->RunToCompletion(1e9);
  SimRun s;
  s.emulated_s = inst->last_step_end();
  s.steps = inst->steps();
  s.preemptions = inst->preemptions();
  return s;
}

// Requests of every shape the calibration needs: short and long prompts
// (prefill chunks of many sizes), then decode batches shrinking from 24 to
// 1 over short and long contexts.
Workload CalibrationWorkload() {
  Workload w;
  w.description = "calibration";
  const int inputs[] = {16, 60, 200, 500, 1000, 2000};
  const int outputs[] = {6, 20, 45, 70};
  for (int out : outputs) {
    for (int in : inputs) w.requests.push_back({0, in, out});
  }
  return w;
}

// One row per measured step: its shape, measured and predicted time.
void AddStepRows(const std::string& workload, const std::string& config,
                 const std::vector<StepSample>& samples, const std::vector<double>& ratios,
                 std::vector<std::vector<std::string>>* rows) {
  for (size_t i = 0; i < samples.size(); ++i) {
    const StepPlan& s = samples[i].step;
    int64_t context = 0;
    for (const ScheduledSeq& q : s.seqs) context += q.start + q.num_tokens;
    rows->push_back({workload, config, std::to_string(i), std::to_string(s.prefill_tokens),
                     std::to_string(s.decode_tokens), std::to_string(s.seqs.size()),
                     std::to_string(context), Num(samples[i].seconds * 1e3, 5),
                     Num(samples[i].seconds * ratios[i] * 1e3, 5)});
  }
}

int RunValidate(const ValidateOptions& o, bool json_out) {
  const int64_t wall0 = MonotonicNanos();
  auto dir = ResolveModel(o.model_dir, o.cache_dir, "small-llama");
  if (!dir.ok()) return Fail(dir.status().ToString());
  auto m = ModelConfig::Load(*dir);
  if (!m.ok()) return Fail(m.status().ToString());
  auto start = GetHardwareProfile("cpu");
  if (!start.ok()) return Fail(start.status().ToString());

  // 1) Calibration on the real engine, then the fit.
  std::printf("calibration: %s, %d-device worker group, every step measured\n", kCalibration.name,
              kCalibration.devices);
  std::fflush(stdout);
  const Workload calib = CalibrationWorkload();
  auto cal = RunReal(*dir, *m, kCalibration, o, calib);
  if (!cal.ok()) return Fail("calibration: " + cal.status().ToString());
  std::vector<StepSample> samples;
  for (size_t i = 0; i < cal->steps.size(); ++i)
    samples.push_back({0, cal->steps[i], cal->step_seconds[i]});
  auto fit = FitProfile(*m, *start, {cal->plan}, samples);
  if (!fit.ok()) return Fail(fit.status().ToString());
  const HardwareProfile& hw = fit->profile;
  std::vector<std::vector<std::string>> step_rows;
  AddStepRows("calibration", kCalibration.name, samples,
              PredictionRatios(*m, hw, {cal->plan}, samples), &step_rows);
  std::printf(
      "fitted on %d steps: GEMM %.1f GFLOP/s (half rate at %.0f rows), streamed GEMM (<= %d "
      "rows) %.1f GFLOP/s, attention %.1f GFLOP/s, bandwidth %.1f GB/s, %.0f us per segment; "
      "step error %.1f%% mean, %.3f rms log\n\n",
      fit->samples, hw.peak_flops * hw.gemm_efficiency / 1e9, hw.gemm_half_rows, hw.gemv_max_rows,
      hw.peak_flops * hw.gemv_efficiency / 1e9, hw.peak_flops * hw.attention_efficiency / 1e9,
      hw.hbm_bytes_per_s * hw.bandwidth_efficiency / 1e9, hw.segment_overhead_s * 1e6,
      fit->mean_abs_error * 100, fit->rms_log_error);

  // 2) The ablation configurations, real and simulated.
  std::printf("%-10s %-32s %12s %12s %8s %12s %13s %13s\n", "workload", "configuration",
              "real tok/s", "sim tok/s", "error", "step error", "steps r/s", "preempt r/s");
  std::fflush(stdout);
  nlohmann::json rows = nlohmann::json::array();
  std::vector<std::vector<std::string>> csv;
  double worst = 0;
  for (std::string kind : {"prefill", "decode"}) {
    if (o.workloads.find(kind) == std::string::npos) continue;
    WorkloadOptions wo;
    wo.max_requests = o.requests;
    wo.max_context = m->max_position_embeddings;
    wo.length_scale = kind == "prefill" ? o.prefill_scale : o.decode_scale;
    wo.skip_invalid = true;
    auto w =
        LoadWorkload(kind == "prefill" ? "mooncake" : "openthoughts", FindDataDir(o.data_dir), wo);
    if (!w.ok()) return Fail(w.status().ToString());
    for (auto& r : w->requests) r.arrival_s = 0;
    for (const EngineConfig& c : kAblation) {
      auto real = RunReal(*dir, *m, c, o, *w);
      if (!real.ok()) return Fail(std::string(c.name) + ": " + real.status().ToString());
      auto sim = RunSim(*m, hw, c, o, *real, *w);
      if (!sim.ok()) return Fail(std::string(c.name) + " (simulated): " + sim.status().ToString());
      const double tokens =
          static_cast<double>(real->summary.input_tokens + real->summary.output_tokens);
      const double real_tps = real->summary.emulated_tokens_per_s();
      const double sim_tps = tokens / sim->emulated_s;
      const double err = sim_tps / real_tps - 1;
      // The cost model alone: the real run's own steps, replayed.
      std::vector<StepSample> replay;
      for (size_t i = 0; i < real->steps.size(); ++i)
        replay.push_back({0, real->steps[i], real->step_seconds[i]});
      double step_err = 0;
      const std::vector<double> ratios = PredictionRatios(*m, hw, {real->plan}, replay);
      for (double r : ratios) step_err += std::fabs(r - 1);
      AddStepRows(kind, c.name, replay, ratios, &step_rows);
      step_err /= std::max<size_t>(1, replay.size());
      worst = std::max(worst, std::fabs(err));
      std::printf("%-10s %-32s %12.1f %12.1f %+7.1f%% %11.1f%% %6d/%-6lld %6d/%-6lld\n",
                  kind.c_str(), c.name, real_tps, sim_tps, err * 100, step_err * 100,
                  real->summary.steps, static_cast<long long>(sim->steps),
                  real->summary.preemptions, static_cast<long long>(sim->preemptions));
      std::fflush(stdout);
      rows.push_back({{"workload", kind},
                      {"configuration", c.name},
                      {"real_tokens_per_s", real_tps},
                      {"sim_tokens_per_s", sim_tps},
                      {"error", err},
                      {"step_mean_abs_error", step_err},
                      {"real_steps", real->summary.steps},
                      {"sim_steps", sim->steps},
                      {"real_preemptions", real->summary.preemptions},
                      {"sim_preemptions", sim->preemptions}});
      csv.push_back(
          {kind, c.name, Num(real_tps, 6), Num(sim_tps, 6), Num(err, 4), Num(step_err, 4)});
    }
  }
  if (!o.out_dir.empty()) {
    Status st = MakeDirs(o.out_dir);
    if (st.ok()) {
      st = WriteCsv(o.out_dir + "/validate.csv",
                    {"workload", "configuration", "real_tokens_per_s", "sim_tokens_per_s", "error",
                     "step_error"},
                    csv);
    }
    if (st.ok()) {
      st = WriteCsv(o.out_dir + "/validate_steps.csv",
                    {"workload", "configuration", "step", "prefill_tokens", "decode_tokens",
                     "sequences", "context_tokens", "measured_ms", "predicted_ms"},
                    step_rows);
    }
    if (!st.ok()) return Fail(st.ToString());
  }
  const double seconds = (MonotonicNanos() - wall0) * 1e-9;
  std::printf("\nworst throughput error %.1f%% (%.0f s)\n", worst * 100, seconds);
  if (json_out) {
    nlohmann::json j = {{"fitted",
                         {{"gemm_gflops", hw.peak_flops * hw.gemm_efficiency / 1e9},
                          {"gemm_half_rows", hw.gemm_half_rows},
                          {"streamed_gemm_gflops", hw.peak_flops * hw.gemv_efficiency / 1e9},
                          {"attention_gflops", hw.peak_flops * hw.attention_efficiency / 1e9},
                          {"bandwidth_gbs", hw.hbm_bytes_per_s * hw.bandwidth_efficiency / 1e9},
                          {"segment_overhead_us", hw.segment_overhead_s * 1e6},
                          {"calibration_steps", fit->samples},
                          {"calibration_step_error", fit->mean_abs_error}}},
                        {"configurations", rows},
                        {"worst_abs_error", worst}};
    std::printf("%s\n", j.dump().c_str());
  }
  return 0;
}

}  // namespace

CommandFn RegisterSimulate(CLI::App& app) {
  struct Opts {
    std::string name;
    ExperimentOptions e;
    ValidateOptions v;
    ChaosOptions c;
    std::string chaos_recovery = "full";
    std::string switch_delay = "0s", step_period = "300s";
    std::string ttft_slo = "10s", tbt_slo = "25ms";
    bool json = false;
  };
  auto o = std::make_shared<Opts>();
  app.add_option("name", o->name,
                 "offline-gcp, online, tp-sweep, design, ablation, recovery (the paper's "
                 "experiments at 8xH100 scale), prefix-cache, slow-device (what rebalancing a slow "
                 "device buys), "
                 "or "
                 "validate (the simulator against this machine's engine), or chaos (seeded "
                 "faults against the engine in virtual time)")
      ->required();
  app.add_option("--model", o->e.model, "llama-3.1-70b or mixtral-8x22b")->capture_default_str();
  app.add_option("--hardware", o->e.hardware, "hardware profile")->capture_default_str();
  app.add_option("--out", o->e.out_dir, "where CSV files and plots go")->capture_default_str();
  app.add_option("--data-dir", o->e.data_dir, "where the traces live");
  app.add_option("--requests", o->e.requests_file,
                 "a Mooncake-format JSONL request trace (default: the Mooncake conversation "
                 "trace); offline-gcp takes its lengths");
  app.add_option("--availability", o->e.availability_file,
                 "offline-gcp: an availability trace, 'YYYY-MM-DD, HH:MM:SS, count' rows or "
                 "'ms,add|remove,node' events (default: the GCP A100 trace)");
  app.add_option("--availability-scale", o->e.availability_scale,
                 "offline-gcp: peak (the trace's peak is the whole cluster) or none (counts are "
                 "GPUs; more than the cluster is an error)")
      ->capture_default_str();
  app.add_option("--nodes", o->e.nodes, "offline-gcp: nodes in the cluster")->capture_default_str();
  app.add_option("--gpus-per-node", o->e.gpus_per_node, "offline-gcp: GPUs per node")
      ->capture_default_str();
  app.add_option("--mode", o->e.offline_mode,
                 "offline-gcp: steady (each node's steady throughput composed over the trace) or "
                 "step (also the whole trace step by step through the simulated engines: both "
                 "reported)")
      ->capture_default_str();
  app.add_option("--switch-delay", o->switch_delay,
                 "offline-gcp: a fixed stall added to every reconfiguration of every system, e.g. "
                 "10s (the paper's)")
      ->capture_default_str();
  app.add_option("--ttft-slo", o->ttft_slo, "online: the prefill target, P90 time to first token")
      ->capture_default_str();
  app.add_option("--tbt-slo", o->tbt_slo,
                 "online: the decode target, P90 time per output token (the paper's 40ms is "
                 "reported beside it)")
      ->capture_default_str();
  app.add_option("--step-period", o->step_period,
                 "offline-gcp step: time skipped at once is whole periods of this (an instance "
                 "skips after each pass through the workload it measures, from 10 minutes after "
                 "its last change)")
      ->capture_default_str();
  app.add_flag("!--no-skip", o->e.skip_steady,
               "offline-gcp step: run every step (no time skipped after measured passes)");
  app.add_option("--slow-speed", o->e.slow_speed,
                 "slow-device: the slow device's speed relative to its peers, (0, 1]")
      ->capture_default_str();
  app.add_option("--seed", o->e.seed,
                 "placement of failures on nodes; chaos: the schedule of faults and requests")
      ->capture_default_str();
  app.add_flag("--quick", o->e.quick, "fewer requests and rates (a smoke run)");
  app.add_flag("--json", o->json, "print the headline figures as one JSON object on the last line");
  auto* v = app.add_option_group("validate");
  v->add_option("--engine-model", o->v.model_dir,
                "validate: model directory (default: the synthetic small-llama)");
  v->add_option("--cache-dir", o->v.cache_dir, "validate: where the default model is kept");
  v->add_option("--validate-requests", o->v.requests, "validate: requests per run")
      ->capture_default_str();
  v->add_option("--device-memory", o->v.device_memory, "validate: memory of one device")
      ->capture_default_str();
  v->add_option("--workloads", o->v.workloads, "validate: prefill, decode or both")
      ->capture_default_str();
  v->add_option("--prefill-scale", o->v.prefill_scale, "validate: Mooncake length scale")
      ->capture_default_str();
  v->add_option("--decode-scale", o->v.decode_scale, "validate: OpenThoughts-like length scale")
      ->capture_default_str();
  AddTimeoutFlags(*v, &o->v.timeouts);
  auto* c = app.add_option_group("chaos");
  c->add_option("--faults", o->c.faults, "chaos: faults to inject")->capture_default_str();
  c->add_option("--fault-gap", o->c.mean_fault_gap_s, "chaos: mean virtual seconds between faults")
      ->capture_default_str();
  c->add_option("--requests-per-fault", o->c.requests_per_fault,
                "chaos: mean requests arriving between faults")
      ->capture_default_str();
  c->add_flag("--prefix-cache", o->c.prefix_cache,
              "chaos: the prefix cache and its host tier on, two requests in three sharing a "
              "prefix");
  c->add_option("--recovery", o->chaos_recovery, "chaos: recompute, host, full or oracle")
      ->capture_default_str();
  c->add_option("--backup-bytes", o->c.backup_bytes,
                "chaos: host memory for the KV backup (0: all of the KV)")
      ->capture_default_str();
  return [o] {
    if (o->name == "chaos") {
      o->c.seed = o->e.seed;
      o->c.model = o->e.model;
      o->c.hardware = o->e.hardware;
      auto mode = ParseRecoveryMode(o->chaos_recovery);
      if (!mode.ok()) return Fail(mode.status().ToString());
      o->c.recovery = *mode;
      // The engine logs every fault it meets: thousands of expected lines.
      // Only debug logging keeps them.
      if (GetLogLevel() != LogLevel::kDebug) SetLogLevel(LogLevel::kOff);
      auto r = RunChaos(o->c);
      if (!r.ok()) return Fail(r.status().ToString());
      std::printf("%s", r->ToText().c_str());
      if (o->json) std::printf("%s\n", r->ToJson().c_str());
      return r->violations == 0 ? 0 : 1;
    }
    if (o->name == "validate") {
      o->v.data_dir = o->e.data_dir;
      o->v.out_dir = o->e.out_dir;
      return RunValidate(o->v, o->json);
    }
    auto delay = ParseDuration(o->switch_delay);
    if (!delay.ok()) return Fail("--switch-delay: " + delay.status().ToString());
    o->e.switch_delay_s = *delay;
    for (auto [text, flag, out] : {std::tuple{&o->ttft_slo, "--ttft-slo", &o->e.ttft_slo_s},
                                   std::tuple{&o->tbt_slo, "--tbt-slo", &o->e.tbt_slo_s}}) {
      auto slo = ParseDuration(*text);
      if (!slo.ok()) return Fail(std::string(flag) + ": " + slo.status().ToString());
      if (!(*slo > 0)) return Fail(std::string(flag) + " must be positive");
      *out = *slo;
    }
    auto period = ParseDuration(o->step_period);
    if (!period.ok()) return Fail("--step-period: " + period.status().ToString());
    o->e.step_period_s = *period;
    const int64_t t0 = MonotonicNanos();
    auto r = RunExperiment(o->name, o->e);
    if (!r.ok()) return Fail(r.status().ToString());
    (*r)["experiment"] = o->name;
    (*r)["model"] = o->e.model;
    (*r)["hardware"] = o->e.hardware;
    (*r)["wall_s"] = (MonotonicNanos() - t0) * 1e-9;
    std::printf("%s: results in %s/\n", o->name.c_str(), o->e.out_dir.c_str());
    if (o->json) {
      std::printf("%s\n", r->dump().c_str());
    } else {
      std::printf("%s\n", r->dump(2).c_str());
    }
    return 0;
  };
}

}  // namespace failsafe
