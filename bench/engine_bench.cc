// Single-device engine benchmark: decode and prefill speed on one model, f32
// and bf16 weights, against the machine's measured memory bandwidth and the
// GEMM rate on the same shapes (the engine's own kernel, and OpenBLAS,
// oneDNN and BLIS where installed). A program that prints figures, not a
// test.
//
//   failsafe_bench_engine [--model DIR | --preset 1b-llama] [--dtypes f32,bf16]
//                         [--threads 1,2] [--isa all|avx512,avx2,generic]
//                         [--bf16-products auto|dpbf16|fma]
#include <immintrin.h>
#include <omp.h>
#include <spawn.h>
#include <sys/wait.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu_features.h"
#include "common/clock.h"
#include "common/rng.h"
#include "engine/executor.h"
#include "engine/kv_tables.h"
#include "engine/local_executor.h"
#include "engine_steps.h"
#include "gemm_libs.h"
#include "model/synthetic.h"
#include "placement/plan.h"
#include "worker/item_matrix.h"

using namespace failsafe;
using failsafe::bench::Decode;
using failsafe::bench::Median;
using failsafe::bench::ProcessCpuNanos;
using failsafe::bench::RunDecode;
using failsafe::bench::RunPrefill;

namespace {

// One thread's read of floats [b, e) of a buffer (a multiple of 1024
// floats), its sum returned, by vectors V: the part as kRuns runs far apart,
// side by side, eight lines in flight at a time; with several runs each load
// asks for its line as far on as decode asks for its blocked weights'
// (cpu::DecodeAheadBytes).
// Instantiated at the CPU's widest vectors whatever the kernels' level (the
// limit is the machine's).
template <typename V, int kRuns>
__attribute__((always_inline)) inline float ReadRuns(const float* buf, size_t b, size_t e) {
  constexpr int kLines = 8 / kRuns, kPerLine = 64 / sizeof(V), kFloats = sizeof(V) / 4;
  const size_t len = (e - b) / kRuns;  // floats per run, whole groups of kLines lines
  const size_t ahead = static_cast<size_t>(cpu::DecodeAheadBytes()) / sizeof(float);
  V acc[8] = {};
  for (size_t i = 0; i < len; i += 16 * kLines) {
#pragma GCC unroll 8
    for (int q = 0; q < kRuns; ++q) {
      const float* r = buf + b + q * len + i;
      if (kRuns > 1) __builtin_prefetch(r + std::min<size_t>(ahead, len - i - 16));
#pragma GCC unroll 8
      for (int l = 0; l < kLines; ++l) {
#pragma GCC unroll 4
        for (int h = 0; h < kPerLine; ++h) {
          V x;
          __builtin_memcpy(&x, r + 16 * l + kFloats * h, sizeof(x));
          acc[q * kLines + l] += x;
        }
      }
    }
  }
  V s = acc[0];
  for (int q = 1; q < 8; ++q) s += acc[q];
  return s[0] + s[kFloats - 1];
}
typedef float V8f __attribute__((vector_size(32)));
typedef float V16f __attribute__((vector_size(64)));
template <int kRuns>
__attribute__((target("avx2"))) float ReadRunsAvx2(const float* buf, size_t b, size_t e) {
  return ReadRuns<V8f, kRuns>(buf, b, e);
}
template <int kRuns>
__attribute__((target("avx512f"))) float ReadRunsAvx512(const float* buf, size_t b, size_t e) {
  return ReadRuns<V16f, kRuns>(buf, b, e);
}

// Streaming read bandwidth (bytes/s) of `threads` threads over a 1 GiB buffer
// allocated the way the engine allocates weights (transparent huge pages):
// the best of several readers (ReadRuns: one stream, and two, four or eight
// runs far apart with prefetches), each the best of three passes. (A single 64-byte
// GCC vector sum read 12.5 GB/s on one thread of a Zen 3 where llama.cpp's
// decode streamed 20: without AVX-512 such a vector lives in memory.)
double MeasureReadBandwidth(int threads) {
  const size_t n = (1ull << 30) / sizeof(float);
  static AlignedFloats storage(n);
  static bool filled = false;
  float* buf = storage.data;
  if (!filled) {
    std::fill(buf, buf + n, 1.0f);
    filled = true;
  }
  const bool wide = HostCpuFeatures().avx512f;
  typedef float (*Reader)(const float*, size_t, size_t);
  const Reader readers[] = {
      wide ? ReadRunsAvx512<1> : ReadRunsAvx2<1>, wide ? ReadRunsAvx512<2> : ReadRunsAvx2<2>,
      wide ? ReadRunsAvx512<4> : ReadRunsAvx2<4>, wide ? ReadRunsAvx512<8> : ReadRunsAvx2<8>};
  // The best seen at this thread count, over calls: a later call (after a
  // model was loaded and dropped) read up to a quarter less on a shared
  // machine, which would flatter the decode beside it.
  static std::map<int, double> seen;
  double& best = seen[threads];
  for (Reader read : readers) {
    for (int rep = 0; rep < 3; ++rep) {
      const int64_t t0 = MonotonicNanos();
      float total = 0;
#pragma omp parallel num_threads(threads) reduction(+ : total)
      {
        const int t = omp_get_thread_num(), nt = omp_get_num_threads();
        // Each thread's part: whole multiples of eight runs of whole lines.
        const size_t part = n / nt / 1024 * 1024;
        total += read(buf, part * t, part * (t + 1));
      }
      const double secs = (MonotonicNanos() - t0) * 1e-9;
      if (total == 42.0f) std::printf(" ");  // keep the sum alive
      const size_t bytes = n / threads / 1024 * 1024 * threads * sizeof(float);
      best = std::max(best, bytes / secs);
    }
  }
  return best;
}

// The f32 multiply-add rate (FLOP/s) `threads` threads reach with the
// widest FMA the kernels' `level` uses, on twelve independent chains per
// thread: enough to cover the FMA latency, so this is the ceiling a GEMM
// built from f32 FMAs can reach on this CPU (the generic level's: its exact
// fused multiply-add by double sums, simd.h).
// Each function runs twelve chains of `iters` FMAs on full vectors (the
// avx512 level's and vdpbf16ps's in the backend, cpu::Avx512FmaChains and
// Avx512Dpbf16Chains, which also time them at start-up).
__attribute__((target("avx2,fma"))) double Chains256(int64_t iters) {
  __m256 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_ps(1.0f + i * 1e-3f);
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  }
  __m256 s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm256_add_ps(s, acc[i]);
  float out[8];
  _mm256_storeu_ps(out, s);
  return out[0] + out[7];
}

