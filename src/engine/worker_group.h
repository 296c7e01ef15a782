// The real executor: one worker process per device.
//
// The coordinator spawns a process per device; each maps the host weights and
// loads only its share of the plan, owns its KV pool, and joins the
// collective group of the plan's active devices. A step goes to every active
// device over its control channel (tokens, positions, DP ranks: small);
// logits come back through a shared-memory region; all-reduces run among the
// devices without the coordinator.
//
// Failures short of a clean death are detected too. A device that exits,
// crashes or is killed is seen through its pidfd or its closed channel. A
// device that hangs (a stuck kernel, SIGSTOP) is found when the step's
// deadline passes: deadlines come from measured step times (hang_detector.h),
// and the devices' progress tells the hung one from the peers waiting for it.
// Either way the device is fenced (its process killed, its channel closed,
// its group replaced by a new epoch's, so no late reply or write of it is
// ever used), the group is aborted so that no survivor waits on it, and Step
// fails with kUnavailable naming the dead devices. A fenced device can come
// back as a new process (SpawnDevice). The coordinator itself never goes
// down with a device, and never blocks on one.
//
// The jobs live in their own files: processes (device_process.h), replies
// (reply_collector.h), detection (hang_detector.h), groups
// (collective_group.h), timing (step_timing.h).
//
// Thread-safety: one thread drives a WorkerGroup.
#pragma once

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/kv_store.h"
#include "comm/shm_region.h"
#include "engine/cluster_listener.h"
#include "engine/collective_group.h"
#include "engine/device_process.h"
#include "engine/executor.h"
#include "engine/hang_detector.h"
#include "engine/kv_backup.h"
#include "worker/device_progress.h"
#include "worker/protocol.h"

namespace failsafe {

struct WorkerGroupOptions {
  std::string model_dir;
  std::string worker_binary = "/proc/self/exe";  // the failsafe program
  int num_devices = 1;
  Policy policy = Policy::kHybrid;
  std::vector<int> alive;  // empty: every device
  int threads_per_device = 1;
  // The GPU of each device (a CUDA backend; several devices may share one),
  // or one GPU for every device; empty: CPU devices.
  std::vector<int> gpus;
  GpuGemm gpu_gemm = GpuGemm::kLt;
  bool gpu_graphs = false;                            // CudaBackendOptions::graphs
  bool gpu_dependent_launch = false;                  // CudaBackendOptions::dependent_launch
  GpuAttention gpu_attention = GpuAttention::kCores;  // CudaBackendOptions::attention
  bool peer_collectives = false;                      // DeviceOptions::peer_collectives
  int block_size = 16;
  // What the KV pages (and the host backup) hold: f32, or bf16 for half the
  // bytes (the values rounded once as stored; KvCache); unset: the model's
  // (DefaultKvDtype).
  std::optional<DType> kv_dtype = DType::kF32;
  int64_t kv_pages = 0;  // per device; 0: from device_memory_bytes
  // Memory of one device (weights + KV + activations); 0: KV for 64K tokens
  // of every slot.
  int64_t device_memory_bytes = 0;
  // Host memory for the KV backup; 0: no backup.
  int64_t backup_bytes = 0;
  int max_seqs = 1024;  // sequences the backup can track
  CommKind comm = CommKind::kShm;
  std::string gloo_hostname = "127.0.0.1";
  // Devices on other hosts: the last `remote_devices` ids are workers that
  // join over TCP through `listener` (`failsafe worker --join`), in the order
  // they register. Any remote device implies gloo collectives, with the
  // rendezvous store and the local devices on the listener's address.
  std::shared_ptr<ClusterListener> listener;
  int remote_devices = 0;
  // How long Start waits for the remote devices to join; a rejoin takes a
  // worker only if one is already waiting.
  int64_t join_timeout_ms = 60000;
  // How long a step may run before its devices are checked for a hang: 0
  // derives it from measured step times (never below the floor); > 0 fixes it.
  int64_t step_timeout_ms = 0;
  int64_t step_timeout_floor_ms = 500;
  // How long a device waits in one collective before it gives up on its own,
  // and the bound on rare operations (joining a group, changing plan). The
  // coordinator aborts a group with a hung member long before.
  int64_t collective_timeout_ms = 30000;
  int max_step_tokens = 4096;  // sizes the shared-memory collective slots
  int max_logits_rows = 1024;
  std::string log_level = "warn";
};

// Bytes a device keeps for step activations (an estimate from the shapes).
int64_t ActivationReserveBytes(const ModelConfig& config, int max_step_tokens);

// What the worker processes on this host get in their environment beyond
// the coordinator's (DeviceProcess::Spawn). A device's compute threads wait
// for each other at the end of every parallel region, about a dozen times a
// layer; OpenMP's default wait spins first. Where the local devices' threads
// outnumber the host's CPUs, the spinning takes the CPUs that other devices'
// threads need (2 devices of 2 threads on 2 CPUs: half the throughput,
// docs/CPU_PERFORMANCE.md), so there they wait passively:
// OMP_WAIT_POLICY=passive, unless the operator chose a wait
// (`wait_policy_set`: OMP_WAIT_POLICY or GOMP_SPINCOUNT set).
std::vector<std::string> WorkerEnvironment(int local_devices, int threads_per_device, int host_cpus,
                                           bool wait_policy_set);

class WorkerGroup final : public Executor, public DeviceFaults {
 public:
  static Result<std::unique_ptr<WorkerGroup>> Start(const WorkerGroupOptions& options);
  ~WorkerGroup() override;

