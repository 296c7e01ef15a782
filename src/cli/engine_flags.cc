#include "cli/engine_flags.h"

#include <algorithm>
#include <charconv>

#include "common/log.h"
#include "common/units.h"
#include "engine/local_executor.h"
#include "worker/cluster_protocol.h"

namespace failsafe {

void AddDeviceFlags(CLI::App& app, DeviceFlags* f) {
  app.add_option("--devices", f->devices, "number of devices (worker processes)")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  AddPlacementFlag(app, f);
  app.add_option("--comm", f->comm, "collectives: shm (one host) or gloo (TCP)")
      ->capture_default_str();
  app.add_option("--threads", f->threads, "compute threads per device")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  app.add_option("--block-size", f->block_size,
                 "positions per KV page: the unit of KV memory, of prefix caching and of the "
                 "host KV backup, and the length of the runs of memory attention reads (pages "
                 "scattered over the pool read faster when larger, docs/CPU_PERFORMANCE.md; a "
                 "sequence's last page is half empty on average)")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  AddKvDtypeFlag(app, f);
  app.add_flag("--processes", f->processes, "run even a single device as a worker process");
  app.add_option("--recovery", f->recovery, "recovery mode: recompute, host or full")
      ->capture_default_str();
  AddBackupMemoryFlag(app, f);
  AddGpuFlags(app, f);
  app.add_flag("--rebalance-slow", f->rebalance_slow,
               "re-plan so that a device that stays slower than its peers (measured per step) "
               "gets a smaller share of heads and FFN shards");
  app.add_option("--listen", f->listen,
                 "HOST:PORT where devices on other hosts join (`failsafe worker --join`); HOST "
                 "is this host's address as the other hosts reach it");
  app.add_option("--remote-devices", f->remote_devices,
                 "how many of the devices are workers joining at --listen (the last ids); "
                 "implies --comm gloo")
      ->capture_default_str()
      ->check(CLI::Range(0, 64));
  app.add_option("--cluster-token-file", f->cluster_token_file,
                 "file whose first line is the token joining workers must present (default: "
                 "$FAILSAFE_CLUSTER_TOKEN)");
  app.add_option("--join-timeout", f->join_timeout,
                 "how long start-up waits for the remote devices to join")
      ->capture_default_str();
  AddTimeoutFlags(app, f);
}

void AddPlacementFlag(CLI::App& app, DeviceFlags* f) {
  app.add_option("--placement", f->placement, "standard, nonuniform, cyclic or hybrid")
      ->capture_default_str();
}

void AddGpuFlags(CLI::App& app, DeviceFlags* f) {
  app.add_option(
      "--device-memory", f->device_memory,
      "memory of one device for weights, KV and activations (e.g. 2GiB; default: no limit)");
  app.add_option("--gpus", f->gpus,
                 "run the devices on GPUs (the CUDA backend): each device's CUDA device, e.g. "
                 "0,0,0,0 for four devices sharing GPU 0, or one id for every device");
  app.add_option("--gpu-gemm", f->gpu_gemm,
                 "products by 16-bit weights on a GPU: lt (cuBLASLt's tensor cores, one "
                 "algorithm per shape checked to keep a row's bits), fused (cuBLASLt, and the "
                 "engine's own tensor-core kernel for the exact sums of heads and FFN shards) "
                 "or chain (the CPU backend's products bit for bit, on CUDA cores)")
      ->capture_default_str();
  app.add_option("--gpu-attention", f->gpu_attention,
                 "attention on a GPU: cores (f32 on CUDA cores), segments (as cores, keys in "
                 "segments of 512 merged in order: decode over a long context split over "
                 "blocks) or tensor (tensor cores, queries, keys, values and weights in bf16, "
                 "head dims up to 128)")
      ->capture_default_str()
      ->check(CLI::IsMember({"cores", "segments", "tensor"}));
  app.add_flag("--peer-collectives", f->peer_collectives,
               "all-reduces from the devices' own memory instead of staging each partial sum "
               "through the host: by NCCL where every device of a group is on a GPU of its "
               "own (loaded at run time: FAILSAFE_NCCL_LIBRARY, else libnccl.so.2), else "
               "reading the other devices' memory directly (CUDA's virtual memory API or IPC "
               "between devices sharing a GPU, shared memory between CPU devices on one "
               "host); a group whose devices can do neither stages as without");
  app.add_flag("--cuda-graphs", f->cuda_graphs,
               "on a GPU, run decode steps that repeat their shapes as CUDA graphs (one launch "
               "a step; a device alone in its group, dense models)");
  app.add_flag("--gpu-dependent-launch", f->gpu_dependent_launch,
               "on a GPU (Hopper or later), launch kernels with programmatic dependent launch: "
               "each may start while the one before it finishes, and waits for its results "
               "(hides the gap between a step's many small kernels)");
}

void AddKvDtypeFlag(CLI::App& app, DeviceFlags* f) {
  app.add_option("--kv-dtype", f->kv_dtype,
                 "what the KV cache and its host backup hold: f32, or bf16 for half the memory "
                 "and half the bytes attention reads (keys and values rounded once, to nearest, "
                 "as they are stored; attention then computes in f32); auto: bf16 for a model "
                 "whose weights are bf16, else f32")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "f32", "bf16"}));
}

