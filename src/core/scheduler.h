// The scheduler: continuous batching over the devices of a plan.
//
// Pure logic, shared by the real engine and the simulator: no threads, no
// I/O, no clock reads (callers pass times in). Each step it emits a StepPlan
// (which sequences compute how many tokens, each with its DP rank) and later
// consumes the sampled tokens.
//
// A step mixes one decode token of every running sequence with prefill chunks,
// within a token budget. KV blocks are owned per device by the block manager (KvBlockManager);
// sequences are admitted only if every device has room (check, then commit),
// and when a decode cannot get a block the newest running sequence is
// preempted (its KV freed, to be recomputed later).
//
// Routing: a sequence gets its DP rank when first scheduled: round-robin, or
// load-aware (the device with the least pending DP work, in tokens).
//
// Prefill: `fifo` gives each waiting request one chunk, in arrival order,
// while the budget lasts. `adaptive` (docs/SCHEDULER.md) hands out tokens one
// unit at a time to a request on the DP rank that is least loaded so far,
// with a cost that grows with the chunk's length and context, and keeps the
// prefix of that sequence with the best estimated tokens per second.
//
// Thread-safety: none; one thread drives it.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "core/kv_blocks.h"
#include "core/prefix_host_tier.h"
#include "core/sequence.h"
#include "core/step_cost.h"

