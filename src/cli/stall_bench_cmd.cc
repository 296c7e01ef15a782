// The stall a hung device causes, as streaming clients see it: the `serve`
// configuration (default: stories260K on 8 devices) in this process, a set of
// streams (half greedy, half sampled with a seed), and in each trial one
// device's worker stopped with SIGSTOP while the streams run. The engine's
// step deadline declares it dead, the group re-plans, and the streams go on;
// the device then rejoins for the next trial. Per trial: the longest gap
// between tokens of any stream in the stop's wake, and whether every text
// equals the fault-free run's. Prints P50/P99/max over the trials.
#include <signal.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <thread>

#include "cli/commands.h"
#include "cli/fault_bench.h"
#include "common/clock.h"
#include "common/rng.h"
#include "engine/pinned_process.h"

namespace failsafe {

CommandFn RegisterStallBench(CLI::App& app) {
  struct Opts {
    int trials = 20, streams = 16, input_len = 16, output_len = 256, stop_after_ms = 400;
    uint64_t seed = 1;
    bool json = false;
    FaultServerFlags server;
  };
  auto o = std::make_shared<Opts>();
  AddFaultServerFlags(app, &o->server);
  app.add_option("--trials", o->trials, "devices stopped, one per trial")->capture_default_str();
  app.add_option("--streams", o->streams, "streams per trial (half sampled at temperature 0.8)")
      ->capture_default_str();
  app.add_option("--input-len", o->input_len, "prompt tokens")->capture_default_str();
  app.add_option("--output-len", o->output_len, "tokens per stream")->capture_default_str();
  app.add_option("--stop-after-ms", o->stop_after_ms, "when in a trial the device is stopped")
      ->capture_default_str();
  app.add_option("--seed", o->seed, "prompts and the stopped devices")->capture_default_str();
  app.add_flag("--json", o->json, "print the trials as one JSON object on the last line");
  return [o] {
    if (o->trials < 1 || o->streams < 1) return Fail("--trials and --streams must be positive");
    auto fo = FaultServerFromFlags(o->server);
    if (!fo.ok()) return Fail(fo.status().ToString());
    LoadOptions load;
    load.input_tokens = o->input_len;
    load.output_tokens = o->output_len;
    load.sampled_temperature = 0.8;
    load.seed = o->seed;
    load.timeout_s = 300;
    auto bench = StartFaultBench(*fo, load, o->streams);
    if (!bench.ok()) return Fail(bench.status().ToString());
    EngineService& service = *bench->server->service;
    const LoadResult* ref = &bench->reference;
    const std::vector<std::string>& want = bench->want;
    const LoadOptions& lo = bench->load;
    std::printf(
        "%d devices (%s), %d streams of %d tokens (half sampled), a device stopped %d ms in\n"
        "fault-free: %.2f s, longest gap between tokens %.1f ms\n\n",
        o->server.dev.devices, o->server.dev.placement.c_str(), o->streams, o->output_len,
        o->stop_after_ms, ref->seconds, LongestGap(ref->streams));
    std::printf("%-6s %7s %10s %12s %10s %s\n", "trial", "device", "stall ms", "longest gap",
                "wall s", "texts");
    Rng rng(o->seed);
    std::vector<double> stalls;
    bool all_same = true;
    nlohmann::json rows = nlohmann::json::array();
    for (int trial = 0; trial < o->trials; ++trial) {
      std::vector<LiveDevice> live = LiveDevices(service);
      if (live.size() < 2) return Fail("fewer than two devices alive");
      const LiveDevice victim = live[rng.Below(live.size())];
      // Stopped and continued through a pidfd: the signals reach the victim
      // or none (never a process that reused its pid).
      const PinnedProcess worker(victim.pid);
      if (!worker.ok()) return Fail(fmt::format("device {}'s worker is gone", victim.device));
      int64_t stop_ns = 0;
      Status stopped;
      std::thread stopper([&] {
        ::usleep(static_cast<useconds_t>(o->stop_after_ms) * 1000);
        stop_ns = MonotonicNanos();
        if (!worker.Signal(SIGSTOP))
          stopped = Internal("device {}'s worker exited before it was stopped", victim.device);
      });
      auto got = RunLoad(lo, o->streams);
      stopper.join();
      if (!got.ok()) return Fail(got.status().ToString());
      if (!stopped.ok()) return Fail(stopped.ToString());
      int same = 0;
      for (const StreamRecord& s : got->streams) same += s.ok && s.text == want[s.pool_index];
      const double stall = StallAfter(got->streams, stop_ns);
      const bool ok = same == o->streams;
      all_same = all_same && ok;
      stalls.push_back(stall);
      std::printf("%-6d %7d %10.1f %12.1f %10.2f %d/%d same%s\n", trial, victim.device, stall,
                  LongestGap(got->streams), got->seconds, same, o->streams,
                  stall == 0 ? " (the streams ended before the stop)" : "");
      std::fflush(stdout);
      rows.push_back({{"trial", trial},
                      {"device", victim.device},
                      {"stall_ms", stall},
                      {"longest_gap_ms", LongestGap(got->streams)},
                      {"same_texts", same}});
      // The device was declared dead (and killed); take it back. If the
      // streams ended before its deadline, it is only stopped: continue it.
      for (const LiveDevice& d : LiveDevices(service)) {
        if (d.device == victim.device && d.pid == victim.pid) (void)worker.Signal(SIGCONT);
      }
      for (int d : DeadDevices(service)) {
        Status st = service.RestoreDevice(d);
        if (!st.ok()) return Fail(fmt::format("rejoin of device {}: {}", d, st.ToString()));
      }
    }
    const Percentiles p = ComputePercentiles(stalls);
    std::printf("\nstall over %d trials: P50 %.1f ms, P99 %.1f ms, max %.1f ms; %s\n", o->trials,
                p.p50, p.p99, p.max,
                all_same ? "every text equal to the fault-free run" : "SOME TEXTS DIFFER");
    if (o->json) {
      std::printf("%s\n",
                  nlohmann::json{{"trials", rows},
                                 {"stall_ms", {{"p50", p.p50}, {"p99", p.p99}, {"max", p.max}}},
                                 {"all_same", all_same}}
                      .dump()
                      .c_str());
    }
    return all_same ? 0 : 1;
  };
}

}  // namespace failsafe