void AddBackupMemoryFlag(CLI::App& app, DeviceFlags* f) {
  app.add_option("--backup-memory", f->backup_memory,
                 "host memory for the KV backup (0: no backup; committed only as used)")
      ->capture_default_str();
}

void AddTimeoutFlags(CLI::App& app, DeviceFlags* f) {
  app.add_option("--step-timeout", f->step_timeout,
                 "how long a step may run before its devices are checked for a hang (e.g. 2s); "
                 "auto: a multiple of the measured step time, never below --step-timeout-floor")
      ->capture_default_str();
  app.add_option("--step-timeout-floor", f->step_timeout_floor,
                 "the shortest derived step deadline")
      ->capture_default_str();
  app.add_option("--collective-timeout", f->collective_timeout,
                 "how long a device waits in one collective before giving up on its own (the "
                 "coordinator aborts a group with a hung device long before); also bounds joining "
                 "a group and changing plan")
      ->capture_default_str();
}

void CopyTimeoutFlags(const DeviceFlags& from, DeviceFlags* to) {
  to->step_timeout = from.step_timeout;
  to->step_timeout_floor = from.step_timeout_floor;
  to->collective_timeout = from.collective_timeout;
}

Status ApplyTimeoutFlags(const DeviceFlags& f, WorkerGroupOptions* o) {
  auto ms = [](const std::string& flag, const std::string& text) -> Result<int64_t> {
    auto s = ParseDuration(text);
    if (!s.ok()) return s.status().WithContext(flag);
    if (*s <= 0) return InvalidArgument("{}: '{}' must be positive", flag, text);
    return static_cast<int64_t>(*s * 1e3 + 0.5);
  };
  if (f.step_timeout == "auto") {
    o->step_timeout_ms = 0;
  } else {
    FS_ASSIGN_OR_RETURN(o->step_timeout_ms, ms("--step-timeout", f.step_timeout));
  }
  FS_ASSIGN_OR_RETURN(o->step_timeout_floor_ms, ms("--step-timeout-floor", f.step_timeout_floor));
  FS_ASSIGN_OR_RETURN(o->collective_timeout_ms, ms("--collective-timeout", f.collective_timeout));
  return Status::Ok();
}

Result<SchedulerConfig> MakeSchedulerConfig(const std::string& router, const std::string& prefill,
                                            int max_batch_tokens, int max_num_seqs,
                                            int max_model_len) {
  SchedulerConfig sc;
  auto r = ParseRouterPolicy(router);
  if (!r.ok()) return r.status().WithContext("--router");
  auto p = ParsePrefillPolicy(prefill);
  if (!p.ok()) return p.status().WithContext("--prefill");
  sc.router = *r;
  sc.prefill = *p;
  sc.max_batch_tokens = max_batch_tokens;
  sc.max_num_seqs = max_num_seqs;
  sc.max_model_len = max_model_len;
  return sc;
}

