#include "sim/chaos.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "common/clock.h"
#include "common/rng.h"
#include "engine/engine.h"
#include "engine/fault_injection.h"
#include "sim/profiles.h"
#include "sim/sim_executor.h"

namespace failsafe {

namespace {

int64_t ToNanos(double seconds) { return std::llround(seconds * 1e9); }

// Every step checks the books by sequence; the page-by-page walk runs after
// every recovery, rejoin and health check, and every this many steps.
constexpr int64_t kFullCheckEvery = 64;

// What the run knows of one request: what it must receive, what it did.
struct Tracked {
  int prompt_len = 0;
  int expected = 0;  // tokens it must receive (to its stop token or its length)
  int received = 0;
  bool done = false;
  FinishReason reason = FinishReason::kNone;
  // Prefix cache: the recoveries there had been when it was first seen
  // naming cached blocks (-1: not yet), and whether it has since gone
  // through a plan change naming them.
  int64_t sharing_since = -1;
  bool kept_sharing = false;
};

class ChaosRun {
 public:
  ChaosRun(const ChaosOptions& o, SimExecutor* exec, FakeClock* clock)
      : o_(o), exec_(exec), faulty_(exec), clock_(clock), rng_(HashCombine(o.seed, 0xc4a05)) {}

  // The engine is made here: its before_apply hook needs the run.
  void Start(const SchedulerConfig& sched) {
    EngineOptions eo;
    exec_->Configure(&eo);
    eo.recovery = o_.recovery;
    eo.before_apply = [this](int attempt) { BeforeApply(attempt); };
    eo.rebalance_slow = true;  // slow devices get a smaller share, and it back
    engine_ = std::make_unique<Engine>(&faulty_, sched, eo);
  }

  void Run(ChaosReport* report) {
    report_ = report;
    const double gap = o_.mean_fault_gap_s;
    const double arrival_gap = gap / std::max(1e-9, o_.requests_per_fault);
    // Instants in virtual nanoseconds (the clock's own unit: no rounding).
    int64_t next_fault = ToNanos(Exponential(gap));
    int64_t next_arrival = ToNanos(Exponential(arrival_gap));
    int faults = 0;
    // Faults and arrivals, then every device back and every request done.
    int64_t idle_rounds = 0;
    for (;;) {
      const int64_t now = clock_->NowNanos();
      const bool faulting = faults < o_.faults;
      if (!slowed_.empty() && now >= slowed_.begin()->first) {
        Unslow();
        continue;
      }
      if (faulting && now >= next_fault) {
        InjectFault();
        ++faults;
        next_fault = now + ToNanos(Exponential(gap));
        continue;
      }
      if (faulting && now >= next_arrival) {
        Submit();
        next_arrival = now + ToNanos(Exponential(arrival_gap));
        continue;
      }
      if (!faulting && !restored_) RestoreAll();
      // A busy engine finds a lost device by its failed step, an idle one
      // by a heartbeat; a degraded one tries again at each.
      if (engine_->degraded() || (exec_->any_down() && engine_->idle())) {
        Mix(0x4ea1);
        (void)engine_->CheckHealth(0);
        Check("after a health check");
      }
      bool progressed = false;
      if (!engine_->idle() && !engine_->degraded()) progressed = StepOnce();
      if (!faulting && engine_->idle() && !exec_->any_down()) break;
      if (progressed) {
        idle_rounds = 0;
        continue;
      }
      // Nothing ran: skip to the next fault or arrival.
      if (faulting) {
        int64_t next = std::min(next_fault, next_arrival);
        if (!slowed_.empty()) next = std::min(next, slowed_.begin()->first);
        if (next > clock_->NowNanos()) clock_->Set(next);
      } else if (++idle_rounds > 1000) {
        Violation("the engine makes no progress with every device back ({})",
                  engine_->degraded() ? engine_->degraded_reason() : "not degraded");
        break;
      } else {
        clock_->Advance(ToNanos(1.0));  // a degraded engine retries at its health checks
      }
    }
    Finish();
  }

 private:
  double Exponential(double mean) { return -mean * std::log(1.0 - rng_.Uniform()); }
  void Mix(uint64_t v) { report_->digest = HashCombine(report_->digest, v); }

  template <typename... Args>
  void Violation(fmt::format_string<Args...> f, Args&&... args) {
    report_->violations++;
    if (report_->first_violations.size() < 20) {
      report_->first_violations.push_back(fmt::format("t={:.3f}s: {}", clock_->NowSeconds(),
                                                      fmt::format(f, std::forward<Args>(args)...)));
    }
  }

