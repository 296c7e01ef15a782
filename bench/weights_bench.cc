// The host's part of loading a device's weights into memory the host does
// not address (a GPU's): the items of one Llama-3.1-8B-shaped bf16 layer,
// as a device holding the whole layer takes them (q and k/v items and
// gate/up shards as rows, o and down items transposed, as the CUDA backend
// holds them), staged on the host and copied in. Side by side in one run:
// each item read as f32 and laid out (the way any checkpoint loads), and
// copied as the checkpoint stores it (ItemMatrix::RawSource, where its
// type is the device's). The same bytes either way (checked). A program
// that prints figures; the weights are random, made in memory.
//
//   failsafe_bench_weights [--runs 3]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <new>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/staged_memory.h"
#include "common/rng.h"
#include "model/safetensors.h"
#include "worker/item_matrix.h"

using namespace failsafe;

namespace {

// A bf16 tensor of random values, held in memory as a checkpoint holds it.
struct Tensor {
  Tensor(const std::string& name, int64_t rows, int64_t cols, uint64_t seed) {
    info.name = name;
    info.dtype = DType::kBF16;
    info.shape = {rows, cols};
    bytes.resize(static_cast<size_t>(rows * cols));
    Rng r(seed);
    for (auto& b : bytes) b = FloatToBFloat16(static_cast<float>(r.Normal() * 0.02));
  }
  TensorRef Ref() const {
    return TensorRef{&info, reinterpret_cast<const unsigned char*>(bytes.data()), nullptr};
  }
  TensorInfo info;
  std::vector<uint16_t> bytes;
};

// The items of a product whose rows stack `rows` rows of `a` over the same
// of `b` (k/v's, gate/up's): read as f32, and copied as stored.
std::function<void(int, float*)> StackedRows(const Tensor& a, const Tensor& b, int rows) {
  return [&a, &b, rows](int i, float* d) {
    a.Ref().ReadRows(int64_t{i} * rows, rows, d);
    b.Ref().ReadRows(int64_t{i} * rows, rows, d + int64_t{rows} * a.info.shape[1]);
  };
}
std::function<bool(int, unsigned char*)> StackedCopy(const Tensor& a, const Tensor& b, int rows) {
  return [&a, &b, rows](int i, unsigned char* d) {
    return a.Ref().CopyRows(int64_t{i} * rows, rows, DType::kBF16, d) &&
           b.Ref().CopyRows(int64_t{i} * rows, rows, DType::kBF16,
                            d + int64_t{rows} * a.info.shape[1] * int64_t{sizeof(uint16_t)});
  };
}

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

}  // namespace

int main(int argc, char** argv) {
  int runs = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::string(argv[i]) == "--runs") runs = std::max(1, std::atoi(argv[i + 1]));
  }
  const int hidden = 4096, hd = 128, heads = 32, kv_heads = 8, inter = 14336, width = 112;
  const Tensor q("q", heads * hd, hidden, 1), k("k", kv_heads * hd, hidden, 2),
      v("v", kv_heads * hd, hidden, 3), o("o", hidden, heads * hd, 4),
      gate("gate", inter, hidden, 5), up("up", inter, hidden, 6), down("down", hidden, inter, 7);
  const int shards = inter / width;
  StagedMemory staged(size_t{640} << 20);
  struct Family {
    const char* name;
    int rows, items;
    ItemLayout layout;
    std::function<void(int, float*)> fill;
    std::function<bool(int, unsigned char*)> copy;
  };
  const DType dt = DType::kBF16;
  const int64_t es = 2;
  const std::vector<Family> families = {
      {"q", hd, heads, ItemLayout::kRowMajor,
       [&](int i, float* d) { q.Ref().ReadRows(int64_t{i} * hd, hd, d); },
       [&](int i, unsigned char* d) { return q.Ref().CopyRows(int64_t{i} * hd, hd, dt, d); }},
      {"k/v", 2 * hd, kv_heads, ItemLayout::kRowMajor, StackedRows(k, v, hd),
       StackedCopy(k, v, hd)},
      {"o", hd, heads, ItemLayout::kTransposed,
       [&](int i, float* d) { o.Ref().ReadColsTransposed(int64_t{i} * hd, hd, d); },
       [&](int i, unsigned char* d) { return o.Ref().CopyCols(int64_t{i} * hd, hd, dt, d); }},
      {"gate/up", 2 * width, shards, ItemLayout::kRowMajor, StackedRows(gate, up, width),
       StackedCopy(gate, up, width)},
      {"down", width, shards, ItemLayout::kTransposed,
       [&](int i, float* d) { down.Ref().ReadColsTransposed(int64_t{i} * width, width, d); },
       [&](int i, unsigned char* d) {
         return down.Ref().CopyCols(int64_t{i} * width, width, dt, d);
       }},
  };
  std::printf(
      "one Llama-3.1-8B-shaped bf16 layer's items staged for device memory, %d threads, "
      "median of %d runs\n",
      omp_get_max_threads(), runs);
  std::printf("%-8s %9s %12s %12s %7s\n", "family", "MB", "via f32 ms", "copied ms", "ratio");
  double total_f32 = 0, total_copy = 0, total_mb = 0;
  for (const Family& f : families) {
    std::vector<double> via, copied;
    bool same = true;
    for (int r = 0; r < runs; ++r) {
      staged.Reset();
      ItemMatrix a(f.rows, hidden, dt, f.layout, &staged), b(f.rows, hidden, dt, f.layout, &staged);
      auto t0 = std::chrono::steady_clock::now();
      a.Add(0, f.items, f.fill, true);
      via.push_back(Seconds(t0));
      t0 = std::chrono::steady_clock::now();
      b.Add(0, f.items, f.fill, true, {f.layout, f.copy});
      copied.push_back(Seconds(t0));
      same = same && std::memcmp(a.segments()[0].data, b.segments()[0].data,
                                 static_cast<size_t>(a.bytes())) == 0;
      if (r == 0) total_mb += a.bytes() / 1e6;
    }
    std::sort(via.begin(), via.end());
    std::sort(copied.begin(), copied.end());
    const double mb = static_cast<double>(f.items) * f.rows * hidden * es / 1e6;
    const double a = via[via.size() / 2] * 1e3, b = copied[copied.size() / 2] * 1e3;
    total_f32 += a;
    total_copy += b;
    std::printf("%-8s %9.1f %12.1f %12.1f %6.1fx%s\n", f.name, mb, a, b, a / b,
                same ? "" : "  (BYTES DIFFER)");
    if (!same) return 1;
  }
  std::printf("%-8s %9.1f %12.1f %12.1f %6.1fx\n", "layer", total_mb, total_f32, total_copy,
              total_f32 / total_copy);
  return 0;
}
