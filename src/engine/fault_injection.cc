#include "engine/fault_injection.h"

namespace failsafe {

const char* ExecutorCallName(ExecutorCall call) {
  switch (call) {
    case ExecutorCall::kStep:
      return "Step";
    case ExecutorCall::kFreeSeqs:
      return "FreeSeqs";
    case ExecutorCall::kDrainBackup:
      return "DrainBackup";
    case ExecutorCall::kApplyPlan:
      return "ApplyPlan";
    case ExecutorCall::kKvCapacityFor:
      return "KvCapacityFor";
    case ExecutorCall::kCheckHealth:
      return "CheckHealth";
    case ExecutorCall::kSpawnDevice:
      return "SpawnDevice";
  }
  return "?";
}

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

Result<const float*> FaultInjectingExecutor::Step(const StepBatch& batch, StepTiming* timing) {
  Decision d = Decide(ExecutorCall::kStep);
  if (!d.error.ok() && !d.after) return d.error;
  auto r = inner_->Step(batch, timing);
  if (!d.error.ok()) return d.error;
  return r;
}

Status FaultInjectingExecutor::FreeSeqs(const std::vector<int64_t>& seq_ids) {
  Decision d = Decide(ExecutorCall::kFreeSeqs);
  if (!d.error.ok() && !d.after) return d.error;
  Status st = inner_->FreeSeqs(seq_ids);
  return d.error.ok() ? st : d.error;
}

Status FaultInjectingExecutor::CheckHealth(int64_t timeout_ms) {
  Decision d = Decide(ExecutorCall::kCheckHealth);
  if (!d.error.ok() && !d.after) return d.error;
  Status st = inner_->CheckHealth(timeout_ms);
  return d.error.ok() ? st : d.error;
}

Status FaultInjectingExecutor::DrainBackup() {
  Decision d = Decide(ExecutorCall::kDrainBackup);
  if (!d.error.ok() && !d.after) return d.error;
  Status st = inner_->DrainBackup();
  return d.error.ok() ? st : d.error;
}

Result<std::vector<int64_t>> FaultInjectingExecutor::KvCapacityFor(const Plan& plan) const {
  Decision d = Decide(ExecutorCall::kKvCapacityFor);
  if (!d.error.ok() && !d.after) return d.error;
  auto r = inner_->KvCapacityFor(plan);
  if (!d.error.ok()) return d.error;
  return r;
}

Result<ApplyReport> FaultInjectingExecutor::ApplyPlan(const Plan& next, RecoveryMode mode,
                                                      const std::vector<SeqRestore>& seqs) {
  Decision d = Decide(ExecutorCall::kApplyPlan);
  if (!d.error.ok() && !d.after) return d.error;
  auto r = inner_->ApplyPlan(next, mode, seqs);
  if (!d.error.ok()) return d.error;
  return r;
}

Status FaultInjectingExecutor::SpawnDevice(int device) {
  Decision d = Decide(ExecutorCall::kSpawnDevice);
  if (!d.error.ok() && !d.after) return d.error;
  Status st = inner_->SpawnDevice(device);
  return d.error.ok() ? st : d.error;
}

}  // namespace failsafe
