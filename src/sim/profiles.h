// Hardware and model profiles for the simulator. Every constant is here, with
// its source.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "model/config.h"

namespace failsafe {

struct HardwareProfile {
  std::string name;
  double peak_flops = 0;          // dense GEMM, the serving dtype, per device (FLOP/s)
  double hbm_bytes_per_s = 0;     // device memory bandwidth
  double hbm_bytes = 0;           // device memory
  double nvlink_bytes_per_s = 0;  // device-to-device, one direction
  double pcie_bytes_per_s = 0;    // host-to-device, usable
  // Achieved fractions (roofline efficiencies).
  double gemm_efficiency = 0.6;       // of peak, for compute-bound GEMMs
  double attention_efficiency = 0.4;  // of peak, prefill attention
  double bandwidth_efficiency = 0.8;  // of HBM, memory-bound kernels
  // GEMMs of at most this many rows stream their weights (a GEMV kernel,
  // bandwidth-bound); larger ones run at gemm_efficiency x m / (m +
  // gemm_half_rows) of peak (the rows at which half of it is reached).
  int gemv_max_rows = 0;
  double gemm_half_rows = 0;
  // Streamed GEMMs' compute rate, as a fraction of peak (0: bandwidth only).
  double gemv_efficiency = 0;
  double segment_overhead_s =
      0;  // per sync segment (two per layer): small kernels, synchronisation
  double collective_latency_s = 10e-6;  // per all-reduce, on top of bandwidth
  double step_overhead_s = 0;           // per step: launch and scheduling overhead
  double memory_utilization = 0.9;      // share of device memory the engine may use
  int bytes_per_element = 2;            // weights and KV (bf16)
  double failure_detect_s = 0.005;      // a failure to its detection
  // Host memory of a node (all its devices) given to the KV backup when it
  // is also the prefix cache's host tier (0: room for what the devices' KV
  // pools hold).
  int64_t host_backup_bytes = 0;
  // The coordinator's CPU time to re-plan (the engine's Recover up to the
  // devices' plan change: the plan, the scheduler's books moved to it, what
  // each sequence can restore): per item of the plan (a query head or an FFN
  // shard of a layer, a vocabulary chunk), and per running sequence and KV
  // slot (layer, head group) it weighs (seconds; ReplanSeconds).
  double replan_per_item_s = 0;
  double replan_per_seq_slot_s = 0;
};

// "h100-sxm-80gb" and "cpu" (this machine, see profiles.cc).
Result<HardwareProfile> GetHardwareProfile(const std::string& name);

// Seconds a new instance on `devices` devices spends loading the model's
// weights from host memory: each device its share, over its own PCIe link.
double ColdStartS(const ModelConfig& model, const HardwareProfile& hw, int devices);
// "llama-3.1-70b", "mixtral-8x22b", or a synthetic preset name.
Result<ModelConfig> GetModelProfile(const std::string& name);

}  // namespace failsafe
