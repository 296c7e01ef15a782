// The coordinator's time to re-plan, on this machine (CPU time of the
// calling thread, so that other processes on the cores do not count): the
// planner alone
// (Replan after one of 8 devices is lost, and when it rejoins) on the
// published shapes of Llama-3.1-70B and Mixtral-8x22B, and the engine's whole
// replanning path (Engine::Recover up to the devices' plan change: the plan,
// the scheduler's books moved to it, what each sequence can restore) with K
// sequences running, on the simulated executor (whose plan change is
// modelled, not run). The simulator charges its virtual clock with a model
// fitted on these figures (ReplanSeconds: HardwareProfile::replan_per_item_s
// and replan_per_seq_slot_s), printed beside them.
// A program that prints figures.
#include <algorithm>
#include <cstdio>
#include <vector>

#include "common/clock.h"
#include "placement/replan.h"
#include "sim/cost_model.h"
#include "sim/instance.h"
#include "sim/profiles.h"

using namespace failsafe;

namespace {

// Median of `runs` timings of f(), in milliseconds.
template <typename F>
double MedianMs(int runs, F&& f) {
  std::vector<double> ms;
  for (int i = 0; i < runs; ++i) {
    const int64_t t0 = ThreadCpuNanos();
    f();
    ms.push_back((ThreadCpuNanos() - t0) * 1e-6);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main() {
  std::printf("%-15s %-8s %14s %14s\n", "model", "policy", "8->7 CPU ms", "7->8 CPU ms");
  for (const char* name : {"llama-3.1-70b", "mixtral-8x22b"}) {
    const ModelConfig m = *GetModelProfile(name);
    for (Policy p : {Policy::kHybrid, Policy::kCyclic}) {
      const Plan full = *MakePlan(m, p, 8, {0, 1, 2, 3, 4, 5, 6, 7});
      const std::vector<int> seven = {0, 1, 2, 4, 5, 6, 7};
      const Plan lost = *Replan(full, m, seven);
      const double down = MedianMs(21, [&] { (void)Replan(full, m, seven); });
      const double up = MedianMs(21, [&] { (void)Replan(lost, m, {0, 1, 2, 3, 4, 5, 6, 7}); });
      std::printf("%-15s %-8s %14.3f %14.3f\n", name, PolicyName(p), down, up);
    }
  }
  // The engine's replanning with K sequences running: the CPU time of a
  // whole recovery on the simulated executor, whose modelled transfers cost
  // no time, but which prices them (a cost model of each plan): an upper
  // bound of the coordinator's part.
  std::printf("\n%-15s %10s %22s %18s\n", "model", "running", "engine recover CPU ms",
              "modelled ms");
  const HardwareProfile hw = *GetHardwareProfile("h100-sxm-80gb");
  for (const char* name : {"llama-3.1-70b", "mixtral-8x22b"}) {
    const ModelConfig m = *GetModelProfile(name);
    const PlanShape shape = PlanShape::ForModel(m);
    double base = 0;
    for (int running : {0, 64, 256}) {
      std::vector<double> ms;
      for (int trial = 0; trial < 9; ++trial) {
        InstanceConfig ic;
        ic.model = m;
        ic.hw = hw;
        ic.sched.max_num_seqs = std::max(1, running);
        ic.sched.max_batch_tokens = 8192;
        ic.sched.max_model_len = 8192;
        auto inst = SimInstance::Create(ic);
        if (!inst.ok()) {
          std::fprintf(stderr, "%s\n", inst.status().ToString().c_str());
          return 1;
        }
        for (int i = 0; i < running; ++i) (void)(*inst)->Submit({0, 512, 1024, false});
        (*inst)->RunUntil(5.0);
        const int64_t t0 = ThreadCpuNanos();
        auto rec = (*inst)->Fail(3);
        ms.push_back((ThreadCpuNanos() - t0) * 1e-6);
        if (!rec.ok()) {
          std::fprintf(stderr, "%s\n", rec.status().ToString().c_str());
          return 1;
        }
      }
      std::sort(ms.begin(), ms.end());
      const double median = ms[ms.size() / 2];
      std::printf("%-15s %10d %22.3f %18.3f\n", name, running, median,
                  ReplanSeconds(hw, shape, running) * 1e3);
      // The fit (from the first model): per plan item at 0 sequences, per
      // sequence and KV slot from 256.
      const double items =
          static_cast<double>(shape.num_layers) * (shape.num_query_heads() + shape.num_shards()) +
          shape.vocab_chunks;
      const double slots = static_cast<double>(shape.num_layers) * shape.num_kv_heads;
      if (running == 0) base = median;
      if (running == 256) {
        std::printf(
            "  fit: %.3g s per plan item (%.0f items), %.3g s per sequence and KV slot "
            "(%.0f slots)\n",
            base * 1e-3 / items, items, (median - base) * 1e-3 / (256 * slots), slots);
      }
    }
  }
  return 0;
}