void AddPrefixCacheFlag(CLI::App& app, std::string* value) {
  app.add_option("--prefix-cache", *value,
                 "reuse the KV of cached prompt prefixes (full blocks): off; device (device "
                 "memory only); host (device memory, then the host KV backup: blocks the devices "
                 "evicted are copied back, not recomputed; needs the backup); on (host when the "
                 "devices have the host KV backup, device otherwise)")
      ->capture_default_str();
}

Status ApplyPrefixCacheFlag(const std::string& value, SchedulerConfig* config) {
  if (value != "on" && value != "off" && value != "device" && value != "host")
    return InvalidArgument("--prefix-cache: '{}' is not one of off, device, host, on", value);
  config->prefix_cache = value != "off";
  // `on` takes the host tier wherever there is a backup (the engine attaches
  // it only then); `host` insists on one (CheckPrefixCacheTier).
  config->prefix_cache_host = value == "host" || value == "on";
  return Status::Ok();
}

Status CheckPrefixCacheTier(const std::string& value, Executor& executor) {
  if (value == "host" && !executor.backup())
    return InvalidArgument(
        "--prefix-cache host needs the host KV backup (--backup-memory above 0, devices as "
        "worker processes)");
  return Status::Ok();
}

Result<std::vector<int>> ParseGpus(const std::string& text) {
  std::vector<int> out;
  if (text.empty()) return out;
  size_t at = 0;
  while (at <= text.size()) {
    const size_t comma = std::min(text.find(',', at), text.size());
    const std::string item = text.substr(at, comma - at);
    int v = -1;
    auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    if (ec != std::errc() || end != item.data() + item.size() || v < 0)
      return InvalidArgument("--gpus: '{}' is not a GPU id", item);
    out.push_back(v);
    at = comma + 1;
  }
  return out;
}

Result<std::optional<DType>> ParseKvDtype(const std::string& text) {
  if (text == "auto") return std::optional<DType>();
  if (text == "f32") return std::optional<DType>(DType::kF32);
  if (text == "bf16") return std::optional<DType>(DType::kBF16);
  return InvalidArgument("--kv-dtype: unknown '{}' (known: auto, f32, bf16)", text);
}

Result<GpuGemm> ParseGpuGemm(const std::string& text) {
  if (text == "lt") return GpuGemm::kLt;
  if (text == "chain") return GpuGemm::kChain;
  if (text == "fused") return GpuGemm::kFused;
  return InvalidArgument("--gpu-gemm: unknown '{}' (known: lt, fused, chain)", text);
}

Result<RecoveryMode> ParseDeviceRecoveryMode(const std::string& name) {
  FS_ASSIGN_OR_RETURN(RecoveryMode mode, ParseRecoveryMode(name));
  if (mode == RecoveryMode::kOracle) {
    return InvalidArgument(
        "recovery mode 'oracle' is the simulator's ideal, not something devices do (known: "
        "recompute, host, full)");
  }
  return mode;
}