  void Submit() {
    RequestSpec spec;
    const int prompt = 1 + static_cast<int>(rng_.Below(o_.max_prompt));
    spec.prompt.resize(prompt);
    const int vocab = exec_->config().vocab_size;
    for (int32_t& t : spec.prompt) t = static_cast<int32_t>(rng_.Below(vocab));
    if (o_.prefix_cache && rng_.Below(3) != 0) {
      // A shared prefix of up to half the prompt (the prefixes are drawn
      // once, from the seed).
      if (prefixes_.empty()) {
        Rng pr(HashCombine(o_.seed, 0x9ef1));
        prefixes_.resize(4);
        for (auto& p : prefixes_) {
          p.resize(std::max(1, o_.max_prompt / 2));
          for (int32_t& t : p) t = static_cast<int32_t>(pr.Below(vocab));
        }
      }
      const auto& p = prefixes_[rng_.Below(prefixes_.size())];
      std::copy(p.begin(), p.begin() + std::min<size_t>(p.size(), prompt / 2 + 1),
                spec.prompt.begin());
    }
    spec.max_new_tokens = 1 + static_cast<int>(rng_.Below(o_.max_output));
    spec.arrival = clock_->NowSeconds();
    // A third of the requests stop at a token of their own output.
    const int64_t id = next_id_;
    int expected = spec.max_new_tokens;
    if (rng_.Below(3) == 0) {
      const int at = static_cast<int>(rng_.Below(spec.max_new_tokens));
      spec.stop_token_ids.push_back(exec_->SyntheticToken(id, prompt + at));
    }
    for (int i = 0; i < spec.max_new_tokens; ++i) {
      const int32_t t = exec_->SyntheticToken(id, prompt + i);
      if (std::count(spec.stop_token_ids.begin(), spec.stop_token_ids.end(), t)) {
        expected = i + 1;
        break;
      }
    }
    auto submitted = engine_->Submit(std::move(spec));
    if (!submitted.ok()) {
      // Too few devices left for its KV: refused at once, an outcome too.
      if (submitted.status().code() != StatusCode::kResourceExhausted &&
          submitted.status().code() != StatusCode::kOutOfRange) {
        Violation("request {} was refused: {}", id, submitted.status().ToString());
      }
      report_->refused++;
      Mix(HashCombine(0x7ef, static_cast<uint64_t>(submitted.status().code())));
      return;
    }
    if (*submitted != id) Violation("request got id {}, expected {}", *submitted, id);
    ++next_id_;
    Tracked& t = tracked_[id];
    t.prompt_len = prompt;
    t.expected = expected;
    report_->requests++;
    Mix(HashCombine(id, HashCombine(prompt, expected)));
  }

  // A device of the plan that is up, or -1.
  int PickAlive() {
    std::vector<int> alive;
    for (int d : exec_->alive_devices()) {
      if (exec_->up(d)) alive.push_back(d);
    }
    // Keep one device: with none at all there is nothing left to test.
    if (alive.size() <= 1) return -1;
    return alive[rng_.Below(alive.size())];
  }

  int PickDead() {
    std::vector<int> dead;
    const std::vector<int> alive = exec_->alive_devices();
    for (int d = 0; d < exec_->plan().num_devices; ++d) {
      if (!std::count(alive.begin(), alive.end(), d)) dead.push_back(d);
    }
    if (dead.empty()) return -1;
    return dead[rng_.Below(dead.size())];
  }

  // Fails the next call(s) of `call` with `error`: 1 to `max_times` times
  // (0: once, drawing nothing), before or after the work (a lost reply).
  void InjectError(ExecutorCall call, Status error, int max_times) {
    InjectedFault f;
    f.error = std::move(error);
    if (max_times > 0) f.times = 1 + static_cast<int>(rng_.Below(max_times));
    f.after = rng_.Below(2) == 1;
    faulty_.Inject(call, f);
  }

  void Count(const std::string& kind) {
    report_->faults[kind]++;
    Mix(std::hash<std::string>{}(kind));
    Mix(static_cast<uint64_t>(clock_->NowNanos()));
  }

  void Rejoin(int d) {
    if (Status st = engine_->Rejoin(d); !st.ok() && st.code() != StatusCode::kUnavailable)
      Violation("rejoining device {}: {}", d, st.ToString());
    Check("after a rejoin");
  }

