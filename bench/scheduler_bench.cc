// Scheduling overhead: one Schedule + Update cycle with 1,000 running
// sequences and 1,000 or 10,000 queued, for each prefill policy; and what the
// block tables add to a step's message: the bytes of new table entries the
// busiest device receives per step (KvBlockRun and page ids), beside the rest
// of the step (per sequence a StepSeq, per token its id). A program that
// prints figures.
#include <algorithm>
#include <cstdio>
#include <vector>

#include "common/clock.h"
#include "core/scheduler.h"
#include "model/synthetic.h"
#include "worker/step.h"

using namespace failsafe;

int main() {
  auto model = *SyntheticPresetConfig("1b-llama");
  auto plan = *MakePlan(model, Policy::kHybrid, 8, {0, 1, 2, 3, 4, 5, 6});
  std::printf("%-9s %8s %8s %14s %14s %16s %16s\n", "prefill", "running", "queued", "us per cycle",
              "p99 us", "table B/step", "rest B/step");
  for (PrefillPolicy pp : {PrefillPolicy::kFifo, PrefillPolicy::kAdaptive}) {
    for (int queued : {1000, 10000}) {
      SchedulerConfig cfg;
      cfg.prefill = pp;
      cfg.max_num_seqs = 1000;
      cfg.max_batch_tokens = 4096;
      Scheduler s(cfg, plan, model, 16, std::vector<int64_t>(8, int64_t{1} << 40));
      for (int i = 0; i < 1000 + queued; ++i) {
        auto q = std::make_unique<Sequence>();
        q->id = i;
        q->tokens.assign(i < 1000 ? 4 : 512, 3);
        q->prompt_len = q->len();
        q->max_new_tokens = 1000;
        (void)s.Add(std::move(q));
      }
      // Warm up until 1,000 sequences are running and decoding.
      for (int k = 0; k < 10 && s.num_running() < 1000; ++k) {
        StepPlan p = s.Schedule();
        s.Update(p, std::vector<int32_t>(p.seqs.size(), 1));
      }
      for (int k = 0; k < 3; ++k) {
        StepPlan p = s.Schedule();
        s.Update(p, std::vector<int32_t>(p.seqs.size(), 1));
      }
      std::vector<double> us;
      double table_bytes = 0, rest_bytes = 0;
      for (int k = 0; k < 200; ++k) {
        int64_t t0 = MonotonicNanos();
        StepPlan p = s.Schedule();
        const double took = (MonotonicNanos() - t0) / 1e3;
        std::vector<double> per_device(plan.num_devices, 0);
        for (const ScheduledSeq& ss : p.seqs) {
          const Sequence* q = s.Find(ss.seq_id);
          const int added = q->kv_blocks - ss.kv_first_block;
          if (added <= 0) continue;
          for (int d : plan.active) {
            per_device[d] += sizeof(KvBlockRun) + 4.0 * added * s.kv().Slots(d, q->dp_rank).size();
          }
        }
        table_bytes += *std::max_element(per_device.begin(), per_device.end()) / 200;
        rest_bytes += (1.0 * sizeof(StepSeq) * p.seqs.size() + 4.0 * p.num_tokens()) / 200;
        t0 = MonotonicNanos();
        s.Update(p, std::vector<int32_t>(p.seqs.size(), 1));
        us.push_back(took + (MonotonicNanos() - t0) / 1e3);
      }
      std::sort(us.begin(), us.end());
      double mean = 0;
      for (double u : us) mean += u / us.size();
      std::printf("%-9s %8d %8d %14.1f %14.1f %16.0f %16.0f\n", PrefillPolicyName(pp),
                  s.num_running(), s.num_waiting(), mean, us[us.size() * 99 / 100], table_bytes,
                  rest_bytes);
    }
  }
  return 0;
}
