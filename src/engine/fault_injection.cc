#include "engine/fault_injection.h"

namespace failsafe {

void FaultInjectingExecutor::Inject(ExecutorCall call, InjectedFault fault) {
  std::lock_guard<std::mutex> lock(mu_);
  Armed& a = armed_[static_cast<int>(call)];
  a.fault = std::move(fault);
  a.armed = true;
}

void FaultInjectingExecutor::Clear(ExecutorCall call) {
  std::lock_guard<std::mutex> lock(mu_);
  armed_[static_cast<int>(call)].armed = false;
}

int FaultInjectingExecutor::calls(ExecutorCall call) const {
  std::lock_guard<std::mutex> lock(mu_);
  return armed_[static_cast<int>(call)].calls;
}

int FaultInjectingExecutor::injected(ExecutorCall call) const {
  std::lock_guard<std::mutex> lock(mu_);
  return armed_[static_cast<int>(call)].injected;
}

FaultInjectingExecutor::Decision FaultInjectingExecutor::Decide(ExecutorCall call) const {
  std::lock_guard<std::mutex> lock(mu_);
  Armed& a = armed_[static_cast<int>(call)];
  a.calls++;
  if (!a.armed) return {};
  if (a.fault.skip > 0) {
    a.fault.skip--;
    return {};
  }
  if (a.fault.times == 0) return {};
  if (a.fault.times > 0) a.fault.times--;
  a.injected++;
  return {a.fault.error, a.fault.after};
}

template <typename R, typename Call>
R FaultInjectingExecutor::Forward(ExecutorCall which, Call call) const {
  Decision d = Decide(which);
  if (!d.error.ok() && !d.after) return d.error;
  R r = call();
  if (!d.error.ok()) return d.error;
  return r;
}

Result<StepOutput> FaultInjectingExecutor::Step(const StepBatch& batch, StepTiming* timing) {
  return Forward<Result<StepOutput>>(ExecutorCall::kStep,
                                     [&] { return inner()->Step(batch, timing); });
}

Status FaultInjectingExecutor::FreeSeqs(const std::vector<int64_t>& seq_ids) {
  return Forward<Status>(ExecutorCall::kFreeSeqs, [&] { return inner()->FreeSeqs(seq_ids); });
}

Status FaultInjectingExecutor::CheckHealth(int64_t timeout_ms) {
  return Forward<Status>(ExecutorCall::kCheckHealth,
                         [&] { return inner()->CheckHealth(timeout_ms); });
}

Status FaultInjectingExecutor::DrainBackup() {
  return Forward<Status>(ExecutorCall::kDrainBackup, [&] { return inner()->DrainBackup(); });
}

Result<std::vector<int64_t>> FaultInjectingExecutor::KvCapacityFor(const Plan& plan) const {
  return Forward<Result<std::vector<int64_t>>>(ExecutorCall::kKvCapacityFor,
                                               [&] { return inner()->KvCapacityFor(plan); });
}

Result<ApplyReport> FaultInjectingExecutor::ApplyPlan(const Plan& next, RecoveryMode mode,
                                                      const DeviceRestores& seqs) {
  return Forward<Result<ApplyReport>>(ExecutorCall::kApplyPlan,
                                      [&] { return inner()->ApplyPlan(next, mode, seqs); });
}

Status FaultInjectingExecutor::SpawnDevice(int device, bool wait) {
  return Forward<Status>(ExecutorCall::kSpawnDevice,
                         [&] { return inner()->SpawnDevice(device, wait); });
}

}  // namespace failsafe