  void InjectFault() {
    // The more devices are gone, the likelier one comes back; a degraded
    // engine always gets one.
    const int dead = PickDead();
    const int num_dead =
        exec_->plan().num_devices - static_cast<int>(exec_->alive_devices().size());
    const uint64_t roll = rng_.Below(100);
    if (dead >= 0 &&
        (static_cast<int>(rng_.Below(100)) < 10 + 15 * num_dead || engine_->degraded())) {
      Count("rejoin");
      Rejoin(dead);
      return;
    }
    if (roll < 44) {
      const int d = PickAlive();
      if (d < 0) return Count("none");
      Count("kill");
      (void)exec_->KillDevice(d);
    } else if (roll < 54) {
      const int d = PickAlive();
      if (d < 0) return Count("none");
      Count("hang");
      (void)exec_->HangDevice(d, 0.2 + 2.0 * rng_.Uniform());
    } else if (roll < 64) {
      Slow();
    } else if (roll < 72) {
      const int d = PickAlive();
      if (d < 0) return Count("none");
      Count("cascade");
      (void)exec_->KillDevice(d);
      cascade_ = true;
    } else if (roll < 82) {
      Count("apply");
      InjectError(ExecutorCall::kApplyPlan, Unavailable("injected: a plan change failed"), 4);
    } else if (roll < 95) {
      Count("step");
      InjectError(ExecutorCall::kStep, DeadlineExceeded("injected: a collective timed out"), 3);
    } else {
      Count("free");
      InjectError(ExecutorCall::kFreeSeqs, Internal("injected: a device could not free sequences"),
                  0);
    }
  }

  // A device runs slower for a while (a throttled accelerator): at 0.2-0.8 of
  // its speed, merely slow, or one time in ten at 1/10,000, which the step's
  // hang deadline finds; back to full speed after a mean of two fault gaps
  // (unless it was replaced or lost before).
  void Slow() {
    const int d = PickAlive();
    if (d < 0) return Count("none");
    const bool stall = rng_.Below(10) == 0;
    const double speed = stall ? 1e-4 : 0.2 + 0.6 * rng_.Uniform();
    Count(stall ? "slow_stall" : "slow");
    Mix(static_cast<uint64_t>(speed * 1e6));
    if (Status st = exec_->SetDeviceSpeed(d, speed); !st.ok())
      return Violation("slowing device {}: {}", d, st.ToString());
    slowed_.emplace(clock_->NowNanos() + ToNanos(Exponential(2 * o_.mean_fault_gap_s)), d);
  }

  void Unslow() {
    const int d = slowed_.begin()->second;
    slowed_.erase(slowed_.begin());
    // A device replaced since runs at full speed; a lost one is gone.
    if (!exec_->up(d) || exec_->speed(d) == 1.0) return;
    Mix(HashCombine(0x510, d));
    if (Status st = exec_->SetDeviceSpeed(d, 1.0); !st.ok())
      Violation("restoring device {}'s speed: {}", d, st.ToString());
  }

  // Called by the engine before each attempt to apply a plan.
  void BeforeApply(int attempt) {
    if (!cascade_) return;
    cascade_ = false;
    const int d = PickAlive();
    if (d < 0) return;
    report_->faults["cascade_second"]++;
    Mix(HashCombine(0xcafe, HashCombine(d, attempt)));
    (void)exec_->KillDevice(d);
  }

  void RestoreAll() {
    restored_ = true;
    faulty_.Clear(ExecutorCall::kApplyPlan);
    faulty_.Clear(ExecutorCall::kStep);
    faulty_.Clear(ExecutorCall::kFreeSeqs);
    // Dead devices found first, then each one back.
    (void)engine_->CheckHealth(0);
    for (int d = PickDead(); d >= 0; d = PickDead()) {
      const int before = d;
      Rejoin(d);
      if (PickDead() == before) {
        Violation("device {} could not rejoin", d);
        break;
      }
    }
  }

  bool StepOnce() {
    auto out = engine_->Step();
    Mix(static_cast<uint64_t>(clock_->NowNanos()));
    if (!out.ok()) {
      if (out.status().code() != StatusCode::kUnavailable)
        Violation("a step returned {}", out.status().ToString());
      Check("after a step");
      return false;
    }
    if (out->ran) report_->steps++;
    for (const TokenEvent& e : out->events) Observe(e);
    Check("after a step", out->recovered || report_->steps % kFullCheckEvery == 0);
    return out->ran || out->recovered || !out->events.empty();
  }

