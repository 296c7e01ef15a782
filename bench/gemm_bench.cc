// The engine's GEMM alone on one layer's linear products, called as a device
// calls them: q/k/v and gate/up nt on weights blocked by item, o and down nn
// in fixed-point items (one exact sum per query head and per FFN shard),
// column-blocked where the CPU backend holds them so (bf16 by vdpbf16ps;
// row-major with --row-major-nn), or with --plain as plain products of the
// same layout (a column-blocked one as the blocked [n, k] weight it is, one
// item). For each product, weight type, number
// of rows and thread count: the weight bytes read per second and GFLOP/s,
// the best of --reps passes over --copies copies of the weights (more than
// the caches hold, as a model's layers are). A program that prints figures,
// not a test.
//
//   failsafe_bench_gemm [--preset 1b-llama] [--rows 1,16] [--threads 1,2]
//                       [--dtypes f32,bf16] [--products o,down] [--plain]
//                       [--row-major-nn] [--bf16-products auto|dpbf16|fma]
//                       [--isa avx512|avx2|generic]
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/cpu/gemm.h"
#include "backend/cpu_features.h"
#include "common/clock.h"
#include "model/safetensors.h"
#include "model/synthetic.h"
#include "placement/plan.h"
#include "worker/item_matrix.h"

namespace failsafe {
namespace {

struct Product {
  std::string name;
  int n, k;
  bool nt;
  int items;  // nt: rows per blocked item; nn: k-values per fixed-point item
};

std::vector<Product> LayerProducts(const ModelConfig& c) {
  const int hd = c.head_dim, h = c.hidden_size;
  const int shard_width = PlanShape::ForModel(c).shard_width;
  return {{"qkv", c.num_kv_heads * (c.group_size() + 2) * hd, h, true, hd},
          {"o", h, c.q_dim(), false, hd},
          {"gate_up", 2 * c.intermediate_size, h, true, 2 * shard_width},
          {"down", h, c.intermediate_size, false, shard_width}};
}

}  // namespace
}  // namespace failsafe

