// The engine on one GPU: decode at several batch sizes and a long prefill,
// beside the GPU's measured limits (a device-to-device copy for bandwidth, a
// large bf16 product through cuBLASLt for compute), and the host link's
// copy rates each way (what recovery's weight and KV copies ride on). A
// program that prints figures, not a test.
//
//   failsafe_bench_gpu --model DIR [--gpu 0] [--batches 1,16,64]
//                      [--prefill 2048] [--steps 24] [--gpu-gemm lt,fused]
//                      [--breakdown [--breakdown-waits]] [--json FILE]
//
// Each product mode loads the model anew. --breakdown then times every
// backend call of one decode step per batch size and of one prefill by
// device timestamps around it (or, --breakdown-waits, each call alone:
// bench/timed_backend.h), and prints where the time goes.
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <tuple>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/gemm_lt.h"
#include "backend/cuda/kernels.h"
#include "common/clock.h"
#include "engine/executor.h"
#include "engine/local_executor.h"
#include "engine_steps.h"
#include "model/config.h"
#include "model/weights.h"
#include "timed_backend.h"

using namespace failsafe;

namespace {

// Device-to-device copy of 2 GiB, bytes read plus bytes written per second.
double CopyBandwidth() {
  const size_t bytes = size_t{2} << 30;
  void *a = nullptr, *b = nullptr;
  FS_CUDA_CHECK(cudaMalloc(&a, bytes));
  FS_CUDA_CHECK(cudaMalloc(&b, bytes));
  FS_CUDA_CHECK(cudaMemset(a, 1, bytes));
  cudaEvent_t e0, e1;
  FS_CUDA_CHECK(cudaEventCreate(&e0));
  FS_CUDA_CHECK(cudaEventCreate(&e1));
  std::vector<double> rates;
  for (int rep = 0; rep < 12; ++rep) {
    FS_CUDA_CHECK(cudaEventRecord(e0));
    FS_CUDA_CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice));
    FS_CUDA_CHECK(cudaEventRecord(e1));
    FS_CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    FS_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    if (rep >= 2) rates.push_back(2.0 * bytes / (ms * 1e-3));
  }
  cudaFree(a);
  cudaFree(b);
  return bench::Median(rates);
}