  const ModelConfig& config() const override { return config_; }
  const Plan& plan() const override { return plan_; }
  Result<StepOutput> Step(const StepBatch& batch, StepTiming* timing) override;
  Status FreeSeqs(const std::vector<int64_t>& seq_ids) override;
  std::vector<int64_t> kv_capacity_pages() const override;
  int block_size() const override { return options_.block_size; }
  DType kv_dtype() const override { return kv_dtype_; }

  bool supports_recovery() const override { return true; }
  HostKvBackup* backup() override { return backup_.get(); }
  std::vector<int> alive_devices() const override;
  // Pings every device (timeout 0: the step deadline's floor).
  Status CheckHealth(int64_t timeout_ms) override;
  Status DrainBackup() override;
  Result<std::vector<int64_t>> KvCapacityFor(const Plan& plan) const override;
  Result<ApplyReport> ApplyPlan(const Plan& next, RecoveryMode mode,
                                const DeviceRestores& seqs) override;
  Status SpawnDevice(int device, bool wait) override;
  DeviceLoss device_loss(int device) const override;

  // Devices of the plan found dead so far (ascending).
  std::vector<int> dead_devices() const;
  // Kills a device's process for real (fault injection).
  Status KillDevice(int device) override;
  Status SetDeviceSpeed(int device, double speed) override;
  int device_pid(int device) const override;
  // Weight bytes each device reported after loading its share.
  int64_t device_weight_bytes(int device) const { return devices_[device].weight_bytes; }
  // KV pool of a device, in pages of block_size tokens of one (layer, head).
  int64_t device_kv_pages(int device) const { return devices_[device].kv_pages; }
  const StepDeadline& step_deadline() const { return deadline_; }

 private:
  struct Device {
    std::unique_ptr<DeviceProcess> process;  // null: not running
    int64_t weight_bytes = 0;
    int64_t kv_pages = 0;   // accounting capacity under the current plan
    int64_t killed_ns = 0;  // when KillDevice killed it
    DeviceLoss loss;        // its latest loss
    int link_strikes = 0;   // times its link was found degraded since last taken
    // A remote worker that joined, whose link is being measured before it
    // is taken (not alive until then), and until when it may take.
    std::unique_ptr<DeviceProcess> probing;
    int64_t probe_until_ns = 0;
  };

  WorkerGroup() = default;
  bool alive(int device) const { return devices_[device].process != nullptr; }
  bool remote(int device) const { return device >= options_.num_devices - options_.remote_devices; }
  // Starts a device's worker. A remote one: takes a joined worker, waiting
  // up to `join_wait_ms`, and its link's round trips are measured (without
  // `wait_link` the call does not wait for them: NotFound while they are
  // measured; call again later).
  Status Spawn(int device, int64_t join_wait_ms = 0, bool wait_link = true);
  Status InitDevice(int device);
  // A probed remote worker's link: fit for collectives (Ok: it is taken),
  // refused (FailedPrecondition: it is let go), or not measured enough yet
  // (NotFound).
  Status CheckLink(int device);
  static uint64_t LinkSamplesNeeded(const Device& d);
  static int64_t LinkProbeNs(const Device& d);
  // Declares dead the remote devices among `devices` whose link is now as
  // bad as CheckLink refuses (before a plan change, which would stall on it).
  void DropDegradedLinks(const std::vector<int>& devices);
  // Requests sent: to whom, when, and their progress just before.
  struct Sent {
    std::vector<int> devices;
    std::vector<DeviceProgress> before;
    int64_t at_ns = 0;
  };
  // Sends one request to each listed device (fds[i] attached); a device
  // whose channel is closed is declared dead.
  Sent SendAll(const std::vector<int>& devices, WorkerOp op, const std::string& payload,
               const std::vector<std::vector<int>>& fds = {});
  // The same with a payload of its own for each device.
  Sent SendEach(const std::vector<int>& devices, WorkerOp op,
                const std::function<std::string(int device)>& payload,
                const std::vector<std::vector<int>>& fds = {});
  // Collects one reply from each device sent to within `deadline_ms`,
  // declaring dead those that exit or hang. Replies of dead devices are absent.
  // `expected_move_ns`: a step's expected time between two moves (0: not a
  // step; HangWatch::set_expected_move_ns).
  std::vector<DeviceReply> Collect(const Sent& sent, int64_t deadline_ms,
                                   int64_t expected_move_ns = 0);
  // Fences a device: its group aborted, its process killed, its channel closed.
  void MarkDead(const Verdict& verdict);
  // Waits for the processes fenced before to exit (a replacement needs what
  // they held: a GPU's memory), each until timeout_ms after it was killed
  // (one that outlives that is not waited for again), then forgets those
  // that did.
  void AwaitKilled(int64_t timeout_ms);
  Status FormGroup(const std::vector<int>& members);
  // kUnavailable naming the listed devices that died, or OK.
  Status DeadAmong(const std::vector<int>& devices, const char* during) const;
  // Seconds the cost model estimates `batch` at: the scheduler's estimate it
  // carries, or (none carried) one made here.
  double EstimateSeconds(const StepBatch& batch) const;

  WorkerGroupOptions options_;
  DType kv_dtype_ = DType::kF32;  // options_.kv_dtype, or the model's
  ModelConfig config_;
  Plan plan_;
  std::vector<Device> devices_;                         // indexed by device id
  std::vector<std::unique_ptr<DeviceProcess>> killed_;  // fenced, reaped once they exit
  ShmRegion logits_;
  DeviceProgressRegion progress_;
  CollectiveGroup group_;  // the current epoch's
  std::unique_ptr<KvStoreServer> store_;
  std::unique_ptr<HostKvBackup> backup_;
  StepDeadline deadline_;
  int64_t pool_pages_ = 0;  // each device's physical KV pool (an upper bound)
  int epoch_ = 0;
  std::vector<std::string> worker_env_;  // WorkerEnvironment
};

}  // namespace failsafe
