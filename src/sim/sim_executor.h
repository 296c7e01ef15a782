// The simulator's executor: the engine's Executor with modelled devices.
//
// The engine (engine/engine.h) runs unchanged on top: its scheduler, its
// recovery (replanning, the backup's bookkeeping, what can be restored and
// what must be recomputed, retries), its recompute accounting. This executor
// only stands in for the devices:
//   - a step advances the virtual clock by the cost model's duration for the
//     batch and returns synthetic tokens (no logits): token = a hash of the
//     sequence id and position, so a request's output does not depend on its
//     batching, preemption or recovery, as the real engine's does not;
//   - the devices' backup writers keep up: after each step every device that
//     writes a KV slot of a backed-up sequence has copied it to the step's end
//     (as far as the copy continues what the backup holds: a step starting
//     past it leaves the backup where it was), and the KV a request arrives
//     with (a decode instance's prefilled prompt) is copied as it arrives;
//   - a plan change is priced from what the engine asks of the devices:
//     weights each device gains (over PCIe from the host copy, and for a new
//     DP head group in pieces exchanged over NVLink), KV slots it restores
//     from the host backup (the positions the engine restores), and a new
//     collective group; the clock advances by it. A full recovery moves
//     weights and KV at once, as the devices do: each device's host link
//     carries its host weights and its KV restore together, its peer
//     weights come over NVLink after its host weights; the other modes
//     reload, then restore;
//   - a killed (or hung) device is detected after the profile's detection
//     delay (or the hang's): the step in flight fails at that instant;
//   - a device may run slow (SetDeviceSpeed: a throttled accelerator): its
//     segments of a step take 1/speed as long and every all-reduce waits for
//     it, so the step lasts as long as its slowest device. Each step reports
//     per device what the real devices report (StepTiming: compute time,
//     attention and FFN FLOPs, KV in use), which the engine's slow-device
//     monitor reads. A device that goes longer than the step's hang deadline
//     (engine/hang_detector.h: StepDeadline, from the steps' modelled times
//     against the scheduler's estimates, as the worker group derives it)
//     without reaching a collective is hung, as the real hang watch finds
//     it: declared lost at the deadline, and the step fails. A device merely
//     slower than its peers, within the deadline, is not;
//   - re-planning takes the coordinator's modelled time (ChargePlanning,
//     through the engine's on_planned hook: Configure).
//
// Thread-safety: none; the engine thread drives it and the clock advances
// only through it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/clock.h"
#include "engine/engine.h"
#include "engine/executor.h"
#include "engine/hang_detector.h"
#include "engine/kv_backup.h"
#include "sim/cost_model.h"

namespace failsafe {

struct SimExecutorOptions {
  ModelConfig model;
  HardwareProfile hw;
  Policy policy = Policy::kHybrid;
  int num_devices = 8;
  std::vector<int> alive;  // empty: all
  int block_size = 16;
  int max_batch_tokens = 2048;  // the activation reserve left out of the KV pools
  // KV pool per device (to mirror a real engine); empty: from the cost model.
  std::vector<int64_t> kv_pages;
  // Host memory for the KV backup, in the backup's layout (engine/kv_backup.h);
  // 0: room for every block the KV pools can hold; < 0: no backup (every lost
  // token is recomputed).
  int64_t backup_bytes = 0;
  int max_seqs = 1024;  // sequences the backup can track at once
  // Forming a new collective group at a plan change.
  double group_s = 1e-3;
  // The hang deadline of a step (the worker group's default).
  DeadlineOptions deadline;
};

class SimExecutor final : public Executor, public DeviceFaults {
 public:
  // `clock` must outlive the executor; the engine driving it should read it
  // (EngineOptions::clock).
  static Result<std::unique_ptr<SimExecutor>> Create(const SimExecutorOptions& options,
                                                     FakeClock* clock);

