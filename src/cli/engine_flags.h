// Command-line flags shared by the commands that start devices.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "core/scheduler.h"
#include "engine/executor.h"
#include "engine/worker_group.h"

namespace failsafe {

struct DeviceFlags {
  int devices = 1;
  std::string placement = "hybrid";
  std::string comm = "shm";
  int threads = 1;
  int block_size = 16;           // positions per KV page
  std::string kv_dtype = "f32";  // what KV pages hold: f32, bf16 or auto (the model's)
  bool processes = false;        // a worker process even for one device
  std::string device_memory;     // e.g. "2GiB"; empty: no limit
  std::string gpus;              // e.g. "0,0,0,0": each device's GPU; empty: CPU devices
  std::string gpu_gemm = "lt";
  bool cuda_graphs = false;
  bool gpu_dependent_launch = false;
  std::string gpu_attention = "cores";  // cores or tensor
  bool peer_collectives = false;        // DeviceOptions::peer_collectives
  std::string recovery = "full";
  std::string backup_memory = "4GiB";  // host KV backup; 0: none
  // Hang detection: "auto" derives a step's deadline from measured step
  // times (never below the floor); a duration fixes it.
  std::string step_timeout = "auto";
  std::string step_timeout_floor = "500ms";
  std::string collective_timeout = "30s";
  // Re-plan so that a device that stays slower than its peers gets a smaller
  // share of the work (EngineOptions::rebalance_slow).
  bool rebalance_slow = false;
  // Devices on other hosts: workers join at `listen` (HOST:PORT) with the
  // cluster token; the last `remote_devices` device ids are theirs.
  std::string listen;
  int remote_devices = 0;
  std::string cluster_token_file;  // empty: $FAILSAFE_CLUSTER_TOKEN
  std::string join_timeout = "60s";
  // Set by commands from their scheduler settings:
  int max_step_tokens = 2048;  // tokens per step (sizes activations and collective slots)
  int max_seqs = 256;          // sequences sampled per step (logits rows)
};

void AddDeviceFlags(CLI::App& app, DeviceFlags* flags);
// Pieces of AddDeviceFlags, for commands that start devices with settings
// of their own: --placement, the GPU flags (--gpus, --gpu-gemm,
// --gpu-attention, --cuda-graphs, --device-memory), --kv-dtype and
// --backup-memory.
void AddPlacementFlag(CLI::App& app, DeviceFlags* flags);
void AddGpuFlags(CLI::App& app, DeviceFlags* flags);
void AddKvDtypeFlag(CLI::App& app, DeviceFlags* flags);
void AddBackupMemoryFlag(CLI::App& app, DeviceFlags* flags);
// The hang-detection flags alone (part of AddDeviceFlags), for commands that
// start devices with settings of their own.
void AddTimeoutFlags(CLI::App& app, DeviceFlags* flags);
// Copies the timeout flags.
void CopyTimeoutFlags(const DeviceFlags& from, DeviceFlags* to);
// Applies the timeout flags to worker-group options; a bad value is an error
// naming its flag.
Status ApplyTimeoutFlags(const DeviceFlags& flags, WorkerGroupOptions* options);

// The scheduler settings commands take as flags; a bad policy name is an
// error naming its flag.
Result<SchedulerConfig> MakeSchedulerConfig(const std::string& router, const std::string& prefill,
                                            int max_batch_tokens, int max_num_seqs,
                                            int max_model_len);

// --prefix-cache off|device|host|on (on: host when the executor keeps a
// backup, else device).
void AddPrefixCacheFlag(CLI::App& app, std::string* value);
Status ApplyPrefixCacheFlag(const std::string& value, SchedulerConfig* config);
// `host` asked for, and the executor keeps no host KV backup: an error.
Status CheckPrefixCacheTier(const std::string& value, Executor& executor);

// --recovery for real devices: recompute, host or full. The simulator's
// oracle (an ideal recovery) is refused: devices would run it as a reload.
Result<RecoveryMode> ParseDeviceRecoveryMode(const std::string& name);

// An in-process executor for one device (unless --processes), else one worker
// process per device.
Result<std::unique_ptr<Executor>> MakeExecutor(const std::string& model_dir,
                                               const DeviceFlags& flags);

}  // namespace failsafe
