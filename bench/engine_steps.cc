#include "engine_steps.h"

#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "common/clock.h"
#include "common/rng.h"
#include "engine/kv_tables.h"

namespace failsafe::bench {

// CPU time of the whole process (all its threads), in nanoseconds.
int64_t ProcessCpuNanos() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

Decode RunDecode(Executor& exec, int batch, int steps, int prompt, bool scatter) {
  const ModelConfig& c = exec.config();
  Rng rng(1);
  DirectKvTables kv(exec.plan(), exec.block_size(), exec.kv_capacity_pages());
  if (scatter) {
    // Every page to a one-block sequence (tables only: the device never
    // sees them), then all of them freed in a random order.
    std::vector<int64_t> ids;
    for (int64_t id = 1000000;; ++id) {
      StepBatch b;
      b.seqs.push_back({id, 0, 1, 0, 0, 0});
      b.tokens.push_back(0);
      if (!kv.Fill(&b).ok()) break;
      ids.push_back(id);
    }
    for (size_t i = ids.size(); i > 1; --i) std::swap(ids[i - 1], ids[rng.Below(i)]);
    for (int64_t id : ids) kv.Free(id);
  }
  auto run_step = [&](StepBatch& b) {
    Status st = kv.Fill(&b);
    if (st.ok()) st = exec.Step(b, nullptr).status();
    return st;
  };
  for (int s = 0; s < batch; ++s) {
    StepBatch b;
    b.seqs.push_back({100 + s, 0, prompt, 0, 0, 0});
    for (int i = 0; i < prompt; ++i)
      b.tokens.push_back(static_cast<int32_t>(rng.Below(c.vocab_size)));
    b.num_logits_rows = 1;
    const Status st = run_step(b);
    if (!st.ok()) {  // a figure from failed steps would mean nothing
      std::fprintf(stderr, "error: prefill of sequence %d: %s\n", s, st.ToString().c_str());
      std::exit(1);
    }
  }
  std::vector<double> times, cpu_times;
  for (int step = 0; step < steps; ++step) {
    StepBatch b;
    for (int s = 0; s < batch; ++s) {
      b.seqs.push_back({100 + s, prompt + step, 1, 0, s, s});
      b.tokens.push_back(static_cast<int32_t>(rng.Below(c.vocab_size)));
    }
    b.num_logits_rows = batch;
    int64_t t0 = MonotonicNanos(), c0 = ProcessCpuNanos();
    const Status st = run_step(b);
    if (!st.ok()) {
      std::fprintf(stderr, "error: decode step %d: %s\n", step, st.ToString().c_str());
      std::exit(1);
    }
    times.push_back((MonotonicNanos() - t0) * 1e-9);
    cpu_times.push_back((ProcessCpuNanos() - c0) * 1e-9);
  }
  for (int s = 0; s < batch; ++s) {
    (void)exec.FreeSeq(100 + s);
    kv.Free(100 + s);
  }
  double t = Median(times);
  return {t, batch / t, batch / Median(cpu_times), times};
}

double RunPrefill(Executor& exec, int tokens, int reps, double* flops) {
  const ModelConfig& c = exec.config();
  Rng rng(2);
  std::vector<double> times;
  DirectKvTables kv(exec.plan(), exec.block_size(), exec.kv_capacity_pages());
  for (int r = 0; r < reps; ++r) {
    StepBatch b;
    b.seqs.push_back({7, 0, tokens, 0, 0, 0});
    for (int i = 0; i < tokens; ++i)
      b.tokens.push_back(static_cast<int32_t>(rng.Below(c.vocab_size)));
    b.num_logits_rows = 1;
    if (Status st = kv.Fill(&b); !st.ok()) std::fprintf(stderr, "%s\n", st.ToString().c_str());
    int64_t t0 = MonotonicNanos();
    StepTiming timing;
    const Status st = exec.Step(b, &timing).status();
    if (!st.ok()) {
      std::fprintf(stderr, "error: prefill of %d tokens: %s\n", tokens, st.ToString().c_str());
      std::exit(1);
    }
    times.push_back((MonotonicNanos() - t0) * 1e-9);
    if (flops) {
      *flops = 0;
      for (double f : timing.device_attention_flops) *flops += f;
      for (double f : timing.device_ffn_flops) *flops += f;
    }
    (void)exec.FreeSeq(7);
    kv.Free(7);
  }
  return Median(times);
}

}  // namespace failsafe::bench
