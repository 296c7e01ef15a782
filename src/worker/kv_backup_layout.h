// The host KV backup: a shared-memory region the coordinator creates and every
// device maps. It outlives any device.
//
// Its layout is keyed by (request, layer, head group, position), independent
// of the plan, so any head group can be restored onto any device:
//   header | progress table [max_seqs][num_devices] | blocks [num_blocks]
// A backup block holds block_size positions of one request for every
// (layer, head group): [layers][kv_heads][K, V][block_size][head_dim]
// elements of the KV pages' type (f32 or bf16: kv_dtype), copied as bytes.
// The coordinator assigns each request a progress slot and a backup block per
// logical block of its KV (or -1 when the budget is spent). A device, after
// copying a step's KV of a request into the backup, publishes in
// progress[slot][device] how many positions of that request it has backed up.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "model/safetensors.h"

namespace failsafe {

struct BackupProgress {
  std::atomic<int64_t> seq_id;
  std::atomic<int64_t>
      tokens;  // positions [0, tokens) of every slot the device writes are backed up
};

struct BackupHeader {
  uint64_t magic;
  int32_t num_layers, num_kv_heads, block_size, head_dim;
  int64_t num_blocks;
  int32_t max_seqs, num_devices;
  int32_t kv_dtype;  // DType of the elements: f32 or bf16
};

class BackupLayout {
 public:
  static constexpr uint64_t kMagic = 0x4653424b55503032ULL;  // "FSBKUP02"
  BackupLayout() = default;
  BackupLayout(int layers, int kv_heads, int block_size, int head_dim, int64_t num_blocks,
               int max_seqs, int num_devices, DType kv_dtype = DType::kF32)
      : h_{kMagic,     layers,      kv_heads,
           block_size, head_dim,    num_blocks,
           max_seqs,   num_devices, static_cast<int32_t>(kv_dtype)} {}
  explicit BackupLayout(const BackupHeader& h) : h_(h) {}

  const BackupHeader& header() const { return h_; }
  size_t header_bytes() const { return 4096; }
  size_t progress_bytes() const {
    return (static_cast<size_t>(h_.max_seqs) * h_.num_devices * sizeof(BackupProgress) + 4095) /
           4096 * 4096;
  }
  DType kv_dtype() const { return static_cast<DType>(h_.kv_dtype); }
  int elem_bytes() const { return static_cast<int>(DTypeSize(kv_dtype())); }
  // One (layer, head) of a block: K then V, block_size rows of head_dim.
  int64_t slot_bytes() const { return 2LL * h_.block_size * h_.head_dim * elem_bytes(); }
  int64_t block_bytes() const { return slot_bytes() * h_.num_layers * h_.num_kv_heads; }
  size_t total_bytes() const {
    return header_bytes() + progress_bytes() + static_cast<size_t>(h_.num_blocks) * block_bytes();
  }
  BackupProgress* Progress(void* base, int slot, int device) const {
    auto* table = reinterpret_cast<BackupProgress*>(static_cast<char*>(base) + header_bytes());
    return table + static_cast<size_t>(slot) * h_.num_devices + device;
  }
  // K [block_size, head_dim] then V of one (layer, head) in a backup block.
  char* Slot(void* base, int64_t block, int layer, int head) const {
    char* blocks = static_cast<char*>(base) + header_bytes() + progress_bytes();
    return blocks + block * block_bytes() +
           (static_cast<int64_t>(layer) * h_.num_kv_heads + head) * slot_bytes();
  }

 private:
  BackupHeader h_{};
};

}  // namespace failsafe
