// Deterministic chaos in virtual time: the engine (engine/engine.h) over the
// simulated executor (sim/sim_executor.h), wrapped in the fault injector
// (engine/fault_injection.h), under a seeded schedule of faults and
// requests:
//   kill      a device dies (found after the profile's detection delay);
//   hang      a device stops making progress (found after a hang deadline);
//   slow      a device runs at 0.2-0.8 of its speed for a while, then at full
//             speed again (the engine measures it and rebalances); one time
//             in ten it nearly stops (slow_stall: the step's hang deadline
//             finds it);
//   rejoin    a new device takes a lost one's place;
//   cascade   a device dies, and another in the middle of the plan change
//             that follows;
//   apply     plan changes fail without a death (before or after the devices
//             moved: a lost reply), up to the engine's retry limit and beyond;
//   step      steps fail without a death (a collective timeout, a lost reply);
//   free      freeing finished sequences fails.
// Idle time is skipped, so thousands of faults span simulated days.
//
// After every engine call the run checks the engine's invariants: the block
// manager's books (used pages = what the sequences hold; every page id owned
// once, walked after every recovery, rejoin and health check and every 64th
// step), every sequence's progress within its request, every token a request
// receives the one its position calls for (no token lost, repeated or
// changed by a rollback), no event after a request's outcome. At the end,
// with every device back, every request has exactly one outcome and, unless
// the engine failed it with an error, exactly its tokens: up to its stop
// token or its length.
//
// Same options, same run, bit for bit: the digest covers every event, every
// virtual instant and every fault.
//
// Thread-safety: RunChaos is self-contained (no shared state).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/status.h"
#include "placement/replan.h"

namespace failsafe {

struct ChaosOptions {
  uint64_t seed = 1;
  int faults = 1000;
  std::string model = "llama-3.1-70b";
  std::string hardware = "h100-sxm-80gb";
  int num_devices = 8;
  RecoveryMode recovery = RecoveryMode::kFull;
  double mean_fault_gap_s = 60;   // virtual seconds between faults, on average
  double requests_per_fault = 3;  // requests arriving between faults, on average
  int max_prompt = 2048;
  int max_output = 256;
  // Host memory for the KV backup (SimExecutorOptions::backup_bytes): 0 holds
  // all KV; a small budget exercises partial backups.
  int64_t backup_bytes = 0;
  // Page ids and block tables (the real engine's bookkeeping, checked
  // fully); false: pages are only counted.
  bool page_ids = true;
  // The prefix cache with its host tier: two requests in three start with
  // one of a few shared prefixes, so that sequences share cached blocks
  // through failures, hangs, rejoins and rebalances.
  bool prefix_cache = false;
};

struct ChaosReport {
  uint64_t digest = 0;
  std::map<std::string, int64_t> faults;  // per kind
  int64_t requests = 0;
  int64_t finished = 0;           // with their tokens (length or stop token)
  int64_t failed = 0;             // ended by the engine with an error
  int64_t refused = 0;            // refused at submission: too few devices for their KV
  int64_t tokens = 0;             // received
  int64_t steps = 0;              // engine steps that ran
  int64_t recoveries = 0;         // recovery reports (a cascade extends one)
  int64_t rebalances = 0;         // of which plan changes for slow devices
  int64_t prefix_hit_blocks = 0;  // prefix cache: device-tier block hits
  int64_t kept_sharing = 0;       // requests naming cached blocks through a plan change
  int64_t invariant_checks = 0;
  int64_t page_checks = 0;  // of which walked every page id (KvBlockManager::CheckInvariants)
  double virtual_s = 0;
  double wall_s = 0;
  int64_t violations = 0;
  std::vector<std::string> first_violations;  // up to 20

  int64_t total_faults() const;
  std::string ToText() const;
  std::string ToJson() const;
};

// Fails only on bad options; what the run found is in the report.
Result<ChaosReport> RunChaos(const ChaosOptions& options);

}  // namespace failsafe