// The same of SSE's separate multiply and add, four lanes each: what the
// generic level's hardware does per cycle without the exact fused
// multiply-add. Printed beside the generic peaks for scale only: chains
// built from it would round twice and differ from the other levels'.
double ChainsSseUnfused(int64_t iters) {
  __m128 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm_set1_ps(1.0f + i * 1e-3f);
  const __m128 a = _mm_set1_ps(0.999999f), b = _mm_set1_ps(1e-7f);
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) acc[i] = _mm_add_ps(_mm_mul_ps(acc[i], a), b);
  }
  __m128 s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm_add_ps(s, acc[i]);
  float out[4];
  _mm_storeu_ps(out, s);
  return out[0] + out[3];
}

// The best of three runs of `chains(iters)` on each of `threads` threads,
// in FLOP/s (`flops` per iteration of one thread).
template <typename Chains>
double BestRate(int threads, int64_t iters, double flops, Chains chains) {
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    const int64_t t0 = MonotonicNanos();
    double sink = 0;
#pragma omp parallel num_threads(threads) reduction(+ : sink)
    sink += chains(iters);
    const double secs = (MonotonicNanos() - t0) * 1e-9;
    if (sink == 42.0) std::printf(" ");  // keep the chains alive
    best = std::max(best, flops * iters * threads / secs);
  }
  return best;
}

// The unfused SSE rate (FLOP/s) of `threads` threads: twelve chains of
// four lanes, a multiply and an add each.
double MeasureSseUnfusedPeak(int threads) {
  return BestRate(threads, 20'000'000, 2.0 * 4 * 12, ChainsSseUnfused);
}

// bf16: the bf16 chain's ceiling instead: vdpbf16ps's chains (avx512), or
// FmaBf16's (generic).
double MeasureFmaPeak(int threads, CpuIsa level, bool bf16 = false) {
  const int lanes = level == CpuIsa::kAvx2 ? 8 : 16;
  const bool generic = level == CpuIsa::kGeneric;
  // The generic level's fused multiply-add is some twenty instructions.
  const int64_t iters = generic ? 2'000'000 : 20'000'000;
  const double flops = bf16 && !generic ? 4.0 : 2.0;  // per lane and instruction
  return BestRate(threads, iters, flops * lanes * 12, [&](int64_t n) -> double {
    return bf16 && generic            ? cpu::GenericBf16Chains(n)
           : bf16                     ? cpu::Avx512Dpbf16Chains(n)
           : level == CpuIsa::kAvx512 ? cpu::Avx512FmaChains(n)
           : level == CpuIsa::kAvx2   ? Chains256(n)
                                      : cpu::GenericFmaChains(n);
  });
}

