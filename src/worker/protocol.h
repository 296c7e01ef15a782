// Messages between the coordinator and a worker (one device) over a Channel.
// Every request gets exactly one reply: a status, then op-specific fields.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/wire.h"
#include "worker/device_model.h"
#include "worker/step.h"

namespace failsafe {

enum class WorkerOp : uint32_t {
  kInit = 1,       // WorkerInit; fds: [logits region, progress region, (KV backup region)]
  kLoadPlan = 2,   // plan JSON: load this device's share from the host weights
  kJoinGroup = 3,  // GroupSpec; fds: [shm comm region] or, for gloo, [its abort signal]
  kStep = 4,       // StepBatch -> ForwardStats
  kFreeSeqs = 5,   // sequence ids
  kPing = 6,
  kShutdown = 7,
  kDrainBackup = 8,  // wait until the host backup holds every finished step
  kApplyPlan = 9,    // ApplyPlanRequest -> ApplyStats
  kSetSpeed = 10,    // double in (0, 1]: the device's compute speed (DeviceModel::SetComputeSpeed)
  kReply = 100,
};

// The version of these messages: a worker refuses a coordinator that speaks
// another (a stale binary), rather than misreading its steps.
// 2: block tables travel with steps and plan changes (KvTableUpdate,
// SeqRestore::pages).
// 3: runs of table entries say which leading blocks are shared cached pages
// (KvBlockRun::shared_blocks).
// 4: a step's backup copy may start before its first position
// (StepSeq::backup_from).
// 5: a step may copy a sequence's blocks from the host backup into its pages
// before computing (StepSeq::host_blocks: host-tier prefix hits).
// 6: a plan change's restores name shared cached blocks
// (SeqRestore::shared_blocks) and start past those an earlier sequence
// restores (SeqRestore::restore_from).
// 7: a device may run on a GPU (WorkerInit::gpu, gpu_gemm, gpu_graphs).
// 8: KV pages may hold bf16 (WorkerInit::kv_dtype, BackupHeader::kv_dtype);
// a GPU device may attend on tensor cores (WorkerInit::gpu_attention).
// 9: devices may all-reduce from one another's memory
// (WorkerInit::peer_collectives).
// 10: a GPU device may launch kernels with programmatic dependent launch
// (WorkerInit::gpu_dependent_launch).
constexpr int32_t kWorkerProtocolVersion = 10;

// kInit carries the logits region, the device progress region and, if the
// coordinator keeps a host KV backup, the backup region.
struct WorkerInit {
  int32_t protocol_version = kWorkerProtocolVersion;
  std::string model_dir;
  int32_t device_id = 0;
  int32_t threads = 1;
  int32_t block_size = 16;
  int64_t kv_pages = 0;
  int64_t logits_rows = 0;  // rows of the shared logits region
  int32_t gpu = -1;         // CUDA device of the CUDA backend; -1: the CPU backend
  int32_t gpu_gemm = 0;     // GpuGemm
  uint8_t gpu_graphs = 0;   // CudaBackendOptions::graphs
  int32_t kv_dtype = static_cast<int32_t>(DType::kF32);  // of the KV pages: f32 or bf16
  int32_t gpu_attention = 0;                             // GpuAttention
  uint8_t peer_collectives = 0;                          // DeviceOptions::peer_collectives
  uint8_t gpu_dependent_launch = 0;                      // CudaBackendOptions::dependent_launch

  void Encode(WireWriter* w) const;
  bool Decode(WireReader* r);
};

enum class CommKind : int32_t { kShm = 0, kGloo = 1 };

struct GroupSpec {
  CommKind kind = CommKind::kShm;
  int32_t rank = 0;
  int32_t size = 1;
  int64_t timeout_ms = 60000;
  // gloo only
  std::string store_host;
  int32_t store_port = 0;
  std::string prefix;
  std::string hostname;

  void Encode(WireWriter* w) const;
  bool Decode(WireReader* r);
};

// For one device: its own block tables.
struct ApplyPlanRequest {
  std::string prev_plan_json, next_plan_json;
  int32_t mode = 0;  // RecoveryMode
  std::vector<SeqRestore> seqs;

  void Encode(WireWriter* w) const;
  bool Decode(WireReader* r);
};

void EncodeApplyStats(const ApplyStats& s, WireWriter* w);
bool DecodeApplyStats(WireReader* r, ApplyStats* s);

// A step as `device` receives it: everything but the other devices' block
// tables. Decoding puts the tables at b->kv[device].
void EncodeBatch(const StepBatch& b, int device, WireWriter* w);
bool DecodeBatch(WireReader* r, int device, StepBatch* b);
void EncodeStats(const ForwardStats& s, WireWriter* w);
bool DecodeStats(WireReader* r, ForwardStats* s);

// A reply: status first, then op-specific fields.
std::string EncodeReply(const Status& st, const std::string& body = {});
// Splits a reply into its status and body.
Status DecodeReply(const std::string& payload, std::string* body);

}  // namespace failsafe
