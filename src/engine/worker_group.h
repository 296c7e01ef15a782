// The real executor: one worker process per device.
//
// The coordinator spawns a process per device; each maps the host weights and
// loads only its share of the plan, owns its KV pool, and joins the
// collective group of the plan's active devices. A step goes to every active
// device over its control channel (tokens, positions, DP ranks: small);
// logits come back through a shared-memory region; all-reduces run among the
// devices without the coordinator.
//
// A device that dies (exit, crash, SIGKILL) or misses the step deadline is
// detected through its pidfd, its closed channel, or the deadline: the group
// is aborted so that no survivor waits on it, and Step fails with
// kUnavailable naming the dead devices. The coordinator itself never goes down
// with a device.
//
// Thread-safety: one thread drives a WorkerGroup.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "comm/channel.h"
#include "comm/kv_store.h"
#include "comm/shm_region.h"
#include "engine/executor.h"
#include "engine/kv_backup.h"
#include "worker/protocol.h"

namespace failsafe {

struct WorkerGroupOptions {
  std::string model_dir;
  std::string worker_binary = "/proc/self/exe";  // the failsafe program
  int num_devices = 1;
  Policy policy = Policy::kHybrid;
  std::vector<int> alive;  // empty: every device
  int threads_per_device = 1;
  int block_size = 16;
  int64_t kv_pages = 0;  // per device; 0: from device_memory_bytes
  // Memory of one device (weights + KV + activations); 0: KV for 64K tokens
  // of every slot.
  int64_t device_memory_bytes = 0;
  // Host memory for the KV backup; 0: no backup.
  int64_t backup_bytes = 0;
  int max_seqs = 1024;  // sequences the backup can track
  CommKind comm = CommKind::kShm;
  std::string gloo_hostname = "127.0.0.1";
  int64_t collective_timeout_ms = 120000;
  int64_t step_timeout_ms = 600000;
  int max_step_tokens = 4096;  // sizes the shared-memory collective slots
  int max_logits_rows = 1024;
  std::string log_level = "warn";
};

// Bytes a device keeps for step activations (an estimate from the shapes).
int64_t ActivationReserveBytes(const ModelConfig& config, int max_step_tokens);

class WorkerGroup final : public Executor {
 public:
  static Result<std::unique_ptr<WorkerGroup>> Start(const WorkerGroupOptions& options);
  ~WorkerGroup() override;

  const ModelConfig& config() const override { return config_; }
  const Plan& plan() const override { return plan_; }
  Result<const float*> Step(const StepBatch& batch, StepTiming* timing) override;
  Status FreeSeqs(const std::vector<int64_t>& seq_ids) override;
  std::vector<int64_t> kv_capacity_pages() const override;
  int block_size() const override { return options_.block_size; }

  bool supports_recovery() const override { return true; }
  HostKvBackup* backup() override { return backup_.get(); }
  std::vector<int> alive_devices() const override;
  Status CheckHealth(int64_t timeout_ms) override;
  Status DrainBackup() override;
  Result<std::vector<int64_t>> KvCapacityFor(const Plan& plan) const override;
  Result<ApplyReport> ApplyPlan(const Plan& next, RecoveryMode mode,
                                const std::vector<SeqRestore>& seqs) override;
  Status SpawnDevice(int device) override;
  DeviceLoss device_loss(int device) const override;

  // Devices of the plan found dead so far (ascending).
  std::vector<int> dead_devices() const;
  // Kills a device's process for real (fault injection).
  Status KillDevice(int device) override;
  pid_t device_pid(int device) const;
  // Weight bytes each device reported after loading its share.
  int64_t device_weight_bytes(int device) const;
  // KV pool of a device, in pages of block_size tokens of one (layer, head).
  int64_t device_kv_pages(int device) const { return devices_[device].kv_pages; }

 private:
  struct Device {
    int id = -1;
    pid_t pid = -1;
    int pidfd = -1;
    Channel channel;
    bool alive = false;
    int64_t weight_bytes = 0;
    int64_t kv_pages = 0;     // accounting capacity under the current plan
    int64_t detected_ns = 0;  // when it was found dead
    int64_t killed_ns = 0;    // when KillDevice killed it
    std::string loss_reason;
    uint32_t request_seq = 0;  // of the last request sent
  };

  WorkerGroup() = default;
  Status Spawn(int device);
  Status SendTo(int device, WorkerOp op, const std::string& payload,
                const std::vector<int>& fds = {});
  Status InitDevice(int device);
  // Sends one request to each listed device (fds_for(device) attached).
  Status SendAll(const std::vector<int>& devices, WorkerOp op, const std::string& payload,
                 const std::vector<std::vector<int>>& fds = {});
  // Collects one reply from each listed device, watching for deaths. Replies
  // of dead devices are absent from the result.
  std::vector<std::pair<int, Status>> CollectAll(const std::vector<int>& devices,
                                                 int64_t timeout_ms,
                                                 std::vector<std::string>* bodies);
  void MarkDead(int device, const char* why);
  Status FormGroup(const std::vector<int>& members);

  WorkerGroupOptions options_;
  ModelConfig config_;
  Plan plan_;
  std::vector<Device> devices_;  // indexed by device id
  ShmRegion logits_;
  ShmRegion comm_region_;  // the current shared-memory group, if any
  std::unique_ptr<KvStoreServer> store_;
  std::unique_ptr<HostKvBackup> backup_;
  int64_t pool_pages_ = 0;  // each device's physical KV pool (an upper bound)
  int epoch_ = 0;
};

}  // namespace failsafe
