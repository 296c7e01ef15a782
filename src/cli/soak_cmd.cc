// A device-fault soak over HTTP: the `serve` configuration in this process
// (default: stories260K on 8 devices), a closed loop of concurrent streams
// (half greedy, half sampled at temperature 0.8 with a seed), and meanwhile
// seeded random events on the devices: SIGKILL, SIGSTOP followed by SIGCONT
// after a random delay (before the step deadline or after it, when the device
// has been fenced), and rejoins of dead devices. Every request's text is
// checked against a fault-free run of the same requests. Reports requests
// completed, failed and diverged, and the worst stall per event type (the
// longest gap between tokens in the event's wake, fault_bench.h), and for each
// diverged request what it was (greedy or its seed, lengths), the first token
// event whose text differs, and the events from 2 s before it was sent to its
// end. `--events` limits the events to some kinds. Exits 1 on any failed or
// diverged request.
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "cli/commands.h"
#include "cli/fault_bench.h"
#include "common/clock.h"
#include "common/rng.h"
#include "common/units.h"
#include "engine/pinned_process.h"

namespace failsafe {

namespace {

struct Event {
  std::string kind;  // "kill", "stop+cont in time", "stop+cont fenced", "rejoin"
  int device = 0;
  int64_t at_ns = 0;   // MonotonicNanos of the signal (or of the rejoin's start)
  double held_ms = 0;  // SIGSTOP to SIGCONT
};

// Fires random events until `until_ns`; keeps at least `min_live` devices.
// Which events fire (the soak's --events).
struct EventKinds {
  bool kill = true, stop = true, rejoin = true;
};

Result<EventKinds> ParseEventKinds(const std::string& list) {
  EventKinds k{false, false, false};
  size_t at = 0;
  while (at <= list.size()) {
    const size_t end = std::min(list.find(',', at), list.size());
    const std::string name = list.substr(at, end - at);
    if (name == "kill") {
      k.kill = true;
    } else if (name == "stop") {
      k.stop = true;
    } else if (name == "rejoin") {
      k.rejoin = true;
    } else {
      return InvalidArgument("--events: unknown event '{}' (known: kill, stop, rejoin)", name);
    }
    at = end + 1;
  }
  if (!k.kill && !k.stop) return InvalidArgument("--events needs kill or stop");
  return k;
}

std::vector<Event> RunEvents(EngineService& service, uint64_t seed, int64_t until_ns, int gap_ms,
                             int min_live, EventKinds kinds, std::string* error) {
  Rng rng(seed);
  std::vector<Event> events;
  while (true) {
    const int64_t gap_ns = int64_t{gap_ms} * 1000000 / 2 + rng.Below(uint64_t(gap_ms) * 1000000);
    if (MonotonicNanos() + gap_ns >= until_ns) break;
    ::usleep(static_cast<useconds_t>(gap_ns / 1000));
    const std::vector<LiveDevice> live = LiveDevices(service);
    const std::vector<int> dead = DeadDevices(service);
    const bool can_fail = static_cast<int>(live.size()) > min_live;
    if (kinds.rejoin && !dead.empty() && (!can_fail || rng.Below(3) == 0)) {
      Event e{"rejoin", dead[rng.Below(dead.size())], MonotonicNanos(), 0};
      Status st = service.RestoreDevice(e.device);
      if (!st.ok()) {
        *error = fmt::format("rejoin of device {}: {}", e.device, st.ToString());
        return events;
      }
      events.push_back(e);
      continue;
    }
    if (!can_fail) continue;
    const LiveDevice victim = live[rng.Below(live.size())];
    // Stopped and continued through a pidfd: the signals reach that process
    // or none (never a reused pid).
    PinnedProcess worker(victim.pid);
    if (!worker.ok()) continue;  // exited since the status was taken
    const bool kill = rng.Below(2) == 0;
    if (kinds.kill && (kill || !kinds.stop)) {
      events.push_back({"kill", victim.device, MonotonicNanos(), 0});
      worker.Signal(SIGKILL);
      continue;
    }
    Event e{"", victim.device, MonotonicNanos(), 0};
    worker.Signal(SIGSTOP);
    // Held 50..1500 ms: short holds end before the step deadline (the device
    // just resumes), long ones after it (the device has been fenced).
    const int64_t hold_ms = 50 + static_cast<int64_t>(rng.Below(1451));
    ::usleep(static_cast<useconds_t>(hold_ms * 1000));
    worker.Signal(SIGCONT);
    e.held_ms = (MonotonicNanos() - e.at_ns) * 1e-6;
    bool still = false;
    for (const LiveDevice& d : LiveDevices(service)) still |= d.pid == victim.pid;
    e.kind = still ? "stop+cont in time" : "stop+cont fenced";
    events.push_back(e);
  }
  return events;
}

// Wall-clock seconds (as the log lines print them) of a MonotonicNanos time.
double WallSeconds(int64_t mono_ns) {
  timespec now{};
  ::clock_gettime(CLOCK_REALTIME, &now);
  return now.tv_sec + now.tv_nsec * 1e-9 - (MonotonicNanos() - mono_ns) * 1e-9;
}

// One diverged request: what it was, where its text left the fault-free
// one, and the events from 2 s before it was sent to its last token.
nlohmann::json DescribeDivergence(const StreamRecord& got, const StreamRecord& want,
                                  const std::vector<Event>& events, int input_len) {
  const Divergence d = FindDivergence(got, want);
  const int64_t end_ns = got.token_ns.empty() ? got.sent_ns : got.token_ns.back();
  nlohmann::json around = nlohmann::json::array();
  for (const Event& e : events) {
    if (e.at_ns < got.sent_ns - 2'000'000'000LL || e.at_ns > end_ns) continue;
    around.push_back({{"kind", e.kind},
                      {"device", e.device},
                      {"at_ms", (e.at_ns - got.sent_ns) * 1e-6},
                      {"held_ms", e.held_ms}});
  }
  const bool sampled = got.pool_index % 2 == 1;
  const int64_t differ_ns =
      d.first_event < static_cast<int>(got.token_ns.size()) ? got.token_ns[d.first_event] : end_ns;
  return {{"pool_index", got.pool_index},
          {"sampling", sampled ? fmt::format("seed {}", got.pool_index) : "greedy"},
          {"prompt_tokens", input_len},
          {"max_tokens", got.max_tokens},
          {"completion_tokens", got.completion_tokens},
          {"reference_completion_tokens", want.completion_tokens},
          {"token_events", d.got_events},
          {"reference_token_events", d.want_events},
          {"first_differing_event", d.first_event},
          {"first_differing_byte", d.first_char},
          {"sent_wall_s", WallSeconds(got.sent_ns)},
          {"differs_at_ms", (differ_ns - got.sent_ns) * 1e-6},
          {"last_token_ms", (end_ns - got.sent_ns) * 1e-6},
          {"events", around}};
}

}  // namespace

CommandFn RegisterSoak(CLI::App& app) {
  struct Opts {
    std::string duration = "10min", events = "kill,stop,rejoin";
    int concurrency = 200, input_len = 16, min_len = 16, max_len = 128, event_gap_ms = 2000,
        min_devices = 4;
    uint64_t seed = 1;
    bool json = false;
    FaultServerFlags server;
  };
  auto o = std::make_shared<Opts>();
  AddFaultServerFlags(app, &o->server);
  app.add_option("--duration", o->duration, "how long events fire and requests are sent")
      ->capture_default_str();
  app.add_option("--concurrency", o->concurrency, "streams kept open (a closed loop)")
      ->capture_default_str();
  app.add_option("--input-len", o->input_len, "prompt tokens")->capture_default_str();
  app.add_option("--min-len", o->min_len, "fewest tokens a request asks for")
      ->capture_default_str();
  app.add_option("--max-len", o->max_len, "most tokens a request asks for")->capture_default_str();
  app.add_option("--event-gap-ms", o->event_gap_ms,
                 "mean time between events (uniform in half to one and a half of it)")
      ->capture_default_str();
  app.add_option("--min-devices", o->min_devices, "devices kept alive (no failure below)")
      ->capture_default_str();
  app.add_option("--seed", o->seed, "events and requests")->capture_default_str();
  app.add_option("--events", o->events,
                 "events that fire, comma-separated: kill (SIGKILL), stop (SIGSTOP, then "
                 "SIGCONT), rejoin (of a dead device)")
      ->capture_default_str();
  app.add_flag("--json", o->json, "print the figures as one JSON object on the last line");
  return [o] {
    auto duration = ParseDuration(o->duration);
    if (!duration.ok()) return Fail("--duration: " + duration.status().message());
    if (o->concurrency < 1 || o->event_gap_ms < 1 || o->min_devices < 1)
      return Fail("--concurrency, --event-gap-ms and --min-devices must be positive");
    if (o->min_len < 1 || o->max_len < o->min_len) return Fail("need 1 <= --min-len <= --max-len");
    auto event_kinds = ParseEventKinds(o->events);
    if (!event_kinds.ok()) return Fail(event_kinds.status().ToString());
    auto fo = FaultServerFromFlags(o->server);
    if (!fo.ok()) return Fail(fo.status().ToString());
    LoadOptions load;
    load.input_tokens = o->input_len;
    load.output_tokens = o->min_len;
    load.output_tokens_max = o->max_len;
    load.sampled_temperature = 0.8;
    load.seed = o->seed;
    load.pool = o->concurrency;
    load.timeout_s = 300;
    // The fault-free run: every request of the pool once, all at once.
    auto bench = StartFaultBench(*fo, load, o->concurrency);
    if (!bench.ok()) return Fail(bench.status().ToString());
    EngineService& service = *bench->server->service;
    const LoadResult* ref = &bench->reference;
    const std::vector<std::string>& want = bench->want;
    LoadOptions lo = bench->load;
    std::printf(
        "%d devices (%s), %d streams open (closed loop, half sampled), %d-%d tokens each, an "
        "event every ~%d ms for %s\nfault-free: %d requests in %.2f s, longest gap between "
        "tokens %.1f ms\n",
        o->server.dev.devices, o->server.dev.placement.c_str(), o->concurrency, o->min_len,
        o->max_len, o->event_gap_ms, o->duration.c_str(), ref->served, ref->seconds,
        LongestGap(ref->streams));
    std::fflush(stdout);

    lo.closed_loop_s = *duration;
    lo.timeout_s = *duration + 300;
    std::string event_error;
    std::vector<Event> events;
    const int64_t until = MonotonicNanos() + static_cast<int64_t>(*duration * 1e9);
    std::thread injector([&] {
      events = RunEvents(service, o->seed, until, o->event_gap_ms, o->min_devices, *event_kinds,
                         &event_error);
    });
    auto got = RunLoad(lo, o->concurrency);
    injector.join();
    if (!got.ok()) return Fail(got.status().ToString());
    if (!event_error.empty()) return Fail(event_error);

    int completed = 0, failed = 0, diverged = 0;
    std::string first_failure;
    const std::vector<const StreamRecord*> ref_streams =
        ReferenceStreams(ref->streams, o->concurrency);
    nlohmann::json divergences = nlohmann::json::array();
    for (const StreamRecord& s : got->streams) {
      if (!s.ok) {
        ++failed;
        if (first_failure.empty()) first_failure = fmt::format("HTTP {}: {}", s.status, s.error);
      } else if (s.text != want[s.pool_index]) {
        ++diverged;
        divergences.push_back(
            DescribeDivergence(s, *ref_streams[s.pool_index], events, o->input_len));
      } else {
        ++completed;
      }
    }
    struct PerKind {
      int count = 0;
      double worst_ms = 0;
    };
    std::map<std::string, PerKind> kinds;
    for (const Event& e : events) {
      PerKind& k = kinds[e.kind];
      ++k.count;
      k.worst_ms = std::max(k.worst_ms, StallAfter(got->streams, e.at_ns));
    }
    std::printf(
        "\n%.1f s: %zu requests: %d completed with the fault-free text, %d failed, %d diverged "
        "(%lld tokens)\n",
        got->seconds, got->streams.size(), completed, failed, diverged,
        static_cast<long long>(got->tokens));
    if (!first_failure.empty()) std::printf("first failure: %s\n", first_failure.c_str());
    for (size_t k = 0; k < divergences.size() && k < 20; ++k)
      std::printf("diverged: %s\n", divergences[k].dump().c_str());
    std::printf("%-20s %7s %16s\n", "event", "count", "worst stall ms");
    nlohmann::json jk = nlohmann::json::object();
    for (const auto& [name, k] : kinds) {
      std::printf("%-20s %7d %16.1f\n", name.c_str(), k.count, k.worst_ms);
      jk[name] = {{"count", k.count}, {"worst_stall_ms", k.worst_ms}};
    }
    std::printf("longest gap between tokens overall: %.1f ms\n", LongestGap(got->streams));
    if (o->json) {
      std::printf("%s\n", nlohmann::json{{"requests", got->streams.size()},
                                         {"completed", completed},
                                         {"failed", failed},
                                         {"diverged", diverged},
                                         {"events", jk},
                                         {"divergences", divergences}}
                              .dump()
                              .c_str());
    }
    return failed == 0 && diverged == 0 ? 0 : 1;
  };
}

}  // namespace failsafe