// Host <-> device copies over the GPU's link to the host (PCIe), from and
// to 1 GiB of pinned host memory: host to device, device to host, and both
// at once on two streams (each direction's rate). The rates the cost
// model's `pcie_bytes_per_s` stands for (sim/profiles.cc).
struct HostLinkRates {
  double h2d = 0, d2h = 0, both_h2d = 0, both_d2h = 0;
};
HostLinkRates HostLinkBandwidth() {
  const size_t bytes = size_t{1} << 30;
  void *host_a = nullptr, *host_b = nullptr, *dev_a = nullptr, *dev_b = nullptr;
  FS_CUDA_CHECK(cudaMallocHost(&host_a, bytes));
  FS_CUDA_CHECK(cudaMallocHost(&host_b, bytes));
  FS_CUDA_CHECK(cudaMalloc(&dev_a, bytes));
  FS_CUDA_CHECK(cudaMalloc(&dev_b, bytes));
  std::memset(host_a, 1, bytes);
  FS_CUDA_CHECK(cudaMemset(dev_b, 2, bytes));
  cudaStream_t s[2];
  cudaEvent_t start[2], end[2];
  for (int i = 0; i < 2; ++i) {
    FS_CUDA_CHECK(cudaStreamCreate(&s[i]));
    FS_CUDA_CHECK(cudaEventCreate(&start[i]));
    FS_CUDA_CHECK(cudaEventCreate(&end[i]));
  }
  auto seconds = [&](int i) {
    float ms = 0;
    FS_CUDA_CHECK(cudaEventElapsedTime(&ms, start[i], end[i]));
    return ms * 1e-3;
  };
  std::vector<double> h2d, d2h, both_h2d, both_d2h;
  for (int rep = 0; rep < 6; ++rep) {
    // One direction at a time, then both together.
    FS_CUDA_CHECK(cudaEventRecord(start[0], s[0]));
    FS_CUDA_CHECK(cudaMemcpyAsync(dev_a, host_a, bytes, cudaMemcpyHostToDevice, s[0]));
    FS_CUDA_CHECK(cudaEventRecord(end[0], s[0]));
    FS_CUDA_CHECK(cudaEventSynchronize(end[0]));
    if (rep > 0) h2d.push_back(bytes / seconds(0));
    FS_CUDA_CHECK(cudaEventRecord(start[1], s[1]));
    FS_CUDA_CHECK(cudaMemcpyAsync(host_b, dev_b, bytes, cudaMemcpyDeviceToHost, s[1]));
    FS_CUDA_CHECK(cudaEventRecord(end[1], s[1]));
    FS_CUDA_CHECK(cudaEventSynchronize(end[1]));
    if (rep > 0) d2h.push_back(bytes / seconds(1));
    FS_CUDA_CHECK(cudaEventRecord(start[0], s[0]));
    FS_CUDA_CHECK(cudaEventRecord(start[1], s[1]));
    FS_CUDA_CHECK(cudaMemcpyAsync(dev_a, host_a, bytes, cudaMemcpyHostToDevice, s[0]));
    FS_CUDA_CHECK(cudaMemcpyAsync(host_b, dev_b, bytes, cudaMemcpyDeviceToHost, s[1]));
    FS_CUDA_CHECK(cudaEventRecord(end[0], s[0]));
    FS_CUDA_CHECK(cudaEventRecord(end[1], s[1]));
    FS_CUDA_CHECK(cudaEventSynchronize(end[0]));
    FS_CUDA_CHECK(cudaEventSynchronize(end[1]));
    if (rep > 0) {
      both_h2d.push_back(bytes / seconds(0));
      both_d2h.push_back(bytes / seconds(1));
    }
  }
  for (int i = 0; i < 2; ++i) {
    cudaEventDestroy(start[i]);
    cudaEventDestroy(end[i]);
    cudaStreamDestroy(s[i]);
  }
  cudaFreeHost(host_a);
  cudaFreeHost(host_b);
  cudaFree(dev_a);
  cudaFree(dev_b);
  return {bench::Median(h2d), bench::Median(d2h), bench::Median(both_h2d), bench::Median(both_d2h)};
}

// An 8192^3 bf16 product (f32 out) through the engine's cuBLASLt path, on
// random data: FLOP per second.
double MatmulRate() {
  const int n = 8192;
  cudaStream_t s;
  FS_CUDA_CHECK(cudaStreamCreate(&s));
  void *x = nullptr, *w = nullptr;
  float* d = nullptr;
  FS_CUDA_CHECK(cudaMalloc(&x, size_t{2} * n * n));
  FS_CUDA_CHECK(cudaMalloc(&w, size_t{2} * n * n));
  FS_CUDA_CHECK(cudaMalloc(&d, size_t{4} * n * n));
  cuda::FillRandom(x, cuda::WType::kBF16, int64_t{n} * n, 1, s);
  cuda::FillRandom(w, cuda::WType::kBF16, int64_t{n} * n, 2, s);
  double rate = 0;
  {
    cuda::LtGemm lt(s, /*pools=*/false);
    cuda::LtProblem p;
    p.x = x;
    p.ldx = n;
    p.w = w;
    p.ldw = n;
    p.d = d;
    p.ldd = n;
    p.m = p.n = p.k = n;
    FS_CHECK_MSG(lt.Run(p), "cuBLASLt runs no 8192^3 bf16 product");
    cudaEvent_t e0, e1;
    FS_CUDA_CHECK(cudaEventCreate(&e0));
    FS_CUDA_CHECK(cudaEventCreate(&e1));
    std::vector<double> rates;
    for (int rep = 0; rep < 10; ++rep) {
      FS_CUDA_CHECK(cudaEventRecord(e0, s));
      (void)lt.Run(p);
      FS_CUDA_CHECK(cudaEventRecord(e1, s));
      FS_CUDA_CHECK(cudaEventSynchronize(e1));
      float ms = 0;
      FS_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
      rates.push_back(2.0 * n * n * double(n) / (ms * 1e-3));
    }
    rate = bench::Median(rates);
  }
  cudaFree(x);
  cudaFree(w);
  cudaFree(d);
  cudaStreamDestroy(s);
  return rate;
}