// The model's linear layers per token: (n, k, nt) of q/k/v, o, gate/up, down;
// the rows of the items the engine holds [n, k] weights blocked in
// (worker/item_matrix.h: heads, FFN shards; 0: row-major); and the k-values
// of the fixed-point items the engine sums [k, n] products in (one per query
// head, one per FFN shard; 0 for nt).
struct Shape {
  int n, k;
  bool nt;
  int item_rows;
  int item_k;
};
std::vector<Shape> LinearShapes(const ModelConfig& c) {
  const int g = c.group_size(), hd = c.head_dim, h = c.hidden_size;
  const int shard_width = PlanShape::ForModel(c).shard_width;
  return {{c.num_kv_heads * (g + 2) * hd, h, true, hd, 0},
          {h, c.q_dim(), false, 0, hd},
          {2 * c.intermediate_size, h, true, 2 * shard_width, 0},
          {h, c.intermediate_size, false, 0, shard_width}};
}

// The lm head: [vocabulary, hidden], blocked in the plan's vocabulary chunks
// (the last one padded to a whole chunk).
Shape LmHeadShape(const ModelConfig& c) {
  const PlanShape p = PlanShape::ForModel(c);
  return {p.vocab_chunks * p.vocab_chunk_size, c.hidden_size, true, p.vocab_chunk_size, 0};
}

// Median over reps of the time of a step's linear products: one layer's
// shapes for m rows, times the number of layers, and the lm head for
// head_rows rows (none if 0). run(shape, rows, x, w, y) does one product.
// Each shape has its own weight, allocated once, as the engine allocates
// them (transparent huge pages): a layer's weights together are far larger
// than the last-level cache, so each is read from memory, as the model's
// are (one weight for every shape would let a small one be read from the
// cache, where a larger one had just left it).
template <typename Run>
double StepLinearTime(const ModelConfig& c, int m, int head_rows, int reps, Run run) {
  std::vector<Shape> shapes = LinearShapes(c);
  const size_t layer_shapes = shapes.size();
  if (head_rows > 0) shapes.push_back(LmHeadShape(c));
  int64_t x_floats = 0, y_floats = 0;
  static std::vector<std::unique_ptr<AlignedFloats>> weights;
  weights.resize(std::max(weights.size(), shapes.size()));
  for (size_t i = 0; i < shapes.size(); ++i) {
    const Shape& s = shapes[i];
    const int rows = i < layer_shapes ? m : head_rows;
    x_floats = std::max<int64_t>(x_floats, int64_t(rows) * s.k);
    y_floats = std::max<int64_t>(y_floats, int64_t(rows) * s.n);
    const int64_t w_floats = int64_t(s.n) * s.k;
    auto& w = weights[i];
    if (w && static_cast<int64_t>(w->size) >= w_floats) continue;
    w.reset();
    w = std::make_unique<AlignedFloats>(w_floats);
    for (int64_t j = 0; j < w_floats; ++j) w->data[j] = 0.25f;  // also 0x3e80 as bf16: 0.25
  }
  std::vector<float> x(x_floats, 0.5f), y(y_floats);
  auto time = [&](size_t i, int rows) {
    int64_t t0 = MonotonicNanos();
    run(shapes[i], rows, x.data(), static_cast<const void*>(weights[i]->data), y.data());
    return (MonotonicNanos() - t0) * 1e-9;
  };
  std::vector<double> times;
  for (int r = 0; r < reps + 1; ++r) {
    double total = 0;
    for (size_t i = 0; i < layer_shapes; ++i) total += time(i, m);
    total *= c.num_layers;
    if (head_rows > 0) total += time(layer_shapes, head_rows);
    if (r > 0) times.push_back(total);  // the first warms up
  }
  return Median(times);
}

// The engine's own GEMM on the layers' shapes (weights of `dtype`), each
// weight in the layout the engine holds it in: [n, k] ones blocked (Shape),
// [k, n] ones row-major or where the backend holds those column-blocked
// (`column_blocked`). As plain products (`items` false: a column-blocked
// [k, n] weight as the blocked [n, k] weight that is, one item), as a
// library would compute them; or with the [k, n] products in the exact
// fixed-point items the step sums them in (`items`), as the step calls
// them. The weights are all equal, so the layout changes how they are read,
// not y.
double EngineGemmTime(const ModelConfig& c, int m, int head_rows, int threads, DType dtype,
                      std::optional<CpuIsa> isa, std::optional<bool> dpbf16, bool column_blocked,
                      int reps, bool items = false) {
  std::vector<int64_t> acc;
  auto run = [&](const Shape& s, int rows, const float* x, const void* w, float* y) {
    cpu::GemmArgs a;
    a.x = x;
    a.ldx = s.k;
    a.w = w;
    a.wtype = dtype;
    a.m = rows;
    a.n = s.n;
    a.k = s.k;
    a.threads = threads;
    a.isa = isa;
    a.dpbf16 = dpbf16;
    if (items && !s.nt) {  // [k, n], as the step calls it
      acc.resize(std::max(acc.size(), static_cast<size_t>(rows) * s.n));
      a.nt = false;
      a.ldw = s.n;
      a.w_blocked16 = column_blocked;
      a.out = cpu::GemmOut::kFixedItems;
      a.acc = acc.data();
      a.ldacc = s.n;
      a.item_k = s.item_k;
    } else {
      a.nt = s.nt || column_blocked;
      a.ldw = a.nt ? s.k : s.n;
      a.w_blocked16 = a.nt;
      a.w_item_rows = s.nt ? s.item_rows : s.n;
      a.y = y;
      a.ldy = s.n;
    }
    cpu::Gemm(a);
  };
  return StepLinearTime(c, m, head_rows, reps, run);
}

