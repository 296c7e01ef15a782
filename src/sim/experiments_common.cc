// Shared parts of the experiments: workloads, system presets, saturated
// throughput.
#include <algorithm>

#include "common/log.h"
#include "sim/experiments.h"
#include "sim/experiments_internal.h"
#include "trace/workload.h"

namespace failsafe {

namespace {

Result<Workload> RequestTrace(const ExperimentOptions& o, int max_requests) {
  WorkloadOptions wo;
  wo.max_requests = max_requests;
  const std::string name = o.requests_file.empty() ? "mooncake" : o.requests_file;
  FS_ASSIGN_OR_RETURN(Workload w, LoadWorkload(name, FindDataDir(o.data_dir), wo));
  if (w.requests.empty()) return InvalidArgument("{}: no requests", w.description);
  return w;
}

}  // namespace

Result<std::vector<SimRequest>> MooncakeRequests(const ExperimentOptions& o, int first, int count) {
  FS_ASSIGN_OR_RETURN(Workload w, RequestTrace(o, first + count));
  // A trace shorter than asked for: the window is its last `count` requests.
  const int size = static_cast<int>(w.requests.size());
  if (first + count > size) {
    FS_LOG_INFO("{} has {} requests: using requests {}-{}", w.description, size,
                std::max(0, size - count), size - 1);
    first = std::max(0, size - count);
  }
  std::vector<SimRequest> out;
  for (int i = first; i < size; ++i) {
    const WorkloadRequest& r = w.requests[i];
    out.push_back({r.arrival_s, r.input_len, r.output_len, false, r.hash_ids, r.block_tokens});
  }
  // Arrivals in time order (a trace may list them otherwise).
  if (!std::is_sorted(out.begin(), out.end(), [](const SimRequest& a, const SimRequest& b) {
        return a.arrival < b.arrival;
      })) {
    FS_LOG_WARN("{}: timestamps out of order, requests sorted by arrival", w.description);
    std::stable_sort(out.begin(), out.end(), [](const SimRequest& a, const SimRequest& b) {
      return a.arrival < b.arrival;
    });
  }
  // The trace's timestamps are quantised (to about 3 s): up to 19 requests
  // share one. Spread each group evenly over the gap to the next timestamp,
  // so that a rate sweep sees arrivals rather than synchronised bursts.
  double last_gap = 0;
  for (size_t i = 0; i < out.size();) {
    size_t j = i;
    while (j < out.size() && out[j].arrival == out[i].arrival) ++j;
    const double gap = j < out.size() ? out[j].arrival - out[i].arrival : last_gap;
    for (size_t k = i; k < j; ++k) out[k].arrival += gap * (k - i) / (j - i);
    last_gap = gap;
    i = j;
  }
  return out;
}

int FitToContext(const ModelConfig& model, std::vector<SimRequest>* requests) {
  int cut = 0;
  for (SimRequest& r : *requests) {
    r.output = std::min(r.output, model.max_position_embeddings / 2);
    const int room = model.max_position_embeddings - r.output - 1;
    if (r.input > room) {
      r.input = room;
      ++cut;
    }
  }
  if (cut > 0) FS_LOG_INFO("{} prompts truncated to the model's context", cut);
  return cut;
}

Result<std::vector<SimRequest>> OfflineRequests(const ExperimentOptions& o, int count) {
  if (o.requests_file.empty()) return OpenThoughtsRequests(count, o.seed);
  FS_ASSIGN_OR_RETURN(Workload w, RequestTrace(o, count));
  std::vector<SimRequest> out;
  for (const WorkloadRequest& r : w.requests) out.push_back({0, r.input_len, r.output_len, false});
  return out;
}

std::vector<SimRequest> OpenThoughtsRequests(int count, uint64_t seed) {
  WorkloadOptions wo;
  wo.seed = seed;
  Workload w = OpenThoughtsWorkload(count, wo);
  std::vector<SimRequest> out;
  for (const WorkloadRequest& r : w.requests) out.push_back({0, r.input_len, r.output_len, false});
  return out;
}

SystemSpec Tp4() {
  // The fallback on a node of 8 with one device failed.
  return {"TP4", 4, Policy::kStandard, RouterPolicy::kRoundRobin, PrefillPolicy::kFifo, 7};
}
SystemSpec NonuniformTp(int n) {
  return {"nonuniform-TP" + std::to_string(n), n, Policy::kNonUniform, RouterPolicy::kRoundRobin,
          PrefillPolicy::kFifo};
}
SystemSpec CyclicTp(int n) {
  return {"cyclic-TP" + std::to_string(n), n, Policy::kCyclic, RouterPolicy::kRoundRobin,
          PrefillPolicy::kFifo};
}
SystemSpec FailsafeTp(int n) {
  SystemSpec s = HybridTp(n);
  s.name = "failsafe-TP" + std::to_string(n);
  s.choose_placement = true;
  return s;
}
SystemSpec HybridTp(int n) {
  return {"hybrid-TP" + std::to_string(n), n, Policy::kHybrid, RouterPolicy::kLoadAware,
          PrefillPolicy::kAdaptive};
}
SystemSpec Tp8() {
  return {"TP8", 8, Policy::kStandard, RouterPolicy::kRoundRobin, PrefillPolicy::kFifo};
}

SchedulerConfig GpuSchedulerConfig(const ModelConfig& m, const SystemSpec& s) {
  SchedulerConfig sc;
  sc.max_batch_tokens = 8192;
  sc.max_num_seqs = 512;
  sc.max_model_len = m.max_position_embeddings;
  sc.router = s.router;
  sc.prefill = s.prefill;
  sc.adaptive_unit = 128;
  sc.prefix_cache = s.prefix_cache;
  sc.prefix_cache_host = s.prefix_cache_host;
  if (s.prefix_affinity_tokens >= 0) sc.prefix_affinity_tokens = s.prefix_affinity_tokens;
  return sc;
}

Result<std::unique_ptr<SimInstance>> MakeInstance(const ModelConfig& model,
                                                  const HardwareProfile& hw, const SystemSpec& s,
                                                  RecoveryMode mode) {
  InstanceConfig ic;
  ic.model = model;
  ic.hw = hw;
  ic.policy = s.policy;
  const int alive = s.node_alive > 0 ? s.node_alive : s.devices;
  ic.num_devices = std::max(8, alive);
  for (int d = 0; d < alive; ++d) ic.alive.push_back(d);
  ic.sched = GpuSchedulerConfig(model, s);
  ic.recovery = mode;
  ic.backup_bytes = s.backup_bytes;
  return SimInstance::Create(ic);
}

Status ReplayRequests(SimInstance* inst, const std::vector<SimRequest>& requests, bool offline,
                      double fail_at, int device) {
  bool failed = fail_at < 0;
  for (SimRequest r : requests) {
    if (offline) r.arrival = 0;
    if (!failed && r.arrival > fail_at) {
      inst->RunUntil(fail_at);
      FS_RETURN_IF_ERROR(inst->Fail(device).status());
      failed = true;
    }
    inst->RunUntil(r.arrival);
    FS_RETURN_IF_ERROR(inst->Submit(r));
  }
  inst->RunToCompletion(1e9);
  return Status::Ok();
}

Status KeepQueueFull(SimInstance* inst, const std::vector<SimRequest>& requests, size_t* next) {
  if (requests.empty()) return InvalidArgument("an offline queue needs requests");
  while (inst->pending() < static_cast<int64_t>(requests.size())) {
    SimRequest r = requests[(*next)++ % requests.size()];
    r.arrival = inst->clock();
    FS_RETURN_IF_ERROR(inst->Submit(r));
  }
  return Status::Ok();
}

Status RunQueueFull(SimInstance* inst, const std::vector<SimRequest>& requests, size_t* next,
                    double until) {
  while (inst->clock() < until) {
    FS_RETURN_IF_ERROR(KeepQueueFull(inst, requests, next));
    inst->RunUntil(std::min(until, inst->clock() + kQueueRefillS));
  }
  return Status::Ok();
}

Result<double> SustainedThroughput(const ModelConfig& model, const HardwareProfile& hw,
                                   const SystemSpec& system,
                                   const std::vector<SimRequest>& requests, double warmup_s,
                                   double window_s, int64_t* inflight_tokens) {
  if (inflight_tokens != nullptr) *inflight_tokens = 0;
  auto made = MakeInstance(model, hw, system, RecoveryMode::kFull);
  if (!made.ok() && made.status().code() == StatusCode::kResourceExhausted) {
    FS_LOG_INFO("{} cannot serve this model: {}", system.name, made.status().message());
    return 0.0;
  }
  FS_RETURN_IF_ERROR(made.status());
  SimInstance& inst = **made;
  size_t next = 0;
  Status st = RunQueueFull(&inst, requests, &next, warmup_s);
  const int64_t out0 = inst.tokens_out();
  const double t0 = inst.clock();
  if (st.ok()) st = RunQueueFull(&inst, requests, &next, warmup_s + window_s);
  // On to a whole pass through the workload: the queue cycles through it in
  // order, and the rate swings with the mix of contexts over each pass (by
  // a third on one node of 7 GPUs), so only whole passes compare across
  // GPU counts. At most kMaxPasses windows (a node too slow for a pass).
  int64_t pass_tokens = 0;
  for (const SimRequest& r : requests) pass_tokens += r.output;
  constexpr int kMaxPasses = 24;
  while (st.ok() && inst.tokens_out() - out0 < pass_tokens &&
         inst.clock() < warmup_s + kMaxPasses * window_s)
    st = RunQueueFull(&inst, requests, &next, inst.clock() + kQueueRefillS);
  if (st.code() == StatusCode::kResourceExhausted) {
    FS_LOG_INFO("{} cannot serve this workload: {}", system.name, st.message());
    return 0.0;
  }
  FS_RETURN_IF_ERROR(st);
  const double dt = std::min(inst.clock(), inst.last_step_end()) - t0;
  if (dt <= 0 || inst.tokens_out() == out0) {
    FS_LOG_INFO("{} made no progress (its KV memory is too small)", system.name);
    return 0.0;
  }
  if (inflight_tokens != nullptr) {
    for (const Sequence* s : inst.scheduler().Running()) *inflight_tokens += s->num_computed;
  }
  return (inst.tokens_out() - out0) / dt;
}

Result<double> ThroughputOrZero(const ModelConfig& model, const HardwareProfile& hw,
                                const SystemSpec& system, Phase phase,
                                const std::vector<SimRequest>& requests, double window_s,
                                int64_t* inflight_tokens) {
  auto r = SaturatedThroughput(model, hw, system, phase, requests, window_s, inflight_tokens);
  if (!r.ok() && r.status().code() == StatusCode::kResourceExhausted) {
    FS_LOG_INFO("{} cannot serve this model: {}", system.name, r.status().message());
    if (inflight_tokens != nullptr) *inflight_tokens = 0;
    return 0.0;
  }
  return r;
}

Result<SystemSpec> ChoosePlacement(const ModelConfig& model, const HardwareProfile& hw,
                                   const SystemSpec& system, Phase phase,
                                   const std::vector<SimRequest>& requests, double window_s,
                                   double* hybrid, double* cyclic) {
  SystemSpec h = system, c = system;
  h.choose_placement = c.choose_placement = false;
  h.policy = Policy::kHybrid;
  c.policy = Policy::kCyclic;
  FS_ASSIGN_OR_RETURN(const double thr_h,
                      ThroughputOrZero(model, hw, h, phase, requests, window_s));
  FS_ASSIGN_OR_RETURN(const double thr_c,
                      ThroughputOrZero(model, hw, c, phase, requests, window_s));
  if (hybrid != nullptr) *hybrid = thr_h;
  if (cyclic != nullptr) *cyclic = thr_c;
  const SystemSpec& chosen = thr_c > thr_h ? c : h;
  FS_LOG_INFO("{} {}: hybrid {:.0f} tok/s, cyclic {:.0f} tok/s: {}", system.name,
              phase == Phase::kPrefill  ? "prefill"
              : phase == Phase::kDecode ? "decode"
                                        : "mixed",
              thr_h, thr_c, PolicyName(chosen.policy));
  return chosen;
}

nlohmann::json RatioOrNull(double a, double b) {
  return b > 0 ? nlohmann::json(a / b) : nlohmann::json(nullptr);
}

Result<double> SaturatedThroughput(const ModelConfig& model, const HardwareProfile& hw,
                                   const SystemSpec& system, Phase phase,
                                   const std::vector<SimRequest>& requests, double window_s,
                                   int64_t* inflight_tokens) {
  FS_ASSIGN_OR_RETURN(auto inst, MakeInstance(model, hw, system, RecoveryMode::kFull));
  const bool decode = phase == Phase::kDecode;
  std::vector<SimRequest> work;
  for (SimRequest r : requests) {
    r.arrival = 0;
    r.migrated = decode;
    if (phase == Phase::kPrefill) r.output = 1;
    r.input = std::min(r.input, model.max_position_embeddings - r.output - 1);
    work.push_back(r);
  }
  // Every request at once, and the queue topped up as they finish (in the
  // same order, behind them), so that a fast instance never runs dry before
  // the window ends (short prompts prefilled within the warm-up measured
  // nothing). Warm up (the first batches differ), then measure a window of
  // steady state.
  const double warmup = window_s * 0.25;
  size_t next = 0;
  FS_RETURN_IF_ERROR(RunQueueFull(inst.get(), work, &next, warmup));
  const int64_t in0 = inst->tokens_in(), out0 = inst->tokens_out();
  const double t0 = inst->clock();
  FS_RETURN_IF_ERROR(RunQueueFull(inst.get(), work, &next, warmup + window_s));
  const double dt = std::min(inst->clock(), inst->last_step_end()) - t0;
  if (dt <= 0)
    return ResourceExhausted("{} made no progress (its KV memory is too small)", system.name);
  if (inflight_tokens != nullptr) {
    *inflight_tokens = 0;
    for (const Sequence* s : inst->scheduler().Running()) *inflight_tokens += s->num_computed;
  }
  return phase == Phase::kPrefill ? (inst->tokens_in() - in0) / dt
                                  : (inst->tokens_out() - out0) / dt;
}

}  // namespace failsafe
