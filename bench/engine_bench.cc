// Single-device engine benchmark: decode and prefill speed on one model,
// against the machine's measured memory bandwidth and the BLAS's own SGEMM
// rate on the same shapes. A program that prints figures, not a test.
//
//   failsafe_bench_engine [--model DIR | --preset 1b-llama] [--threads 1,2]
#include <cblas.h>
#include <omp.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <numeric>
#include <vector>

#include "common/clock.h"
#include "common/rng.h"
#include "engine/executor.h"
#include "model/synthetic.h"
#include "worker/item_matrix.h"

extern "C" void openblas_set_num_threads(int num_threads);

using namespace failsafe;

namespace {

// Streaming read bandwidth (bytes/s) of `threads` threads over a 1 GiB buffer
// allocated the way the engine allocates weights (transparent huge pages).
double MeasureReadBandwidth(int threads) {
  const size_t n = (1ull << 30) / sizeof(float);
  static AlignedFloats storage(n);
  static bool filled = false;
  float* buf = storage.data;
  if (!filled) {
    std::fill(buf, buf + n, 1.0f);
    filled = true;
  }
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    int64_t t0 = MonotonicNanos();
    float total = 0;
#pragma omp parallel num_threads(threads) reduction(+ : total)
    {
      int t = omp_get_thread_num(), nt = omp_get_num_threads();
      size_t b = n / nt * t, e = t + 1 == nt ? n : n / nt * (t + 1);
      typedef float V16 __attribute__((vector_size(64)));
      V16 a0{}, a1{}, a2{}, a3{};
      for (size_t i = b; i + 64 <= e; i += 64) {
        V16 x0, x1, x2, x3;
        __builtin_memcpy(&x0, &buf[i], 64);
        __builtin_memcpy(&x1, &buf[i + 16], 64);
        __builtin_memcpy(&x2, &buf[i + 32], 64);
        __builtin_memcpy(&x3, &buf[i + 48], 64);
        a0 += x0;
        a1 += x1;
        a2 += x2;
        a3 += x3;
      }
      V16 s = a0 + a1 + a2 + a3;
      for (int i = 0; i < 16; ++i) total += s[i];
    }
    double secs = (MonotonicNanos() - t0) * 1e-9;
    if (total == 42.0f) std::printf(" ");  // keep the sum alive
    best = std::max(best, n * sizeof(float) / secs);
  }
  return best;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Decode {
  double step_s;
  double tokens_per_s;
};

// Decodes `steps` steps for `batch` sequences after a short prefill each.
Decode RunDecode(Executor& exec, int batch, int steps) {
  const ModelConfig& c = exec.config();
  Rng rng(1);
  const int prompt = 32;
  for (int s = 0; s < batch; ++s) {
    StepBatch b;
    b.seqs.push_back({100 + s, 0, prompt, 0, 0, 0});
    for (int i = 0; i < prompt; ++i)
      b.tokens.push_back(static_cast<int32_t>(rng.Below(c.vocab_size)));
    b.num_logits_rows = 1;
    (void)exec.Step(b, nullptr);
  }
  std::vector<double> times;
  for (int step = 0; step < steps; ++step) {
    StepBatch b;
    for (int s = 0; s < batch; ++s) {
      b.seqs.push_back({100 + s, prompt + step, 1, 0, s, s});
      b.tokens.push_back(static_cast<int32_t>(rng.Below(c.vocab_size)));
    }
    b.num_logits_rows = batch;
    int64_t t0 = MonotonicNanos();
    Status st = exec.Step(b, nullptr).status();
    if (!st.ok()) std::fprintf(stderr, "step failed: %s\n", st.ToString().c_str());
    times.push_back((MonotonicNanos() - t0) * 1e-9);
  }
  for (int s = 0; s < batch; ++s) (void)exec.FreeSeq(100 + s);
  double t = Median(times);
  return {t, batch / t};
}

double RunPrefill(Executor& exec, int tokens, int reps) {
  const ModelConfig& c = exec.config();
  Rng rng(2);
  std::vector<double> times;
  for (int r = 0; r < reps; ++r) {
    StepBatch b;
    b.seqs.push_back({7, 0, tokens, 0, 0, 0});
    for (int i = 0; i < tokens; ++i)
      b.tokens.push_back(static_cast<int32_t>(rng.Below(c.vocab_size)));
    b.num_logits_rows = 1;
    int64_t t0 = MonotonicNanos();
    (void)exec.Step(b, nullptr);
    times.push_back((MonotonicNanos() - t0) * 1e-9);
    (void)exec.FreeSeq(7);
  }
  return Median(times);
}

// Time of the model's linear layers for `m` tokens done by plain SGEMMs.
double SgemmTime(const ModelConfig& c, int m, int reps) {
  struct Shape {
    int n, k;
    bool nt;
  };
  const int g = c.group_size(), hd = c.head_dim, h = c.hidden_size;
  std::vector<Shape> shapes = {{c.num_kv_heads * (g + 2) * hd, h, true},
                               {h, c.q_dim(), false},
                               {2 * c.intermediate_size, h, true},
                               {h, c.intermediate_size, false}};
  std::vector<double> times;
  for (int r = 0; r < reps; ++r) {
    double total = 0;
    for (auto& s : shapes) {
      std::vector<float> x(static_cast<size_t>(m) * s.k, 0.5f),
          w(static_cast<size_t>(s.n) * s.k, 0.25f), y(static_cast<size_t>(m) * s.n);
      int64_t t0 = MonotonicNanos();
      cblas_sgemm(CblasRowMajor, CblasNoTrans, s.nt ? CblasTrans : CblasNoTrans, m, s.n, s.k, 1.0f,
                  x.data(), s.k, w.data(), s.nt ? s.k : s.n, 0.0f, y.data(), s.n);
      total += (MonotonicNanos() - t0) * 1e-9;
    }
    times.push_back(total * c.num_layers);
  }
  return Median(times);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"FailSafe single-device benchmark"};
  std::string model, preset = "1b-llama", cache = "/tmp/failsafe-bench";
  std::vector<int> thread_counts = {1, 2};
  int steps = 24, prefill_tokens = 512;
  app.add_option("--model", model, "model directory (default: make --preset in --cache)");
  app.add_option("--preset", preset, "synthetic preset when no --model")->capture_default_str();
  app.add_option("--cache", cache, "where the synthetic model is made")->capture_default_str();
  app.add_option("--threads", thread_counts, "thread counts")->delimiter(',');
  app.add_option("--steps", steps, "decode steps timed")->capture_default_str();
  app.add_option("--prefill-tokens", prefill_tokens, "prompt length for prefill")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (model.empty()) {
    model = cache + "/" + preset;
    if (!std::filesystem::exists(model + "/config.json")) {
      std::printf("making %s in %s ...\n", preset.c_str(), model.c_str());
      SyntheticModelOptions o;
      o.preset = preset;
      Status st = WriteSyntheticModel(model, o);
      if (!st.ok()) {
        std::fprintf(stderr, "error: %s\n", st.ToString().c_str());
        return 1;
      }
    }
  }
  auto cfg = ModelConfig::Load(model);
  if (!cfg.ok()) {
    std::fprintf(stderr, "error: %s\n", cfg.status().ToString().c_str());
    return 1;
  }
  const ModelConfig& c = *cfg;
  // Bytes a decode step reads: every weight but the embedding table.
  const int64_t weight_bytes =
      (c.NumParameters() - int64_t(c.vocab_size) * c.hidden_size) * 4 +
      (c.tie_word_embeddings ? int64_t(c.vocab_size) * c.hidden_size * 4 : 0);
  const double flops_per_token = 2.0 * weight_bytes / 4;
  std::printf("model %s: %.2fB parameters, %.2f GiB read per decode step\n", model.c_str(),
              c.NumParameters() / 1e9, weight_bytes / double(1ull << 30));
  std::printf("%-8s %12s %10s %12s %12s %10s %12s %12s %9s\n", "threads", "bandwidth", "dec b=1",
              "of limit", "dec b=16", "prefill", "engine", "sgemm", "of sgemm");
  std::printf("%-8s %12s %10s %12s %12s %10s %12s %12s %9s\n", "", "GB/s", "tok/s", "", "tok/s",
              "tok/s", "GFLOP/s", "GFLOP/s", "");
  for (int threads : thread_counts) {
    LocalExecutorOptions eo;
    eo.threads = threads;
    auto exec = LocalExecutor::Create(model, eo);
    if (!exec.ok()) {
      std::fprintf(stderr, "error: %s\n", exec.status().ToString().c_str());
      return 1;
    }
    double bw = MeasureReadBandwidth(threads);
    Decode d1 = RunDecode(**exec, 1, steps);
    Decode d16 = RunDecode(**exec, 16, std::max(4, steps / 3));
    double prefill_s = RunPrefill(**exec, prefill_tokens, 3);
    openblas_set_num_threads(threads);
    double sgemm_s = SgemmTime(c, prefill_tokens, 3);
    // Engine GFLOP/s counts the same linear-layer FLOPs the SGEMM row does.
    const double linear_flops = flops_per_token * prefill_tokens -
                                2.0 * prefill_tokens * double(c.vocab_size) * c.hidden_size;
    double limit = bw / weight_bytes;  // tokens/s if a step cost only its weight reads
    std::printf("%-8d %12.1f %10.2f %11.1f%% %12.2f %10.1f %12.1f %12.1f %8.1f%%\n", threads,
                bw / 1e9, d1.tokens_per_s, 100.0 * d1.tokens_per_s / limit, d16.tokens_per_s,
                prefill_tokens / prefill_s, linear_flops / prefill_s / 1e9,
                linear_flops / sgemm_s / 1e9, 100.0 * sgemm_s / prefill_s);
  }
  return 0;
}