int main(int argc, char** argv) {
  using namespace failsafe;
  CLI::App app{"FailSafe GEMM benchmark: one layer's linear products"};
  std::string preset = "1b-llama";
  std::vector<int> rows = {1, 16}, thread_counts = {1, 2};
  std::vector<std::string> dtype_names = {"f32", "bf16"}, products;
  int copies = 8, reps = 5;
  bool plain = false;
  app.add_option("--preset", preset, "synthetic preset whose shapes to take")
      ->capture_default_str();
  app.add_option("--rows", rows, "rows of x (tokens)")->delimiter(',');
  app.add_option("--threads", thread_counts, "thread counts")->delimiter(',');
  app.add_option("--dtypes", dtype_names, "weight types: f32, bf16, f16")->delimiter(',');
  app.add_option("--products", products, "of qkv, o, gate_up, down (default: all)")->delimiter(',');
  app.add_option("--copies", copies, "copies of each weight, read in turn")->capture_default_str();
  app.add_option("--reps", reps, "passes; the best is printed")->capture_default_str();
  app.add_flag("--plain", plain, "o and down as plain products (one item), not fixed-point items");
  bool row_major_nn = false;
  app.add_flag("--row-major-nn", row_major_nn,
               "o and down row-major even where the engine holds them column-blocked");
  std::string bf16_products = "auto";
  app.add_option("--bf16-products", bf16_products,
                 "bf16 weights' products: auto (the engine's choice), dpbf16 (vdpbf16ps wherever "
                 "it computes the chain) or fma")
      ->check(CLI::IsMember({"auto", "dpbf16", "fma"}))
      ->capture_default_str();
  std::string isa_name;
  app.add_option("--isa", isa_name, "force the kernels' level: avx512, avx2 or generic");
  CLI11_PARSE(app, argc, argv);
  std::optional<CpuIsa> isa;
  if (!isa_name.empty()) {
    isa = ParseCpuIsa(isa_name);
    if (!isa) {
      std::fprintf(stderr, "error: --isa must be avx512, avx2 or generic, not '%s'\n",
                   isa_name.c_str());
      return 1;
    }
  }
  const std::optional<bool> dpbf16 = bf16_products == "fma"      ? std::optional<bool>(false)
                                     : bf16_products == "dpbf16" ? std::optional<bool>(true)
                                                                 : std::nullopt;

  auto cfg = SyntheticPresetConfig(preset);
  if (!cfg.ok()) {
    std::fprintf(stderr, "error: %s\n", cfg.status().ToString().c_str());
    return 1;
  }
  std::vector<DType> dtypes;
  for (const std::string& d : dtype_names) {
    if (d == "f32") {
      dtypes.push_back(DType::kF32);
    } else if (d == "bf16") {
      dtypes.push_back(DType::kBF16);
    } else if (d == "f16") {
      dtypes.push_back(DType::kF16);
    } else {
      std::fprintf(stderr, "error: unknown dtype %s\n", d.c_str());
      return 1;
    }
  }
  const CpuFeatures& f = HostCpuFeatures();
  const CpuIsa level = cpu::GemmIsaFor(isa);
  std::printf("cpu: %s\nkernel: %s", f.model.c_str(), CpuIsaName(level));
  if (cpu::GemmDpbf16For(level) && cpu::GemmDpbf16TilesFor(level)) {
    std::printf(" (bf16 products: vdpbf16ps)");
  } else if (cpu::GemmDpbf16For(level)) {
    std::printf(
        " (bf16 products by default: vdpbf16ps in decode and plain products of up to %d rows, "
        "fma in other tiles)",
        cpu::kDpbf16Rows);
  }
  std::printf("\n");
  std::printf("%-8s %-5s %5s %7s %9s %9s\n", "product", "dtype", "rows", "threads", "GB/s",
              "GFLOP/s");

  const int max_rows = *std::max_element(rows.begin(), rows.end());
  for (const Product& p : LayerProducts(*cfg)) {
    if (!products.empty() && std::find(products.begin(), products.end(), p.name) == products.end())
      continue;
    const int64_t elements = static_cast<int64_t>(p.n) * p.k;
    std::vector<float> x(static_cast<size_t>(max_rows) * p.k, 0.01f);
    std::vector<float> y(static_cast<size_t>(max_rows) * p.n);
    std::vector<int64_t> acc(static_cast<size_t>(max_rows) * p.n);
    for (DType dtype : dtypes) {
      const int64_t bytes = elements * static_cast<int64_t>(DTypeSize(dtype));
      const bool column_blocked = !p.nt && !row_major_nn && [&] {
        CpuBackendOptions o;
        o.isa = isa;
        o.dpbf16 = dpbf16;
        return MakeCpuBackend(o)->ColumnBlockedNN(dtype);
      }();
      // Every weight equal (0.25 in every type): the layout changes how
      // they are read, not y. Huge pages, as the engine holds weights.
      AlignedFloats w(static_cast<size_t>(copies * bytes / 4));
      if (dtype == DType::kF32) {
        std::fill(w.data, w.data + w.size, 0.25f);
      } else {
        const uint16_t q = dtype == DType::kBF16 ? 0x3e80 : 0x3400;
        auto* h = reinterpret_cast<uint16_t*>(w.data);
        std::fill(h, h + 2 * w.size, q);
      }
      for (int m : rows) {
        for (int threads : thread_counts) {
          double best = 1e30;
          for (int r = 0; r < reps; ++r) {
            const int64_t t0 = MonotonicNanos();
            for (int c = 0; c < copies; ++c) {
              cpu::GemmArgs a;
              a.x = x.data();
              a.ldx = p.k;
              a.w = reinterpret_cast<const char*>(w.data) + c * bytes;
              a.wtype = dtype;
              a.nt = p.nt;
              a.m = m;
              a.n = p.n;
              a.k = p.k;
              a.threads = threads;
              a.dpbf16 = dpbf16;
              a.isa = isa;
              if (p.nt) {
                a.ldw = p.k;
                a.w_blocked16 = true;
                a.w_item_rows = p.items;
              } else if (plain && column_blocked) {  // the blocked [n, k] weight that is
                a.nt = true;
                a.ldw = p.k;
                a.w_blocked16 = true;
                a.w_item_rows = p.n;
              } else {
                a.ldw = p.n;
              }
              if (p.nt || plain) {
                a.y = y.data();
                a.ldy = p.n;
              } else {
                a.out = cpu::GemmOut::kFixedItems;
                a.acc = acc.data();
                a.ldacc = p.n;
                a.item_k = p.items;
                a.w_blocked16 = column_blocked;
              }
              cpu::Gemm(a);
            }
            best = std::min(best, (MonotonicNanos() - t0) * 1e-9);
          }
          std::printf("%-8s %-5s %5d %7d %9.1f %9.1f\n", p.name.c_str(), DTypeName(dtype), m,
                      threads, copies * bytes / best * 1e-9,
                      copies * 2.0 * m * elements / best * 1e-9);
          std::fflush(stdout);
        }
      }
    }
  }
  return 0;
}
