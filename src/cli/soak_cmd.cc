// A device-fault soak over HTTP: the `serve` configuration in this process
// (default: stories260K on 8 devices), a closed loop of concurrent streams
// (half greedy, half sampled at temperature 0.8 with a seed), and meanwhile
// seeded random events on the devices: SIGKILL, SIGSTOP followed by SIGCONT
// after a random delay (before the step deadline or after it, when the device
// has been fenced), and rejoins of dead devices. Every request's text is
// checked against a fault-free run of the same requests. Reports requests
// completed, failed and diverged, and the worst stall per event type (the
// longest gap between tokens in the event's wake, fault_bench.h). Exits 1 on any
// failed or diverged request.
#include <signal.h>
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
std::vector<Event> RunEvents(EngineService& service, uint64_t seed, int64_t until_ns, int gap_ms,
                             int min_live, std::string* error) {
  Rng rng(seed);
  std::vector<Event> events;
  while (true) {
    const int64_t gap_ns = int64_t{gap_ms} * 1000000 / 2 + rng.Below(uint64_t(gap_ms) * 1000000);
    if (MonotonicNanos() + gap_ns >= until_ns) break;
    ::usleep(static_cast<useconds_t>(gap_ns / 1000));
    const std::vector<LiveDevice> live = LiveDevices(service);
    const std::vector<int> dead = DeadDevices(service);
    const bool can_fail = static_cast<int>(live.size()) > min_live;
    if (!dead.empty() && (!can_fail || rng.Below(3) == 0)) {
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
    if (rng.Below(2) == 0) {
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

}  // namespace

CommandFn RegisterSoak(CLI::App& app) {
  struct Opts {
    std::string duration = "10min";
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
  app.add_flag("--json", o->json, "print the figures as one JSON object on the last line");
  return [o] {
    auto duration = ParseDuration(o->duration);
    if (!duration.ok()) return Fail("--duration: " + duration.status().message());
    if (o->concurrency < 1 || o->event_gap_ms < 1 || o->min_devices < 1)
      return Fail("--concurrency, --event-gap-ms and --min-devices must be positive");
    if (o->min_len < 1 || o->max_len < o->min_len) return Fail("need 1 <= --min-len <= --max-len");
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
      events = RunEvents(service, o->seed, until, o->event_gap_ms, o->min_devices, &event_error);
    });
    auto got = RunLoad(lo, o->concurrency);
    injector.join();
    if (!got.ok()) return Fail(got.status().ToString());
    if (!event_error.empty()) return Fail(event_error);

    int completed = 0, failed = 0, diverged = 0;
    std::string first_failure, first_divergence;
    for (const StreamRecord& s : got->streams) {
      if (!s.ok) {
        ++failed;
        if (first_failure.empty()) first_failure = fmt::format("HTTP {}: {}", s.status, s.error);
      } else if (s.text != want[s.pool_index]) {
        ++diverged;
        if (first_divergence.empty())
          first_divergence =
              fmt::format("request {} ({})", s.pool_index, s.pool_index % 2 ? "sampled" : "greedy");
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
    if (!first_divergence.empty()) std::printf("first divergence: %s\n", first_divergence.c_str());
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
                                         {"events", jk}}
                              .dump()
                              .c_str());
    }
    return failed == 0 && diverged == 0 ? 0 : 1;
  };
}

}  // namespace failsafe