Result<std::unique_ptr<Executor>> MakeExecutor(const std::string& model_dir, const DeviceFlags& f) {
  FS_ASSIGN_OR_RETURN(Policy policy, ParsePolicy(f.placement));
  FS_ASSIGN_OR_RETURN(std::vector<int> gpus, ParseGpus(f.gpus));
  FS_ASSIGN_OR_RETURN(GpuGemm gpu_gemm, ParseGpuGemm(f.gpu_gemm));
  FS_ASSIGN_OR_RETURN(std::optional<DType> kv_dtype, ParseKvDtype(f.kv_dtype));
  const GpuAttention gpu_attention = f.gpu_attention == "tensor"     ? GpuAttention::kTensor
                                     : f.gpu_attention == "segments" ? GpuAttention::kSegments
                                                                     : GpuAttention::kCores;
  if (f.comm != "shm" && f.comm != "gloo")
    return InvalidArgument("--comm: unknown '{}' (known: shm, gloo)", f.comm);
  if (f.remote_devices > 0 && f.listen.empty()) {
    return InvalidArgument("--remote-devices needs --listen HOST:PORT");
  }
  if (f.remote_devices > f.devices) {
    return InvalidArgument("--remote-devices {} exceeds --devices {}", f.remote_devices, f.devices);
  }
  if (f.devices == 1 && !f.processes && f.listen.empty()) {
    if (gpus.size() > 1) return InvalidArgument("--gpus: {} GPUs for 1 device", gpus.size());
    LocalExecutorOptions o;
    if (!f.device_memory.empty()) {
      FS_ASSIGN_OR_RETURN(o.device_memory_bytes, ParseBytes(f.device_memory));
    }
    o.max_step_tokens = f.max_step_tokens;
    o.threads = f.threads;
    o.block_size = f.block_size;
    o.kv_dtype = kv_dtype;
    if (!gpus.empty()) o.gpu = gpus[0];
    o.gpu_gemm = gpu_gemm;
    o.gpu_graphs = f.cuda_graphs;
    o.gpu_dependent_launch = f.gpu_dependent_launch;
    o.gpu_attention = gpu_attention;
    o.peer_collectives = f.peer_collectives;
    FS_ASSIGN_OR_RETURN(auto e, LocalExecutor::Create(model_dir, o));
    return std::unique_ptr<Executor>(std::move(e));
  }
  WorkerGroupOptions o;
  if (!f.device_memory.empty()) {
    FS_ASSIGN_OR_RETURN(o.device_memory_bytes, ParseBytes(f.device_memory));
  }
  o.model_dir = model_dir;
  o.max_step_tokens = f.max_step_tokens;
  o.max_logits_rows = f.max_seqs;
  o.max_seqs = f.max_seqs;
  FS_ASSIGN_OR_RETURN(o.backup_bytes, ParseBytes(f.backup_memory));
  FS_RETURN_IF_ERROR(ApplyTimeoutFlags(f, &o));
  FS_RETURN_IF_ERROR(ParseDeviceRecoveryMode(f.recovery).status());
  o.num_devices = f.devices;
  o.policy = policy;
  o.threads_per_device = f.threads;
  o.block_size = f.block_size;
  o.kv_dtype = kv_dtype;
  o.gpus = gpus;
  o.gpu_gemm = gpu_gemm;
  o.gpu_graphs = f.cuda_graphs;
  o.gpu_dependent_launch = f.gpu_dependent_launch;
  o.gpu_attention = gpu_attention;
  o.peer_collectives = f.peer_collectives;
  o.comm = f.comm == "gloo" ? CommKind::kGloo : CommKind::kShm;
  static const char* kLevels[] = {"debug", "info", "warn", "error", "off"};
  o.log_level = kLevels[static_cast<int>(GetLogLevel())];
  if (!f.listen.empty()) {
    ClusterListenerOptions lo;
    auto hp = ParseHostPort(f.listen);
    if (!hp.ok()) return hp.status().WithContext("--listen");
    lo.host = hp->first;
    lo.port = hp->second;
    auto token = ReadClusterToken(f.cluster_token_file);
    if (!token.ok()) return token.status().WithContext("--listen");
    lo.token = *token;
    FS_ASSIGN_OR_RETURN(o.listener, ClusterListener::Start(lo));
    o.remote_devices = f.remote_devices;
    auto wait = ParseDuration(f.join_timeout);
    if (!wait.ok()) return wait.status().WithContext("--join-timeout");
    o.join_timeout_ms = static_cast<int64_t>(*wait * 1e3 + 0.5);
  }
  FS_ASSIGN_OR_RETURN(auto g, WorkerGroup::Start(o));
  return std::unique_ptr<Executor>(std::move(g));
}

}  // namespace failsafe
