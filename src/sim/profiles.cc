#include "sim/profiles.h"

#include "model/published.h"
#include "model/synthetic.h"

namespace failsafe {

namespace {

// The coordinator's re-planning, measured on this project's 2-core build
// machine (failsafe_bench_replan, CPU time of the engine's Recover on the
// simulated executor at 8 devices -> 7, two runs): 3.3-4.1 ms for
// Llama-3.1-70B's plan (15,424 items) with no sequence running, 43-45.5 ms
// with 256 (640 KV slots each; modelled 3.2 and 45.8 ms); 12.3 ms for
// Mixtral-8x22B's plan (60,096 items; modelled 12.6 ms) and 43-51 ms with
// 256 running (448 slots each; modelled 42.4 ms). The coordinator is a host
// CPU in both profiles.
void SetReplanCost(HardwareProfile* p) {
  p->replan_per_item_s = 0.21e-6;
  p->replan_per_seq_slot_s = 0.26e-6;
}

}  // namespace

Result<HardwareProfile> GetHardwareProfile(const std::string& name) {
  HardwareProfile p;
  p.name = name;
  if (name == "h100-sxm-80gb") {
    // NVIDIA H100 SXM5 80 GB datasheet: 989.4 TFLOP/s dense BF16 tensor core,
    // 3.35 TB/s HBM3, 80 GB; NVLink 4: 900 GB/s bidirectional per GPU, so
    // about 450 GB/s per direction; PCIe Gen5 x16: 64 GB/s raw per direction,
    // about 55 GB/s usable.
    p.peak_flops = 989.4e12;
    p.hbm_bytes_per_s = 3.35e12;
    p.hbm_bytes = 80e9;
    p.nvlink_bytes_per_s = 450e9;
    p.pcie_bytes_per_s = 55e9;
    // Typical achieved fractions for LLM serving kernels (GEMM model FLOPs
    // utilisation in prefill, FlashAttention efficiency, decode bandwidth).
    p.gemm_efficiency = 0.6;
    p.attention_efficiency = 0.4;
    p.bandwidth_efficiency = 0.8;
    p.collective_latency_s = 15e-6;  // NCCL all-reduce latency within a node
    p.step_overhead_s = 2e-3;        // per-step CPU scheduling and launch overhead
    p.memory_utilization = 0.9;
    p.bytes_per_element = 2;
    p.failure_detect_s = 0.01;
    // A DGX H100 has 2 TB of host memory: half of it for the KV backup,
    // about three times the eight devices' KV pools with a 70B model.
    p.host_backup_bytes = int64_t{1} << 40;
    SetReplanCost(&p);
    return p;
  }
  if (name == "cpu") {
    // One core of this machine per device, fp32, fitted on the engine's own
    // measurements (`failsafe simulate validate` refits and reports them):
    // the device's compute time per step as measured by the workers.
    p.peak_flops = 100e9;  // OpenBLAS SGEMM, one thread (failsafe_bench_engine)
    p.gemm_efficiency = 0.9;
    p.attention_efficiency = 0.35;
    p.hbm_bytes_per_s = 30e9;  // streaming read, one thread
    p.bandwidth_efficiency = 0.85;
    // Up to four rows the engine streams the weights (backend/cpu/linear.cc).
    p.gemv_max_rows = 4;
    p.gemv_efficiency = 0.2;
    p.hbm_bytes = 1e12;
    p.nvlink_bytes_per_s = 1e12;  // emulated time excludes collectives
    p.pcie_bytes_per_s = 5e9;
    p.collective_latency_s = 0;
    p.step_overhead_s = 0;
    p.memory_utilization = 1.0;
    p.bytes_per_element = 4;
    SetReplanCost(&p);
    return p;
  }
  return InvalidArgument("unknown hardware profile '{}' (known: h100-sxm-80gb, cpu)", name);
}

Result<ModelConfig> GetModelProfile(const std::string& name) {
  auto published = PublishedModelConfig(name);
  if (published.ok()) return published;
  auto synthetic = SyntheticPresetConfig(name);
  if (synthetic.ok()) return synthetic;
  return InvalidArgument(
      "unknown model '{}' (known: llama-3.1-70b, mixtral-8x22b, or a synthetic preset)", name);
}

double ColdStartS(const ModelConfig& model, const HardwareProfile& hw, int devices) {
  if (devices <= 0) return 0.0;
  return static_cast<double>(model.NumParameters()) * hw.bytes_per_element / devices /
         hw.pcie_bytes_per_s;
}

}  // namespace failsafe