// Whether a device holds [k, n] weights of `dtype` column-blocked with
// these kernel options (Backend::ColumnBlockedNN).
bool ColumnBlocked(DType dtype, std::optional<CpuIsa> isa, std::optional<bool> dpbf16) {
  CpuBackendOptions o;
  o.isa = isa;
  o.dpbf16 = dpbf16;
  return MakeCpuBackend(o)->ColumnBlockedNN(dtype);
}

double LibraryGemmTime(const ModelConfig& c, int m, int threads, bench::LibraryGemm& lib,
                       int reps) {
  lib.SetThreads(threads);
  auto run = [&](const Shape& s, int rows, const float* x, const void* w, float* y) {
    lib.Run(s.nt, rows, s.n, s.k, x, static_cast<const float*>(w), y);
  };
  return StepLinearTime(c, m, 0, reps, run);
}

}  // namespace

// The libraries held to a kernels' level, as the environment variables
// they read when loaded: OpenBLAS's core type and oneDNN's instruction-set
// ceiling (none for the best level: theirs).
std::vector<std::string> LibraryEnvironment(CpuIsa level) {
  switch (level) {
    case CpuIsa::kAvx512:
      return {"OPENBLAS_CORETYPE=SkylakeX", "ONEDNN_MAX_CPU_ISA=AVX512_CORE"};
    case CpuIsa::kAvx2:
      return {"OPENBLAS_CORETYPE=Haswell", "ONEDNN_MAX_CPU_ISA=AVX2"};
    case CpuIsa::kGeneric:
      return {"OPENBLAS_CORETYPE=Prescott", "ONEDNN_MAX_CPU_ISA=SSE41"};
  }
  return {};
}

// Runs this benchmark once per level, each in a process of its own (the
// libraries read their level when loaded), with the same arguments but
// --isa. Returns the first failing exit status, or 0.
int RunEachLevel(int argc, char** argv, const std::vector<CpuIsa>& levels) {
  std::vector<std::string> args;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--isa") {
      ++i;  // and its value
      continue;
    }
    if (a.rfind("--isa=", 0) == 0) continue;
    args.push_back(a);
  }
  for (CpuIsa level : levels) {
    std::vector<std::string> child = args;
    child.push_back("--isa");
    child.push_back(CpuIsaName(level));
    std::vector<char*> cargv;
    for (std::string& a : child) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    std::vector<std::string> env_strings;
    for (char** e = environ; *e; ++e) {
      const std::string v = *e;
      if (v.rfind("OPENBLAS_CORETYPE=", 0) == 0 || v.rfind("ONEDNN_MAX_CPU_ISA=", 0) == 0 ||
          v.rfind("FAILSAFE_BENCH_LEVEL=", 0) == 0)
        continue;
      env_strings.push_back(v);
    }
    for (const std::string& v : LibraryEnvironment(level)) env_strings.push_back(v);
    env_strings.push_back(std::string("FAILSAFE_BENCH_LEVEL=") + CpuIsaName(level));
    std::vector<char*> cenv;
    for (std::string& v : env_strings) cenv.push_back(v.data());
    cenv.push_back(nullptr);
    std::printf("\n=== level %s (libraries:", CpuIsaName(level));
    for (const std::string& v : LibraryEnvironment(level)) std::printf(" %s", v.c_str());
    std::printf(") ===\n");
    std::fflush(stdout);
    pid_t pid;
    if (posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, cargv.data(), cenv.data()) != 0) {
      std::perror("posix_spawn");
      return 1;
    }
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
      return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
  }
  return 0;
}

