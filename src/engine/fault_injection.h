// Fault injection as a wrapper: an executor that forwards every call to
// another and makes chosen calls fail, so that every error path of the
// engine (Engine::Step, Engine::Recover) can be driven on purpose against a
// real executor underneath. Device deaths and hangs are injected for real
// (DeviceFaults::KillDevice on the executor underneath, or signals to a
// worker process); this wrapper injects the errors that are not deaths: a
// collective that timed out, a device that answered with an error, a reply
// lost after the work was done.
//
// Thread-safety: one thread drives the executor; Inject and the counters may
// be called from any thread.
#pragma once

#include <array>
#include <mutex>

#include "engine/executor.h"

namespace failsafe {

enum class ExecutorCall {
  kStep,
  kFreeSeqs,
  kDrainBackup,
  kApplyPlan,
  kKvCapacityFor,
  kCheckHealth,
  kSpawnDevice,  // the last
};
inline constexpr int kNumExecutorCalls = static_cast<int>(ExecutorCall::kSpawnDevice) + 1;

struct InjectedFault {
  Status error;        // what the call returns
  int skip = 0;        // calls that go through first
  int times = 1;       // calls that then fail (-1: every one from then on)
  bool after = false;  // fail after the wrapped executor did the work (a lost reply)
};

class FaultInjectingExecutor final : public ExecutorWrapper {
 public:
  // `inner` must outlive the wrapper.
  explicit FaultInjectingExecutor(Executor* inner) : ExecutorWrapper(inner) {}

  // Arms a fault for a call (replacing any armed before for it).
  void Inject(ExecutorCall call, InjectedFault fault);
  void Clear(ExecutorCall call);
  int calls(ExecutorCall call) const;     // calls made so far
  int injected(ExecutorCall call) const;  // of which failed on purpose

  // The calls faults can be injected into; ExecutorWrapper forwards the rest.
  Result<StepOutput> Step(const StepBatch& batch, StepTiming* timing) override;
  Status FreeSeqs(const std::vector<int64_t>& seq_ids) override;
  Status CheckHealth(int64_t timeout_ms) override;
  Status DrainBackup() override;
  Result<std::vector<int64_t>> KvCapacityFor(const Plan& plan) const override;
  Result<ApplyReport> ApplyPlan(const Plan& next, RecoveryMode mode,
                                const DeviceRestores& seqs) override;
  Status SpawnDevice(int device, bool wait) override;

 private:
  struct Armed {
    InjectedFault fault;
    bool armed = false;
    int calls = 0;
    int injected = 0;
  };
  struct Decision {
    Status error;  // OK: the call goes through
    bool after = false;
  };
  // Counts a call and decides its fate.
  Decision Decide(ExecutorCall call) const;
  // Makes a call of kind `which` through `call` (which calls the wrapped
  // executor) unless an armed fault fails it before; a fault armed `after`
  // fails it once the work is done.
  template <typename R, typename Call>
  R Forward(ExecutorCall which, Call call) const;

  mutable std::mutex mu_;
  mutable std::array<Armed, kNumExecutorCalls> armed_;  // guarded by mu_
};

}  // namespace failsafe
