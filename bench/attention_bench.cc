// Decode attention alone, as a batched decode step calls it: for each of
// --seqs sequences and each of --kv-heads head groups, one problem of
// --group query heads over --context positions of a paged KV cache (pages
// of --block-size positions of one head group, scattered over a pool as a
// long-running server's are), storing its new key and value first. For each
// thread count: the time of one layer's attention and the KV bytes it reads
// per second, the best of --reps passes over --layers layers (more KV than
// the caches hold, as a model's are). A program that prints figures, not a
// test.
//
//   failsafe_bench_attention [--seqs 16] [--context 512] [--threads 1,2] [--kv-dtype f32|bf16]
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <numeric>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu_features.h"
#include "common/clock.h"
#include "common/rng.h"

namespace failsafe {
namespace {

int Main(int argc, char** argv) {
  CLI::App app{"FailSafe decode attention benchmark"};
  int seqs = 16, context = 512, kv_heads = 8, group = 4, head_dim = 64, block_size = 16;
  int layers = 16, reps = 5;
  std::vector<int> thread_counts = {1, 2};
  app.add_option("--seqs", seqs, "sequences in the batch")->capture_default_str();
  app.add_option("--context", context, "positions each sequence attends to")->capture_default_str();
  app.add_option("--kv-heads", kv_heads, "head groups per layer")->capture_default_str();
  app.add_option("--group", group, "query heads per head group")->capture_default_str();
  app.add_option("--head-dim", head_dim, "head dimension")->capture_default_str();
  app.add_option("--block-size", block_size, "positions per page")->capture_default_str();
  app.add_option("--layers", layers, "layers, each with its own pages")->capture_default_str();
  app.add_option("--reps", reps, "passes; the best is printed")->capture_default_str();
  app.add_option("--threads", thread_counts, "thread counts")->delimiter(',');
  bool in_order = false;
  app.add_flag("--in-order", in_order,
               "pages handed out in order, block by block over every (sequence, layer, head "
               "group), as a fresh pool's are to one long prefill (default: shuffled)");
  std::string kv_dtype_name = "f32";
  app.add_option("--kv-dtype", kv_dtype_name, "what the pages hold: f32 or bf16")
      ->capture_default_str()
      ->check(CLI::IsMember({"f32", "bf16"}));
  CLI11_PARSE(app, argc, argv);
  const DType kv_dtype = kv_dtype_name == "bf16" ? DType::kBF16 : DType::kF32;
  const int64_t elem = static_cast<int64_t>(DTypeSize(kv_dtype));
  if (seqs < 1 || context < 1 || kv_heads < 1 || group < 1 || head_dim < 1 || block_size < 1 ||
      layers < 1 || reps < 1) {
    std::fprintf(stderr, "error: every size must be at least 1\n");
    return 1;
  }

  const int blocks = (context + block_size - 1) / block_size;
  const int64_t page_bytes = 2LL * block_size * head_dim * elem;
  const int64_t problems = static_cast<int64_t>(layers) * seqs * kv_heads;
  // The pool, in host memory as the engine's KV pool is (transparent huge
  // pages), its pages handed out in a shuffled order.
  const size_t pool_bytes = static_cast<size_t>(problems * blocks * page_bytes);
  DeviceMemory& memory = HostMemory();
  std::unique_ptr<char, std::function<void(char*)>> pool_memory(
      static_cast<char*>(memory.Allocate(pool_bytes)),
      [&memory, pool_bytes](char* p) { memory.Free(p, pool_bytes); });
  char* const pool = pool_memory.get();
  Rng rng(7);
  for (size_t i = 0; i < pool_bytes / elem; ++i) {
    const float v = static_cast<float>(rng.Uniform() - 0.5);
    if (kv_dtype == DType::kF32) {
      reinterpret_cast<float*>(pool)[i] = v;
    } else {
      reinterpret_cast<uint16_t*>(pool)[i] = FloatToBFloat16(v);
    }
  }
  std::vector<int64_t> order(static_cast<size_t>(problems * blocks));
  std::iota(order.begin(), order.end(), 0);
  if (in_order) {
    // Table entry (problem p, block b) is page b * problems + p.
    for (int64_t p = 0; p < problems; ++p) {
      for (int b = 0; b < blocks; ++b)
        order[p * blocks + b] = static_cast<int64_t>(b) * problems + p;
    }
  } else {
    for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[rng.Below(i)]);
  }
  std::vector<float*> tables(order.size());
  for (size_t i = 0; i < order.size(); ++i)
    tables[i] = reinterpret_cast<float*>(pool + order[i] * page_bytes);

  const int64_t ldq = static_cast<int64_t>(kv_heads) * group * head_dim;
  const int64_t ld_kv = static_cast<int64_t>(kv_heads) * 2 * head_dim;
  std::vector<float> q(static_cast<size_t>(seqs) * ldq), out(q.size());
  std::vector<float> new_kv(static_cast<size_t>(seqs) * ld_kv);
  for (float& v : q) v = static_cast<float>(rng.Uniform() - 0.5);
  for (float& v : new_kv) v = static_cast<float>(rng.Uniform() - 0.5);
  // One layer's problems per call, as a step makes them.
  std::vector<std::vector<AttentionArgs>> layer_problems(layers);
  for (int l = 0; l < layers; ++l) {
    for (int s = 0; s < seqs; ++s) {
      for (int k = 0; k < kv_heads; ++k) {
        const int64_t p = (static_cast<int64_t>(l) * seqs + s) * kv_heads + k;
        AttentionArgs a;
        a.q = q.data() + s * ldq + static_cast<int64_t>(k) * group * head_dim;
        a.ldq = ldq;
        a.out = out.data() + s * ldq + static_cast<int64_t>(k) * group * head_dim;
        a.ldo = ldq;
        a.num_tokens = 1;
        a.start_pos = context - 1;
        a.group_size = group;
        a.head_dim = head_dim;
        a.pages = tables.data() + p * blocks;
        a.kv_dtype = kv_dtype;
        a.new_kv = new_kv.data() + s * ld_kv + static_cast<int64_t>(k) * 2 * head_dim;
        a.ld_new_kv = ld_kv;
        a.block_size = block_size;
        a.scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
        layer_problems[l].push_back(a);
      }
    }
  }

  const CpuFeatures& f = HostCpuFeatures();
  std::printf("cpu: %s\n", f.model.c_str());
  std::printf(
      "%d sequences x %d head groups of %d query heads, context %d, head dim %d, pages of "
      "%d positions, %s\n",
      seqs, kv_heads, group, context, head_dim, block_size, kv_dtype_name.c_str());
  std::printf("%7s %12s %12s\n", "threads", "ms/layer", "KV GB/s");
  const double kv_bytes = 2.0 * seqs * kv_heads * context * head_dim * elem;
  for (int threads : thread_counts) {
    auto backend = MakeCpuBackend(threads);
    double best = 1e30;
    for (int r = 0; r < reps + 1; ++r) {
      const int64_t t0 = MonotonicNanos();
      for (int l = 0; l < layers; ++l) backend->Attention(layer_problems[l]);
      const double s = (MonotonicNanos() - t0) * 1e-9 / layers;
      if (r > 0) best = std::min(best, s);  // the first warms up
    }
    std::printf("%7d %12.3f %12.1f\n", threads, best * 1e3, kv_bytes / best * 1e-9);
  }
  return 0;
}

}  // namespace
}  // namespace failsafe

int main(int argc, char** argv) { return failsafe::Main(argc, argv); }