  const ModelConfig& config() const override { return options_.model; }
  const Plan& plan() const override { return plan_; }
  Result<StepOutput> Step(const StepBatch& batch, StepTiming* timing) override;
  Status FreeSeqs(const std::vector<int64_t>& seq_ids) override;
  std::vector<int64_t> kv_capacity_pages() const override { return capacity_; }
  int block_size() const override { return options_.block_size; }

  bool supports_recovery() const override { return true; }
  HostKvBackup* backup() override { return backup_.get(); }
  std::vector<int> alive_devices() const override;
  Status CheckHealth(int64_t timeout_ms) override;
  Result<std::vector<int64_t>> KvCapacityFor(const Plan& plan) const override;
  Result<ApplyReport> ApplyPlan(const Plan& next, RecoveryMode mode,
                                const DeviceRestores& seqs) override;
  // The device dies now; it is detected after the profile's detection delay.
  Status KillDevice(int device) override;
  // The device computes at `speed` (0, 1] of the profile's rate from now on,
  // until it is set again or replaced (SpawnDevice: speed 1).
  Status SetDeviceSpeed(int device, double speed) override;
  // The coordinator's modelled time to compute a plan change
  // (ReplanSeconds) passes on the virtual clock.
  void ChargePlanning(const Plan& next, int64_t sequences);
  // What an engine over this executor (or over wrappers of it) needs: the
  // virtual clock, planning charged to it (EngineOptions::on_planned), and
  // requests that arrive prefilled accepted.
  void Configure(EngineOptions* options);
  // A new device in its place (alive at once; its weights and KV are priced
  // by the plan change that takes it in).
  Status SpawnDevice(int device, bool wait) override;
  DeviceLoss device_loss(int device) const override;

  // The device stops making progress now and is declared dead after
  // `detect_s` (the hang detector's deadline).
  Status HangDevice(int device, double detect_s);

  // The device runs (not killed or hung, found or not).
  bool up(int device) const { return Up(device); }
  // Its compute speed relative to the profile.
  double speed(int device) const { return speed_[device]; }
  // A device of the plan is down (found or not yet).
  bool any_down() const;
  // The token a step gives for the position `position` of a sequence.
  int32_t SyntheticToken(int64_t seq_id, int position) const;
  const ClusterCostModel& cost() const { return *cost_; }
  // Sequences the devices hold (stepped and not freed), with their DP ranks.
  const std::unordered_map<int64_t, int>& held() const { return held_; }

 private:
  SimExecutor() = default;
  bool Up(int device) const { return !down_[device]; }
  // Devices of `active` that are down: the clock moves to the earliest of
  // their detections and the call fails.
  Status FailIfDown(const std::vector<int>& active);
  // Per active device and DP rank of `plan`: the KV slots the device caches
  // (Plan::KvSlots), and per DP rank the devices that back up some slot.
  void CacheSlots();

  SimExecutorOptions options_;
  FakeClock* clock_ = nullptr;
  Plan plan_;
  std::unique_ptr<ClusterCostModel> cost_;
  std::vector<int64_t> capacity_;
  std::unique_ptr<HostKvBackup> backup_;
  std::vector<DeviceLoss> loss_;                      // [device]; of a device down
  std::vector<bool> down_;                            // [device]; killed, hung or not started
  std::unordered_map<int64_t, int> held_;             // sequence -> DP rank
  std::vector<std::vector<std::vector<int>>> slots_;  // [device][dp rank] (plan_)
  std::vector<std::vector<int>> writers_;             // [dp rank] -> devices
  std::vector<int32_t> tokens_;                       // the last step's, per logits row
  StepPlan step_;                                     // the step being priced
  ClusterStepCost step_cost_;                         // its cost per device
  std::vector<double> speed_;                         // [device], relative to the profile
  StepDeadline deadline_;                             // the hang deadline of a step
  // KV in use: per sequence its length (positions with KV on the devices),
  // per device the token slots its sequences hold (sum of length x slots).
  std::unordered_map<int64_t, int> kv_len_;
  std::vector<int64_t> kv_slot_tokens_;  // [device]
};

}  // namespace failsafe
