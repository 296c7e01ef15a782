// Balance across devices, measured: a long-context decode batch on N device
// processes under each placement policy. Per device: compute time per step
// (time outside collectives), attention FLOPs and KV bytes held; per policy:
// the emulated step time (sum over sync segments of the slowest device).
//
//   failsafe_bench_balance [--model DIR | --preset tiny-llama] [--devices 7] [--seqs 14] [--context
//   4096]
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <numeric>

#include "common/clock.h"
#include "common/rng.h"
#include "engine/kv_tables.h"
#include "engine/worker_group.h"
#include "model/synthetic.h"

using namespace failsafe;

int main(int argc, char** argv) {
  CLI::App app{"FailSafe balance benchmark"};
  std::string model, preset = "tiny-llama", cache = "/tmp/failsafe-bench", binary;
  int devices = 7, seqs = 14, context = 4096, steps = 6;
  std::vector<std::string> policies = {"standard", "nonuniform", "cyclic", "hybrid"};
  app.add_option("--model", model, "model directory");
  app.add_option("--preset", preset, "synthetic preset when no --model")->capture_default_str();
  app.add_option("--cache", cache, "where the synthetic model is made")->capture_default_str();
  app.add_option("--failsafe", binary, "the failsafe program (default: next to this one)");
  app.add_option("--devices", devices)->capture_default_str();
  app.add_option("--seqs", seqs, "sequences in the batch")->capture_default_str();
  app.add_option("--context", context, "context length of every sequence")->capture_default_str();
  app.add_option("--steps", steps, "decode steps measured")->capture_default_str();
  app.add_option("--policies", policies)->delimiter(',');
  CLI11_PARSE(app, argc, argv);
  if (binary.empty()) {
    binary = (std::filesystem::canonical("/proc/self/exe").parent_path().parent_path() /
              "src/cli/failsafe")
                 .string();
  }
  if (model.empty()) {
    model = cache + "/" + preset;
    if (!std::filesystem::exists(model + "/config.json")) {
      SyntheticModelOptions o;
      o.preset = preset;
      if (!WriteSyntheticModel(model, o).ok()) return 1;
    }
  }
  std::printf(
      "%d devices, %d sequences at context %d, %d decode steps (emulated = per sync segment, the "
      "slowest "
      "device's compute time, summed)\n\n",
      devices, seqs, context, steps);
  std::printf("%-11s %13s %12s %14s %14s %12s   %s\n", "policy", "emulated ms", "wall ms",
              "max/mean comp", "max/mean attn", "KV max/min",
              "per-device compute ms | attention MFLOP | KV MiB");
  for (const auto& name : policies) {
    WorkerGroupOptions o;
    o.model_dir = model;
    o.worker_binary = binary;
    o.num_devices = devices;
    o.policy = *ParsePolicy(name);
    o.max_step_tokens = 2048;
    o.max_logits_rows = std::max(seqs, 1);
    auto group = WorkerGroup::Start(o);
    if (!group.ok()) {
      std::fprintf(stderr, "%s: %s\n", name.c_str(), group.status().ToString().c_str());
      return 1;
    }
    const auto& active = (*group)->plan().active;
    const int vocab = (*group)->config().vocab_size;
    Rng rng(5);
    DirectKvTables tables((*group)->plan(), (*group)->block_size(), (*group)->kv_capacity_pages());
    // Prefill every sequence in chunks; DP ranks spread evenly.
    for (int s = 0; s < seqs; ++s) {
      for (int done = 0; done < context;) {
        const int n = std::min(2048, context - done);
        StepBatch b;
        b.seqs.push_back({s, done, n, active[s % active.size()], 0, done + n == context ? 0 : -1});
        for (int i = 0; i < n; ++i) b.tokens.push_back(static_cast<int32_t>(rng.Below(vocab)));
        b.num_logits_rows = done + n == context ? 1 : 0;
        if (Status st = tables.Fill(&b); !st.ok()) {
          std::fprintf(stderr, "%s\n", st.ToString().c_str());
          return 1;
        }
        auto r = (*group)->Step(b, nullptr);
        if (!r.ok()) {
          std::fprintf(stderr, "%s\n", r.status().ToString().c_str());
          return 1;
        }
        done += n;
      }
    }
    std::vector<double> emulated, wall;
    std::vector<double> compute(active.size(), 0), flops(active.size(), 0);
    std::vector<int64_t> kv(active.size(), 0);
    for (int step = 0; step < steps; ++step) {
      StepBatch b;
      for (int s = 0; s < seqs; ++s) {
        b.seqs.push_back({s, context + step, 1, active[s % active.size()], s, s});
        b.tokens.push_back(static_cast<int32_t>(rng.Below(vocab)));
      }
      b.num_logits_rows = seqs;
      if (Status st = tables.Fill(&b); !st.ok()) {
        std::fprintf(stderr, "%s\n", st.ToString().c_str());
        return 1;
      }
      StepTiming t;
      auto r = (*group)->Step(b, &t);
      if (!r.ok()) {
        std::fprintf(stderr, "%s\n", r.status().ToString().c_str());
        return 1;
      }
      emulated.push_back(t.emulated_ns / 1e6);
      wall.push_back(t.wall_ns / 1e6);
      for (size_t i = 0; i < active.size(); ++i) {
        compute[i] += t.device_compute_ns[i] / 1e6 / steps;
        flops[i] += t.device_attention_flops[i] / 1e6 / steps;
        kv[i] = t.device_kv_bytes[i];
      }
    }
    std::sort(emulated.begin(), emulated.end());
    std::sort(wall.begin(), wall.end());
    const double mean = std::accumulate(compute.begin(), compute.end(), 0.0) / compute.size();
    const double mx = *std::max_element(compute.begin(), compute.end());
    auto [kmin, kmax] = std::minmax_element(kv.begin(), kv.end());
    const double attn_mean = std::accumulate(flops.begin(), flops.end(), 0.0) / flops.size();
    const double attn_max = *std::max_element(flops.begin(), flops.end());
    std::string per;
    for (size_t i = 0; i < active.size(); ++i) {
      per += fmt::format("{}d{}: {:.1f}|{:.0f}|{:.1f}", i ? "  " : "", active[i], compute[i],
                         flops[i], kv[i] / 1048576.0);
    }
    std::printf("%-11s %13.1f %12.1f %14.2f %14.2f %12.2f   %s\n", name.c_str(),
                emulated[emulated.size() / 2], wall[wall.size() / 2], mx / mean,
                attn_mean > 0 ? attn_max / attn_mean : 1.0,
                static_cast<double>(*kmax) / std::max<int64_t>(1, *kmin), per.c_str());
    std::fflush(stdout);
  }
  return 0;
}