int main(int argc, char** argv) {
  CLI::App app{"FailSafe single-device benchmark"};
  std::string model, preset = "1b-llama", cache = "/tmp/failsafe-bench", isa_name = "all";
  std::vector<int> thread_counts = {1, 2};
  std::vector<std::string> dtype_names = {"f32", "bf16"};
  int steps = 24, prefill_tokens = 512, batch = 16, context = 32, block_size = 16;
  bool scatter = false;
  bool skip_libraries = false;
  std::string only;
  std::string bf16_products = "auto";
  app.add_option("--model", model, "model directory (default: make --preset in --cache)");
  app.add_option("--preset", preset, "synthetic preset when no --model")->capture_default_str();
  app.add_option("--cache", cache, "where the synthetic models are made")->capture_default_str();
  app.add_option("--dtypes", dtype_names, "weight types of the synthetic models (f32, bf16, f16)")
      ->delimiter(',');
  app.add_option("--threads", thread_counts, "thread counts")->delimiter(',');
  app.add_option("--steps", steps, "decode steps timed")->capture_default_str();
  app.add_option("--batch", batch, "the batched decode's batch size")->capture_default_str();
  app.add_option("--prefill-tokens", prefill_tokens, "prompt length for prefill")
      ->capture_default_str();
  app.add_option("--context", context,
                 "positions each decoding sequence holds before its timed steps (its prompt)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 16));
  app.add_option("--block-size", block_size, "positions per KV page")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  bool step_times = false;
  app.add_flag("--step-times", step_times, "with --only decode or decode-batch: each step's ms");
  std::string kv_dtype_name = "f32";
  app.add_option("--kv-dtype", kv_dtype_name, "what the KV pages hold: f32 or bf16")
      ->capture_default_str()
      ->check(CLI::IsMember({"f32", "bf16"}));
  app.add_flag("--scatter", scatter,
               "decode from KV pages scattered over the pool (every page handed out and freed "
               "in a random order first, as a long-running server's) rather than a fresh pool's");
  app.add_option("--isa", isa_name,
                 "the kernels' levels, each in a process of its own with the libraries held to "
                 "it: all (every level this CPU has) or a list of avx512, avx2, generic")
      ->capture_default_str();
  app.add_flag("--no-libraries", skip_libraries, "skip the library GEMM comparison");
  app.add_option("--only", only,
                 "time only --steps prefills of --prefill-tokens, or --steps decode steps at "
                 "batch 1 (decode) or --batch (decode-batch), e.g. under a profiler")
      ->check(CLI::IsMember({"prefill", "decode", "decode-batch"}));
  app.add_option("--bf16-products", bf16_products,
                 "bf16 weights' products: auto (vdpbf16ps where it computes the chain: in "
                 "decode's few rows, and in register tiles where it outruns fused "
                 "multiply-adds), dpbf16 (wherever it computes the chain) or fma")
      ->check(CLI::IsMember({"auto", "dpbf16", "fma"}))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  std::vector<CpuIsa> levels;
  for (size_t at = 0; at <= isa_name.size();) {
    const size_t comma = std::min(isa_name.find(',', at), isa_name.size());
    const std::string name = isa_name.substr(at, comma - at);
    at = comma + 1;
    if (name == "all") {
      for (CpuIsa l : {CpuIsa::kAvx512, CpuIsa::kAvx2, CpuIsa::kGeneric})
        if (CpuSupports(HostCpuFeatures(), l)) levels.push_back(l);
      continue;
    }
    const std::optional<CpuIsa> l = ParseCpuIsa(name);
    if (!l || !CpuSupports(HostCpuFeatures(), *l)) {
      std::fprintf(stderr,
                   "error: --isa: '%s' is not a level this CPU has (avx512, avx2, generic)\n",
                   name.c_str());
      return 1;
    }
    levels.push_back(*l);
  }
  // Each level in a process whose libraries were loaded held to it.
  const char* running = std::getenv("FAILSAFE_BENCH_LEVEL");
  if (levels.size() > 1 || !running || running != std::string(CpuIsaName(levels.front())))
    return RunEachLevel(argc, argv, levels);
  const std::optional<CpuIsa> isa = levels.front();
  if (*isa == CpuIsa::kGeneric && (prefill_tokens > 64 || steps > 4)) {
    // Its products are fused multiply-adds by double sums, a tenth to a
    // twentieth of the vector levels' rate: a shorter run of the same
    // measures.
    prefill_tokens = std::min(prefill_tokens, 64);
    steps = std::min(steps, 4);
    batch = std::min(batch, 8);
    std::printf("generic level: prefill of %d tokens, %d decode steps, batch %d\n", prefill_tokens,
                steps, batch);
  }
  const CpuFeatures& f = HostCpuFeatures();
  const CpuIsa level = cpu::GemmIsaFor(isa);
  const std::optional<bool> dpbf16 = bf16_products == "fma"      ? std::optional<bool>(false)
                                     : bf16_products == "dpbf16" ? std::optional<bool>(true)
                                                                 : std::nullopt;
  const bool uses_dpbf16 = dpbf16.value_or(true) && cpu::GemmDpbf16For(level);
  const bool tiles_dpbf16 = dpbf16.value_or(cpu::GemmDpbf16TilesFor(level)) && uses_dpbf16;
  std::printf("cpu: %s (family %d model %d)\n", f.model.c_str(), f.family, f.model_id);
  std::printf("features: %s\n", f.ToString().c_str());
  std::printf(
      "kernel: %s (register tile %d x 32, fma chains over k; f32 and f16 weights: f32 "
      "activations, f16 widened in registers)\n",
      CpuIsaName(level), cpu::GemmTileRows(level));
  char split[128];
  std::snprintf(split, sizeof(split),
                "vdpbf16ps in decode and plain products of up to %d rows, fused multiply-adds in "
                "other tiles",
                cpu::kDpbf16Rows);
  std::printf("bf16 chain (bf16 activations, pairs odd then even): %s%s\n",
              !uses_dpbf16   ? "fused multiply-adds"
              : tiles_dpbf16 ? "vdpbf16ps"
                             : split,
              uses_dpbf16 || !f.avx512_bf16          ? ""
              : !cpu::GemmDpbf16For(CpuIsa::kAvx512) ? " (vdpbf16ps differs from the chain here)"
                                                     : " (vdpbf16ps not used: forced)");

  // The ceiling of f32 FMA work per thread count, for the GEMM columns below.
  // A peak per thread count, measured and printed on one line.
  // (unfused: the generic level's separate SSE multiply and add, for scale.)
  auto peaks = [&](const char* label, bool bf16, bool unfused = false) {
    std::vector<double> out;
    std::printf("%s:", label);
    for (size_t i = 0; i < thread_counts.size(); ++i) {
      out.push_back(unfused ? MeasureSseUnfusedPeak(thread_counts[i])
                            : MeasureFmaPeak(thread_counts[i], level, bf16));
      std::printf(" %d thread%s %.1f GFLOP/s%s", thread_counts[i], thread_counts[i] == 1 ? "" : "s",
                  out.back() / 1e9, i + 1 < thread_counts.size() ? "," : "\n");
    }
    return out;
  };
  const std::string f32_label = std::string("f32 FMA peak (") + CpuIsaName(level) + ", 12 chains)";
  const std::vector<double> fma_peak = peaks(f32_label.c_str(), false);
  // The bf16 chain's ceiling in register tiles (prefill's): vdpbf16ps's
  // where tiles take it, FmaBf16's on the generic level, else the FMAs'.
  std::vector<double> bf16_peak = fma_peak;
  if (level == CpuIsa::kGeneric) {
    bf16_peak = peaks("bf16 chain peak (generic, FmaBf16: no checks, 12 chains)", true);
    peaks("for scale, SSE multiply then add (two roundings: not the chains' bits)", false, true);
  }
  if (uses_dpbf16) {
    const std::vector<double> dp_peak = peaks("bf16 product peak (vdpbf16ps, 12 chains)", true);
    if (tiles_dpbf16) bf16_peak = dp_peak;
    std::printf(
        "vdpbf16ps per fused multiply-add (start-up measure, tiles take it from %.3f): %.2f\n",
        cpu::kDpbf16TilesFrom, cpu::GemmDpbf16PerFma());
  }

  // One model directory per weight type.
  std::vector<std::pair<DType, std::string>> models;
  if (!model.empty()) {
    models.push_back({DType::kF32, model});
  } else {
    for (const std::string& name : dtype_names) {
      DType t;
      if (name == "f32") {
        t = DType::kF32;
      } else if (name == "bf16") {
        t = DType::kBF16;
      } else if (name == "f16") {
        t = DType::kF16;
      } else {
        std::fprintf(stderr, "error: --dtypes: unknown type '%s'\n", name.c_str());
        return 1;
      }
      const std::string dir = cache + "/" + preset + (t == DType::kF32 ? "" : "-" + name);
      if (!std::filesystem::exists(dir + "/config.json")) {
        std::printf("making %s (%s) in %s ...\n", preset.c_str(), name.c_str(), dir.c_str());
        SyntheticModelOptions o;
        o.preset = preset;
        o.dtype = t;
        Status st = WriteSyntheticModel(dir, o);
        if (!st.ok()) {
          std::fprintf(stderr, "error: %s\n", st.ToString().c_str());
          return 1;
        }
      }
      models.push_back({t, dir});
    }
  }

  for (auto& [dtype_hint, dir] : models) {
    auto cfg = ModelConfig::Load(dir);
    if (!cfg.ok()) {
      std::fprintf(stderr, "error: %s\n", cfg.status().ToString().c_str());
      return 1;
    }
    const ModelConfig& c = *cfg;
    auto store = WeightStore::Open(dir, c);
    if (!store.ok()) {
      std::fprintf(stderr, "error: %s\n", store.status().ToString().c_str());
      return 1;
    }
    const DType dtype = (*store)->MatrixDType();
    const int64_t bytes_per = static_cast<int64_t>(DTypeSize(dtype));
    // Bytes a decode step reads: every weight but the embedding table.
    const int64_t params_read = c.NumParameters() - int64_t(c.vocab_size) * c.hidden_size +
                                (c.tie_word_embeddings ? int64_t(c.vocab_size) * c.hidden_size : 0);
    const int64_t weight_bytes = params_read * bytes_per;
    // FLOPs of the linear layers without the lm head, per token.
    const double linear_flops_per_token =
        2.0 * (params_read - double(c.vocab_size) * c.hidden_size);
    std::printf("\nmodel %s: %.2fB parameters, %s weights, %.2f GiB read per decode step\n",
                dir.c_str(), c.NumParameters() / 1e9, DTypeName(dtype),
                weight_bytes / double(1ull << 30));
    std::printf("%-7s %9s %9s %8s %9s %9s %9s %8s %9s %9s %8s %8s\n", "threads", "bandwidth",
                "dec b=1", "of bw", "b=1 cpu", "dec b=B", "GEMM b=B", "of GEMM", "prefill",
                "GEMM pre", "of GEMM", "of peak");
    std::printf("%-7s %9s %9s %8s %9s %9s %9s %8s %9s %9s %8s %8s\n", "", "GB/s", "tok/s", "limit",
                "tok/s", "tok/s", "GFLOP/s", "", "tok/s", "GFLOP/s", "", "(chain)");
    std::printf(
        "(GEMM: the step's linear products as plain products; the \"items\" line below each:\n"
        " the same with o and down in the exact fixed-point items the step sums them in)\n");
    for (size_t ti = 0; ti < thread_counts.size(); ++ti) {
      const int threads = thread_counts[ti];
      LocalExecutorOptions eo;
      eo.threads = threads;
      eo.block_size = block_size;
      eo.kv_dtype = kv_dtype_name == "bf16" ? DType::kBF16 : DType::kF32;
      // The pool: what the timed sequences need at most (the batch's
      // decoding, or one prefill), every (layer, head group) of them.
      auto blocks = [block_size](int64_t tokens) { return (tokens + block_size - 1) / block_size; };
      eo.kv_pages = static_cast<int64_t>(c.num_layers) * c.num_kv_heads *
                    std::max(batch * blocks(context + steps), blocks(prefill_tokens));
      eo.isa = isa;
      eo.dpbf16 = dpbf16;
      auto exec = LocalExecutor::Create(dir, eo);
      if (!exec.ok()) {
        std::fprintf(stderr, "error: %s\n", exec.status().ToString().c_str());
        return 1;
      }
      if (only == "prefill") {
        const double s = RunPrefill(**exec, prefill_tokens, steps);
        std::printf("%-7d prefill %d tokens: %.1f tok/s (median of %d)\n", threads, prefill_tokens,
                    prefill_tokens / s, steps);
        continue;
      }
      if (only == "decode" || only == "decode-batch") {
        const int rows = only == "decode" ? 1 : batch;
        const Decode d = RunDecode(**exec, rows, steps, context, scatter);
        std::printf(
            "%-7d decode at batch %d, context %d, pages of %d %s%s: %.2f tok/s over %d steps\n",
            threads, rows, context, block_size, kv_dtype_name.c_str(),
            scatter ? " (scattered)" : "", d.tokens_per_s, steps);
        if (step_times) {
          std::printf("        step ms:");
          for (double s : d.steps_s) std::printf(" %.1f", s * 1e3);
          std::printf("\n");
        }
        continue;
      }
      const double bw = MeasureReadBandwidth(threads);
      const Decode d1 = RunDecode(**exec, 1, steps, context, scatter);
      const Decode db = RunDecode(**exec, batch, std::max(4, steps / 3), context, scatter);
      const double prefill_s = RunPrefill(**exec, prefill_tokens, 3);
      const bool cb = ColumnBlocked(dtype, isa, dpbf16);
      // A decode step's lm head takes every row, a prefill's its last.
      const double gemm_b = EngineGemmTime(c, batch, batch, threads, dtype, isa, dpbf16, cb, 3);
      const double gemm_p =
          EngineGemmTime(c, prefill_tokens, 1, threads, dtype, isa, dpbf16, cb, 3);
      // The same products as the step calls them: o and down in exact
      // fixed-point items.
      const double items_b =
          EngineGemmTime(c, batch, batch, threads, dtype, isa, dpbf16, cb, 3, true);
      const double items_p =
          EngineGemmTime(c, prefill_tokens, 1, threads, dtype, isa, dpbf16, cb, 3, true);
      const double limit = bw / weight_bytes;  // tokens/s if a step cost only its weight reads
      // Shares: the engine's whole step against the GEMMs of its linear
      // products alone (the layers' and the lm head's).
      // Decode by CPU time only with one thread: more threads' CPU time
      // includes their waiting at barriers.
      char cpu[16] = "-";
      if (threads == 1) std::snprintf(cpu, sizeof(cpu), "%.2f", d1.cpu_tokens_per_s);
      const double head_flops_per_row = 2.0 * LmHeadShape(c).n * c.hidden_size;
      const double gemm_b_rate = (linear_flops_per_token + head_flops_per_row) * batch / gemm_b;
      const double gemm_p_rate =
          (linear_flops_per_token * prefill_tokens + head_flops_per_row) / gemm_p;
      // Of the ceiling of the chain this weight type takes.
      const double peak = dtype == DType::kBF16 ? bf16_peak[ti] : fma_peak[ti];
      char of_peak[16] = "-";
      if (peak > 0) std::snprintf(of_peak, sizeof(of_peak), "%.1f%%", 100.0 * gemm_p_rate / peak);
      std::printf("%-7d %9.1f %9.2f %7.1f%% %9s %9.2f %9.1f %7.1f%% %9.1f %9.1f %7.1f%% %8s\n",
                  threads, bw / 1e9, d1.tokens_per_s, 100.0 * d1.tokens_per_s / limit, cpu,
                  db.tokens_per_s, gemm_b_rate / 1e9, 100.0 * gemm_b / db.step_s,
                  prefill_tokens / prefill_s, gemm_p_rate / 1e9, 100.0 * gemm_p / prefill_s,
                  of_peak);
      std::printf("%-7s %9s %9s %8s %9s %9s %9.1f %7.1f%% %9s %9.1f %7.1f%% %8s\n", "  items", "",
                  "", "", "", "", gemm_b_rate * gemm_b / items_b / 1e9, 100.0 * items_b / db.step_s,
                  "", gemm_p_rate * gemm_p / items_p / 1e9, 100.0 * items_p / prefill_s, "");
    }
  }

  if (skip_libraries || !only.empty()) return 0;
  // The linear layers' GEMMs alone: the engine's kernel (f32 and bf16
  // weights) against the libraries' SGEMM, same shapes, GFLOP/s.
  auto cfg = ModelConfig::Load(models.front().second);
  if (!cfg.ok()) return 1;
  const ModelConfig& c = *cfg;
  const double flops_per_row = [&] {
    double f = 0;
    for (const Shape& s : LinearShapes(c)) f += 2.0 * s.n * s.k;
    return f * c.num_layers;
  }();
  auto libs = bench::FindLibraryGemms();
  std::printf(
      "\nGEMM on the model's linear shapes at level %s, GFLOP/s (share of the level's f32 FMA "
      "peak;\nengine bf16: of its bf16 chain's)\n%-8s %-5s %16s %16s",
      CpuIsaName(level), "threads", "rows", "engine f32", "engine bf16");
  for (auto& lib : libs) std::printf(" %22s", lib->name().c_str());
  std::printf("\n");
  // "12.3 (45%)": a rate and its share of a peak.
  auto cell = [](double rate, double peak, int width) {
    char text[32];
    std::snprintf(text, sizeof(text), "%.1f (%.0f%%)", rate, 100.0 * rate * 1e9 / peak);
    std::printf(" %*s", width, text);
  };
  auto engine_rate = [&](DType t, int m, int threads, int reps) {
    return m * flops_per_row /
           EngineGemmTime(c, m, 0, threads, t, isa, dpbf16, ColumnBlocked(t, isa, dpbf16), reps) /
           1e9;
  };
  for (size_t ti = 0; ti < thread_counts.size(); ++ti) {
    const int threads = thread_counts[ti];
    for (int m : {1, batch, prefill_tokens}) {
      const int reps = m == 1 ? 5 : 3;
      std::printf("%-8d %-5d", threads, m);
      cell(engine_rate(DType::kF32, m, threads, reps), fma_peak[ti], 16);
      cell(engine_rate(DType::kBF16, m, threads, reps), bf16_peak[ti], 16);
      for (auto& lib : libs)
        cell(m * flops_per_row / LibraryGemmTime(c, m, threads, *lib, reps) / 1e9, fma_peak[ti],
             22);
      std::printf("\n");
    }
  }
  return 0;
}