// Weight bytes a decode step of `batch` tokens reads: all of a dense
// model's; of a MoE model's experts, those its tokens choose, expected
// under uniform routing (E (1 - (1 - k/E)^batch) of E).
double WeightBytesRead(double weights, const ModelConfig& c, int batch, int element_bytes) {
  if (!c.is_moe()) return weights;
  const double e = c.num_experts, k = c.experts_per_token;
  // One expert's gate, up and down in every layer.
  const double expert_bytes =
      3.0 * c.hidden_size * c.intermediate_size * element_bytes * c.num_layers;
  const double touched = e * (1 - std::pow(1 - k / e, batch));
  return weights - e * expert_bytes + touched * expert_bytes;
}

std::vector<int> ParseList(const std::string& s) {
  std::vector<int> out;
  size_t at = 0;
  while (at < s.size()) {
    size_t comma = s.find(',', at);
    if (comma == std::string::npos) comma = s.size();
    out.push_back(std::stoi(s.substr(at, comma - at)));
    at = comma + 1;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  // A line at a time, into a file too: a run stopped at its time limit keeps
  // the figures it printed.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  CLI::App app{"FailSafe on one GPU: decode and prefill beside the GPU's limits"};
  std::string model, batches = "1,16,64", gemm = "lt", json_out;
  int gpu = 0, prefill = 2048, steps = 24, context = 128;
  app.add_option("--model", model, "model directory (Hugging Face layout)")->required();
  app.add_option("--gpu", gpu, "CUDA device")->capture_default_str();
  app.add_option("--batches", batches, "decode batch sizes")->capture_default_str();
  app.add_option("--context", context, "prompt tokens of each decoding sequence")
      ->capture_default_str();
  app.add_option("--prefill", prefill, "prefill tokens (0: none)")->capture_default_str();
  app.add_option("--steps", steps, "decode steps timed per batch size")->capture_default_str();
  app.add_option("--gpu-gemm", gemm,
                 "product modes, each a run: lt, fused, chain, each with +graphs (CUDA graphs), "
                 "+tensor (attention on tensor cores), +segments (attention in segments), "
                 "+kvbf16 (a bf16 KV cache), +pdl (programmatic dependent launch)")
      ->capture_default_str();
  bool breakdown_on = false;
  app.add_flag("--breakdown", breakdown_on,
               "time each backend call of a step by device timestamps around it");
  bool breakdown_waits = false;
  app.add_flag("--breakdown-waits", breakdown_waits,
               "with --breakdown: time each call alone, waiting for the device before and after");
  app.add_option("--json", json_out, "also write the figures here");
  CLI11_PARSE(app, argc, argv);

  FS_CUDA_CHECK(cudaSetDevice(gpu));
  cudaDeviceProp prop{};
  FS_CUDA_CHECK(cudaGetDeviceProperties(&prop, gpu));
  const double bandwidth = CopyBandwidth();
  const double matmul = MatmulRate();
  const HostLinkRates link = HostLinkBandwidth();
  std::printf("GPU %d: %s, %d SMs, %.1f GiB\n", gpu, prop.name, prop.multiProcessorCount,
              prop.totalGlobalMem / double(1 << 30));
  std::printf("limits: copy %.0f GB/s (read + write), bf16 matmul 8192^3 %.0f TFLOP/s\n",
              bandwidth / 1e9, matmul / 1e12);
  std::printf(
      "host link (pinned, 1 GiB): host to device %.1f GB/s, device to host %.1f GB/s; both at "
      "once %.1f and %.1f GB/s\n",
      link.h2d / 1e9, link.d2h / 1e9, link.both_h2d / 1e9, link.both_d2h / 1e9);

  auto config = ModelConfig::Load(model);
  if (!config.ok()) {
    std::fprintf(stderr, "%s\n", config.status().ToString().c_str());
    return 1;
  }
  auto store = WeightStore::Open(model, *config);
  if (!store.ok()) {
    std::fprintf(stderr, "%s\n", store.status().ToString().c_str());
    return 1;
  }
  const double weight_bytes = static_cast<double>((*store)->FileBytes());
  const DType wtype = (*store)->MatrixDType();
  store->reset();
  // Bytes a decode step must read: every weight but the embedding table
  // (one row per token), plus the KV it attends to.
  const double embed_bytes = static_cast<double>(config->vocab_size) * config->hidden_size *
                             DTypeSize(wtype) * (config->tie_word_embeddings ? 0 : 1);

  nlohmann::json out = {{"gpu", prop.name},
                        {"copy_bandwidth", bandwidth},
                        {"matmul_flops", matmul},
                        {"host_to_device_bytes_per_s", link.h2d},
                        {"device_to_host_bytes_per_s", link.d2h},
                        {"both_host_to_device_bytes_per_s", link.both_h2d},
                        {"both_device_to_host_bytes_per_s", link.both_d2h},
                        {"weight_bytes", weight_bytes}};
  const std::vector<int> bs = ParseList(batches);
  const int max_batch = *std::max_element(bs.begin(), bs.end());
  const int64_t slots = static_cast<int64_t>(config->num_layers) * config->num_kv_heads;
  const int tokens = std::max(prefill, max_batch * (context + steps + 16));
  size_t at = 0;
  while (at < gemm.size()) {
    size_t comma = gemm.find(',', at);
    if (comma == std::string::npos) comma = gemm.size();
    const std::string mode = gemm.substr(at, comma - at);
    at = comma + 1;
    LocalExecutorOptions o;
    o.gpu = gpu;
    // A mode: lt, fused or chain, "+graphs" for CUDA graphs.
    const std::string products = mode.substr(0, mode.find('+'));
    o.gpu_gemm = products == "chain"   ? GpuGemm::kChain
                 : products == "fused" ? GpuGemm::kFused
                                       : GpuGemm::kLt;
    o.gpu_graphs = mode.find("+graphs") != std::string::npos;
    o.gpu_dependent_launch = mode.find("+pdl") != std::string::npos;
    o.gpu_attention = mode.find("+tensor") != std::string::npos     ? GpuAttention::kTensor
                      : mode.find("+segments") != std::string::npos ? GpuAttention::kSegments
                                                                    : GpuAttention::kCores;
    o.kv_dtype = mode.find("+kvbf16") != std::string::npos ? DType::kBF16 : DType::kF32;
    const double kv_token_bytes =
        2.0 * config->num_layers * config->num_kv_heads * config->head_dim * DTypeSize(*o.kv_dtype);
    o.kv_pages = slots * ((tokens + 15) / 16 + 2 * max_batch + 16);
    bench::TimedBackend* timed = nullptr;
    o.wrap_backend = [&](std::unique_ptr<Backend> b) {
      auto t = std::make_unique<bench::TimedBackend>(std::move(b));
      timed = t.get();
      if (breakdown_waits) timed->way = bench::TimedBackend::Way::kWaits;
      return std::unique_ptr<Backend>(std::move(t));
    };
    const int64_t t0 = MonotonicNanos();
    auto exec = LocalExecutor::Create(model, o);
    if (!exec.ok()) {
      std::fprintf(stderr, "%s\n", exec.status().ToString().c_str());
      return 1;
    }
    const double load_s = (MonotonicNanos() - t0) * 1e-9;
    std::printf("model: %s, %.2f GB of weights, loaded in %.1f s; products: %s\n", model.c_str(),
                weight_bytes / 1e9, load_s, mode.c_str());
    nlohmann::json& res = out["modes"][mode];
    std::printf("%-10s %10s %12s %12s %14s\n", "decode", "step ms", "tokens/s", "GB/s read",
                "of copy limit");
    // Prints the calls of `after` beyond those of `before`, longest first.
    using Entries = std::map<std::string, bench::TimedBackend::Entry>;
    auto breakdown = [&](const std::string& what, const Entries& before, const Entries& after) {
      int64_t total = 0;
      std::vector<std::tuple<int64_t, int64_t, std::string>> rows;
      for (const auto& [kind, e] : after) {
        auto it = before.find(kind);
        const int64_t ns = e.ns - (it == before.end() ? 0 : it->second.ns);
        const int64_t calls = e.calls - (it == before.end() ? 0 : it->second.calls);
        // Fewer calls or less time than one step less: noise of the
        // subtraction, not a call of the step.
        if (calls <= 0 || ns <= 0) continue;
        total += ns;
        rows.emplace_back(ns, calls, kind);
      }
      std::sort(rows.rbegin(), rows.rend());
      std::printf("  breakdown of %s, %s: %.3f ms in all:", what.c_str(),
                  breakdown_waits ? "each call alone" : "device timestamps", total * 1e-6);
      for (size_t i = 0; i < rows.size() && i < 12; ++i) {
        std::printf(" %s %.3f ms/%lld;", std::get<2>(rows[i]).c_str(), std::get<0>(rows[i]) * 1e-6,
                    static_cast<long long>(std::get<1>(rows[i])));
      }
      std::printf("\n");
    };
    for (int b : bs) {
      bench::RunDecode(**exec, b, 3, context);  // warm: first uses of each shape
      const bench::Decode d = bench::RunDecode(**exec, b, steps, context);
      const double bytes = WeightBytesRead(weight_bytes - embed_bytes, *config, b,
                                           static_cast<int>(DTypeSize(wtype))) +
                           b * (context + steps / 2.0) * kv_token_bytes;
      const double rate = bytes / d.step_s;
      std::printf("batch %-4d %10.3f %12.1f %12.0f %13.1f%%\n", b, d.step_s * 1e3, d.tokens_per_s,
                  rate / 1e9, 100 * rate / bandwidth);
      res["decode"].push_back({{"batch", b},
                               {"step_s", d.step_s},
                               {"tokens_per_s", d.tokens_per_s},
                               {"read_bytes_per_s", rate}});
      if (breakdown_on && !o.gpu_graphs) {  // two decode steps less one: one step
        timed->enabled = true;
        timed->Reset();
        bench::RunDecode(**exec, b, 1, context);
        timed->Collect();
        const Entries one = timed->entries();
        timed->Reset();
        bench::RunDecode(**exec, b, 2, context);
        timed->Collect();
        timed->enabled = false;
        breakdown("a decode step at batch " + std::to_string(b), one, timed->entries());
      }
    }
    if (prefill > 0) {
      double flops = 0;
      bench::RunPrefill(**exec, prefill, 1, &flops);  // warm
      const double s = bench::RunPrefill(**exec, prefill, 3, &flops);
      std::printf(
          "prefill %d tokens: %.1f ms, %.0f tokens/s, %.0f TFLOP/s (%.1f%% of the matmul "
          "limit)\n",
          prefill, s * 1e3, prefill / s, flops / s / 1e12, 100 * flops / s / matmul);
      res["prefill"] = {{"tokens", prefill}, {"s", s}, {"flops", flops}};
      if (breakdown_on && !o.gpu_graphs) {
        timed->enabled = true;
        timed->Reset();
        bench::RunPrefill(**exec, prefill, 1);
        timed->Collect();
        timed->enabled = false;
        breakdown("the prefill", {}, timed->entries());
      }
    }
    // Which kernels the backend chose for the shapes it ran.
    for (const std::string& line : timed ? timed->KernelChoices() : std::vector<std::string>()) {
      std::printf("  kernels: %s\n", line.c_str());
      res["kernels"].push_back(line);
    }
  }
  if (!json_out.empty()) std::ofstream(json_out) << out.dump(2) << "\n";
  return 0;
}