namespace failsafe {

enum class RouterPolicy { kRoundRobin, kLoadAware };
enum class PrefillPolicy { kFifo, kAdaptive };
Result<RouterPolicy> ParseRouterPolicy(const std::string& name);
Result<PrefillPolicy> ParsePrefillPolicy(const std::string& name);
const char* RouterPolicyName(RouterPolicy p);
const char* PrefillPolicyName(PrefillPolicy p);

struct SchedulerConfig {
  int max_batch_tokens = 2048;  // tokens computed per step (prefill + decode)
  int max_num_seqs = 256;       // running sequences (also logits rows per step)
  int max_model_len = 4096;
  RouterPolicy router = RouterPolicy::kLoadAware;
  PrefillPolicy prefill = PrefillPolicy::kAdaptive;
  int adaptive_unit = 16;         // tokens per greedy step of the adaptive policy
  int adaptive_candidates = 64;   // waiting/prefilling requests the adaptive policy looks at
  double admit_watermark = 0.01;  // fraction of each device's pages kept free when admitting
  // Page ids and block tables for devices to write by (core/kv_blocks.h);
  // false: pages are only counted (the simulator).
  bool kv_page_ids = true;
  // Prefix caching (core/kv_blocks.h): a request starts from the KV of the
  // longest prefix of full blocks already cached.
  bool prefix_cache = false;
  // With prefix_cache, the host tier too (SetHostTier): after a request's
  // device-tier hit, the following full blocks the host holds are copied
  // into fresh pages instead of being computed.
  bool prefix_cache_host = false;
  // Names what else than the tokens makes KV differ (the model and its
  // configuration): it seeds the block hashes.
  uint64_t prefix_cache_seed = 0;
  // With DP heads a cached block's DP KV is on one DP rank: load-aware routing
  // sends a request to the rank with its longest cached prefix unless that
  // rank's pending DP work exceeds the least-loaded rank's by more than this
  // many tokens.
  int64_t prefix_affinity_tokens = 8192;
};

// What the prefix cache saved, counted when requests are admitted: first
// admissions (the hit rate a trace's sharing allows), and re-admissions of
// preempted requests apart (they find their own blocks again).
struct PrefixCacheStats {
  int64_t lookup_blocks = 0;          // full blocks of first-admitted requests looked up
  int64_t hit_blocks = 0;             // of which cached on the devices (device tier)
  int64_t hit_tokens = 0;             // prompt tokens not computed thanks to device-tier hits
  int64_t host_hit_blocks = 0;        // of which copied from the host tier instead
  int64_t host_hit_tokens = 0;        // prompt tokens copied from the host, not computed
  int64_t readmitted_hit_tokens = 0;  // tokens preempted requests did not recompute (both tiers)
  int64_t cached_blocks = 0;          // blocks in the cache now
  int64_t evicted_blocks = 0;
  double hit_rate() const {
    return lookup_blocks > 0 ? static_cast<double>(hit_blocks) / lookup_blocks : 0.0;
  }
  double host_hit_rate() const {
    return lookup_blocks > 0 ? static_cast<double>(host_hit_blocks) / lookup_blocks : 0.0;
  }
};

struct ScheduledSeq {
  int64_t seq_id = 0;
  int start = 0;  // = num_computed
  int num_tokens = 0;
  int dp_rank = 0;
  bool sample = false;  // the last token's logits are sampled
  // Rows of logits the step returns for it (Sequence::LogitsRows): its last
  // `logits_rows` positions'.
  int logits_rows = 0;
  // Blocks [kv_first_block, kv_blocks) of its block tables are new to the
  // devices: the step carries them (KvBlockManager::Table).
  int kv_first_block = 0;
  // Host-tier hit (admitted in this step): blocks [host_first_block,
  // host_first_block + host_blocks) are copied from the host into their new
  // pages before the step computes; `start` is past them.
  int host_first_block = 0;
  int host_blocks = 0;
};

struct StepPlan {
  std::vector<ScheduledSeq> seqs;
  std::vector<int64_t> preempted;  // release their KV on the devices before the step
  int prefill_tokens = 0;
  int decode_tokens = 0;
  double estimated_time = 0;  // seconds, from StepCost
  bool empty() const { return seqs.empty(); }
  int num_tokens() const { return prefill_tokens + decode_tokens; }
};

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& config, const Plan& plan, const ModelConfig& model,
            int block_size, std::vector<int64_t> kv_capacity_pages, const DeviceSpeed& speed = {});

  // Validates and queues a request. The sequence must have a new id.
  Status Add(std::unique_ptr<Sequence> seq);
  // Finishes a request early (client gone); its KV is released.
  void Abort(int64_t id, FinishReason why = FinishReason::kAborted);

  // The host tier of the prefix cache (with prefix_cache and
  // prefix_cache_host; null: none). Not owned; it outlives the scheduler.
  void SetHostTier(const PrefixHostTier* tier) { host_tier_ = tier; }
  bool host_tier() const { return host_tier_ != nullptr; }

  StepPlan Schedule();
  // Applies a step's results: sampled[i] is the token of plan.seqs[i] if it
  // sampled (ignored otherwise). Finishes sequences that hit a limit.
  void Update(const StepPlan& plan, const std::vector<int32_t>& sampled);

  // Sequences finished since the last call (their KV must be freed on the
  // devices); ownership passes to the caller.
  std::vector<std::unique_ptr<Sequence>> TakeFinished();

  // After a failure or rejoin: new plan and capacities. Sequences keep their
  // computed KV (the engine restores it onto the new devices); DP ranks on
  // devices that left are re-routed, and with DP heads sequences sharing
  // cached blocks go to one rank (all listed in `rerouted`). The block
  // manager moves every running sequence's tables, and the cached blocks
  // they name, to the new plan (kv().Table, kv().GainedSlots). Returns
  // sequences preempted to fit the new capacities.
  std::vector<int64_t> Reconfigure(const Plan& plan, std::vector<int64_t> kv_capacity_pages,
                                   std::vector<int64_t>* rerouted);
  // After Reconfigure, given how many positions of each running sequence
  // the engine can restore (`restore`, by id): a sequence restored to fewer
  // positions than its cached blocks hold must write them again. A block
  // only it names becomes its own; a block another sharer can restore keeps
  // its KV for the sharers, and the sequence is preempted; a block no
  // sharer can restore goes to its first sharer, the others preempted.
  // Cached blocks left unnamed are dropped (their KV was not restored).
  // Each cached block is then restored once, by the first running sequence
  // that names it.
  struct KeptSharing {
    std::vector<int64_t> preempted;
    // By id: where a sequence's restore starts, past its leading cached
    // blocks an earlier sequence restores (absent: 0).
    std::unordered_map<int64_t, int> restore_from;
  };
  KeptSharing KeepRestorableSharing(const std::unordered_map<int64_t, int>& restore);
  // The devices may not have applied the block tables of these sequences'
  // last step (it failed): the next step carries their whole tables.
  void ResendKvTables(const std::vector<int64_t>& ids);
  // Rolls a running sequence back to `num_computed` tokens of KV (its KV past
  // that was lost and will be recomputed).
  void RollBack(int64_t id, int num_computed);

  const Sequence* Find(int64_t id) const;
  std::vector<const Sequence*> Running() const;
  std::vector<const Sequence*> Waiting() const;
  int num_waiting() const { return static_cast<int>(waiting_.size()); }
  int num_running() const { return static_cast<int>(running_.size()); }
  bool idle() const { return waiting_.empty() && running_.empty(); }
  // Sequences finished and not yet taken (TakeFinished).
  bool has_finished() const { return !finished_.empty(); }
  const KvBlockManager& kv() const { return *kv_; }
  const SchedulerConfig& config() const { return config_; }
  // Pending DP work per device, in tokens (what load-aware routing balances).
  std::vector<int64_t> DpLoad() const;
  PrefixCacheStats prefix_cache_stats() const;

 private:
  StepPlan ScheduleOnce();
  int Route();
  // Routing for a request whose full blocks hash to `hashes`: with a prefix
  // cache and DP heads, the rank holding its longest cached prefix within
  // prefix_affinity_tokens of the least-loaded rank's work.
  int RouteFor(const Sequence& s, std::span<const uint64_t> hashes);
  // The hashes of the full blocks a prefill candidate may find cached (never
  // its last token), or nullopt when it does not look the cache up (the
  // cache is off, or it is running or has KV).
  std::optional<std::span<const uint64_t>> LookupHashes(Sequence* s);
  // Gives a prefill candidate its DP rank if it has none.
  void RouteCandidate(Sequence* s);
  // If a candidate is waiting with nothing computed, attaches its cached
  // prefix (undone by DetachUnadmitted if the step does not admit it).
  // Host-tier blocks are taken only as far as their pages and one computed
  // token fit next to `pending` with `keep` pages left.
  void AttachCandidate(Sequence* s, const std::vector<int64_t>& pending,
                       const std::vector<int64_t>& keep);
  // Undoes a candidate's attachment within the step (it is not admitted);
  // false if it had none.
  bool DetachCandidate(Sequence* s);
  void DetachUnadmitted();
  void Preempt(Sequence* s, StepPlan* plan);
  void FinishSeq(Sequence* s, FinishReason why);
  // Releases the sequence's KV where the block manager counts it: during a
  // plan change, a sequence rerouted off a lost rank is still counted under
  // its old rank (counted_rank_) until the manager is reconfigured.
  void ReleaseKv(Sequence* s);
  // Pages per device an admission leaves free: the watermark, room for the
  // running sequences to grow; with none running, none (else a request that
  // fits the devices alone might never be admitted).
  std::vector<int64_t> PrefillAdmitReserve() const;
  void SchedulePrefillFifo(int budget, StepPlan* plan, std::vector<Sequence*>* chunks,
                           std::vector<int>* sizes);
  void SchedulePrefillAdaptive(int budget, StepPlan* plan, std::vector<Sequence*>* chunks,
                               std::vector<int>* sizes);
  std::vector<Sequence*> PrefillCandidates(int limit);
  // The largest chunk of `s` (from num_computed) whose logits take at most
  // `extra` rows past one: only requests asking for prompt logprobs take
  // more than one.
  static int ChunkForRows(const Sequence& s, int extra);
  bool CanAdmit(const Sequence& s, int tokens) const;

  const SchedulerConfig config_;
  ModelConfig model_;
  Plan plan_;
  // Pages counted (config_.kv_page_ids false) or with ids too.
  std::unique_ptr<KvBlockManager> kv_;
  StepCost cost_;
  DeviceSpeed speed_;
  std::unordered_map<int64_t, std::unique_ptr<Sequence>> seqs_;
  std::deque<Sequence*> waiting_;   // arrival order (preempted ones in front)
  std::vector<Sequence*> running_;  // admission order
  std::vector<std::unique_ptr<Sequence>> finished_;
  std::vector<int64_t> dp_load_;  // [device] -> pending DP tokens of routed sequences
  int rr_next_ = 0;
  struct Lookup {
    Sequence* s;
    int looked_up = 0;  // full blocks
    int hit = 0;        // blocks attached
    int host = 0;       // blocks after them copied from the host tier
  };
  std::vector<Lookup> lookups_;  // waiting candidates of this step that were looked up
  PrefixCacheStats prefix_stats_;
  const PrefixHostTier* host_tier_ = nullptr;
  int64_t preempted_last_ = -1;
  // Logits rows of this step not yet spoken for: a step returns at most
  // max_num_seqs, one per sequence that samples, and more for chunks of
  // prompts whose logprobs are wanted.
  int spare_rows_ = 0;
  std::unordered_map<int64_t, int> counted_rank_;  // within Reconfigure: rerouted -> old rank
};

}  // namespace failsafe