  void Observe(const TokenEvent& e) {
    Mix(HashCombine(e.id, HashCombine(static_cast<uint64_t>(e.token) + 1,
                                      static_cast<uint64_t>(e.reason) * 2 + e.finished)));
    auto it = tracked_.find(e.id);
    if (it == tracked_.end()) return Violation("an event for unknown request {}", e.id);
    Tracked& t = it->second;
    if (t.done) return Violation("request {} got an event after its outcome", e.id);
    if (e.token >= 0) {
      const int32_t want = exec_->SyntheticToken(e.id, t.prompt_len + t.received);
      if (e.token != want) {
        Violation("request {}: token {} is {}, its position calls for {}", e.id, t.received,
                  e.token, want);
      }
      t.received++;
      report_->tokens++;
    }
    if (!e.finished) return;
    t.done = true;
    t.reason = e.reason;
    if (e.reason == FinishReason::kError) {
      report_->failed++;
      return;
    }
    report_->finished++;
    if (t.received != t.expected) {
      Violation("request {} finished ({}) with {} tokens, expected {}", e.id,
                FinishReasonName(e.reason), t.received, t.expected);
    }
  }

  // `full`: also every page id's single owner (a walk over every page of
  // every device, the costliest check).
  void Check(const char* when, bool full = true) {
    report_->invariant_checks++;
    const Scheduler& s = engine_->scheduler();
    const KvBlockManager& kv = s.kv();
    if (full) {
      report_->page_checks++;
      if (Status st = kv.CheckInvariants(); !st.ok())
        Violation("{}: the block manager's books: {}", when, st.ToString());
      if (const HostKvBackup* b = exec_->backup()) {
        if (Status st = b->CheckInvariants(); !st.ok())
          Violation("{}: the host backup's books: {}", when, st.ToString());
      }
    }
    std::vector<int64_t> used(exec_->plan().num_devices, 0);
    auto add = [&](const Sequence* q) {
      for (int d : kv.devices()) {
        if (q->kv_blocks > 0) used[d] += q->kv_blocks * kv.PagesPerBlock(d, q->dp_rank);
      }
      if (q->num_computed < 0 || q->num_computed > q->len())
        Violation("{}: request {} computed {} of {} tokens", when, q->id, q->num_computed,
                  q->len());
      if (q->output_len() > q->max_new_tokens)
        Violation("{}: request {} has {} tokens of {}", when, q->id, q->output_len(),
                  q->max_new_tokens);
      auto it = tracked_.find(q->id);
      if (it != tracked_.end() && kv.SharedBlocks(q->id) > 0 && !it->second.kept_sharing) {
        const auto recoveries = static_cast<int64_t>(engine_->recoveries().size());
        Tracked& t = it->second;
        if (t.sharing_since < 0) {
          t.sharing_since = recoveries;
        } else if (recoveries > t.sharing_since) {
          t.kept_sharing = true;
          report_->kept_sharing++;
        }
      }
      if (it == tracked_.end() || it->second.done) {
        Violation("{}: request {} is held but has an outcome", when, q->id);
      } else if (q->output_len() != it->second.received) {
        Violation("{}: request {} holds {} output tokens, {} were reported", when, q->id,
                  q->output_len(), it->second.received);
      }
    };
    for (const Sequence* q : s.Running()) add(q);
    for (const Sequence* q : s.Waiting()) add(q);
    if (kv.prefix_cache()) {
      // Cached blocks: once however many sequences name them, and those
      // nobody names (evictable) too.
      std::vector<const Sequence*> held = s.Running();
      for (const Sequence* q : s.Waiting()) held.push_back(q);
      used = kv.PagesUnder(exec_->plan(), held);
      for (int d : kv.devices()) used[d] += kv.evictable(d);
    }
    if (!engine_->degraded()) {
      for (int d : kv.devices()) {
        if (used[d] != kv.used(d))
          Violation("{}: device {} counts {} pages, its sequences hold {}", when, d, kv.used(d),
                    used[d]);
      }
    }
  }

  void Finish() {
    for (const auto& [id, t] : tracked_) {
      if (!t.done) Violation("request {} has no outcome ({} tokens received)", id, t.received);
    }
    report_->recoveries = static_cast<int64_t>(engine_->recoveries().size());
    report_->prefix_hit_blocks = engine_->scheduler().prefix_cache_stats().hit_blocks;
    for (const RecoveryReport& r : engine_->recoveries()) report_->rebalances += r.rebalance;
    report_->virtual_s = clock_->NowSeconds();
    Mix(report_->tokens);
    Mix(report_->steps);
  }

