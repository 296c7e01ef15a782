// Decode and prefill steps timed on an executor, for the benchmark
// programs (engine_bench.cc: CPU devices, gpu_bench.cc: a GPU).
#pragma once

#include <cstdint>
#include <vector>

#include "engine/executor.h"

namespace failsafe::bench {

// CPU time of the whole process (all its threads), in nanoseconds.
int64_t ProcessCpuNanos();
double Median(std::vector<double> v);

struct Decode {
  double step_s;
  double tokens_per_s;
  // By the process's CPU time per step instead of the wall clock: with one
  // thread, what the step costs when it has its core to itself (a loaded
  // machine's waits for a core do not count; its use of memory does).
  double cpu_tokens_per_s;
  std::vector<double> steps_s;  // each step's wall time, in order
};

// Decodes `steps` steps for `batch` sequences after a prefill of `prompt`
// tokens each. `scatter`: their pages come from a pool whose every page was
// handed out and freed in a random order first, as a long-running server's
// are after many sequences of every length; else from a fresh pool, in
// order. A failed step ends the program (its figure would mean nothing).
Decode RunDecode(Executor& exec, int batch, int steps, int prompt = 32, bool scatter = false);

// The median time of `reps` prefills of `tokens` tokens of one sequence;
// `flops` (optional): the step's FLOPs as the engine counts them.
double RunPrefill(Executor& exec, int tokens, int reps, double* flops = nullptr);

}  // namespace failsafe::bench