  const ChaosOptions o_;
  SimExecutor* const exec_;
  FaultInjectingExecutor faulty_;
  FakeClock* const clock_;
  Rng rng_;
  std::unique_ptr<Engine> engine_;
  ChaosReport* report_ = nullptr;
  std::unordered_map<int64_t, Tracked> tracked_;
  std::vector<std::vector<int32_t>> prefixes_;  // shared prompt prefixes (prefix_cache)
  int64_t next_id_ = 1;
  bool cascade_ = false;
  bool restored_ = false;
  std::multimap<int64_t, int> slowed_;  // virtual instant -> device back to full speed
};

}  // namespace

int64_t ChaosReport::total_faults() const {
  int64_t n = 0;
  for (const auto& [kind, count] : faults) {
    if (kind != "cascade_second" && kind != "none") n += count;
  }
  return n;
}

std::string ChaosReport::ToText() const {
  std::string kinds;
  for (const auto& [kind, count] : faults) kinds += fmt::format(" {}={}", kind, count);
  std::string s = fmt::format(
      "chaos: {} faults ({} ) over {:.1f} simulated hours in {:.1f} s; {} requests: {} "
      "finished with their tokens, {} failed with an error, {} refused; {} tokens, {} steps, {} "
      "recoveries ({} rebalances); "
      "{} invariant checks ({} walking every page), {} violations; digest "
      "{:016x}\n",
      total_faults(), kinds, virtual_s / 3600, wall_s, requests, finished, failed, refused, tokens,
      steps, recoveries, rebalances, invariant_checks, page_checks, violations, digest);
  if (prefix_hit_blocks > 0 || kept_sharing > 0) {
    s += fmt::format(
        "  prefix cache: {} blocks hit, {} requests named cached blocks through a plan change\n",
        prefix_hit_blocks, kept_sharing);
  }
  for (const std::string& v : first_violations) s += "  " + v + "\n";
  return s;
}

std::string ChaosReport::ToJson() const {
  nlohmann::json j = {{"digest", fmt::format("{:016x}", digest)},
                      {"faults", faults},
                      {"total_faults", total_faults()},
                      {"requests", requests},
                      {"finished", finished},
                      {"failed", failed},
                      {"refused", refused},
                      {"tokens", tokens},
                      {"steps", steps},
                      {"recoveries", recoveries},
                      {"rebalances", rebalances},
                      {"prefix_hit_blocks", prefix_hit_blocks},
                      {"kept_sharing", kept_sharing},
                      {"invariant_checks", invariant_checks},
                      {"page_checks", page_checks},
                      {"virtual_s", virtual_s},
                      {"wall_s", wall_s},
                      {"violations", violations},
                      {"first_violations", first_violations}};
  return j.dump();
}

Result<ChaosReport> RunChaos(const ChaosOptions& o) {
  if (o.faults < 0 || o.mean_fault_gap_s <= 0 || o.requests_per_fault < 0 || o.max_prompt < 1 ||
      o.max_output < 1) {
    return InvalidArgument("chaos needs faults >= 0, a positive fault gap, prompts and outputs");
  }
  FS_ASSIGN_OR_RETURN(ModelConfig model, GetModelProfile(o.model));
  FS_ASSIGN_OR_RETURN(HardwareProfile hw, GetHardwareProfile(o.hardware));
  const int64_t wall0 = MonotonicNanos();
  FakeClock clock;
  SimExecutorOptions eo;
  eo.model = model;
  eo.hw = hw;
  eo.num_devices = o.num_devices;
  eo.backup_bytes = o.recovery == RecoveryMode::kRecompute ? -1 : o.backup_bytes;
  SchedulerConfig sched;
  sched.max_model_len = std::min(model.max_position_embeddings, o.max_prompt + o.max_output + 1);
  sched.max_batch_tokens = 2048;
  sched.max_num_seqs = 64;
  sched.kv_page_ids = o.page_ids;
  sched.prefix_cache = o.prefix_cache;
  sched.prefix_cache_host = o.prefix_cache && eo.backup_bytes >= 0;
  eo.max_batch_tokens = sched.max_batch_tokens;
  FS_ASSIGN_OR_RETURN(auto exec, SimExecutor::Create(eo, &clock));
  ChaosReport report;
  report.digest = o.seed;
  ChaosRun run(o, exec.get(), &clock);
  run.Start(sched);
  run.Run(&report);
  report.wall_s = (MonotonicNanos() - wall0) * 1e-9;
  return report;
}

}  // namespace failsafe
