// Copies the KV a device writes into the host backup, on a background thread
// overlapped with the device's compute.
//
// After a step, the compute thread hands over, per request, the page pointers
// of every slot it wrote and the backup blocks they go to; the writer copies
// them and then publishes the request's progress. Pages stay valid until the
// compute thread frees or truncates KV, which it does only after Drain().
//
// Thread-safety: Enqueue and Drain from the compute thread only.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "worker/device_progress.h"
#include "worker/kv_backup_layout.h"

namespace failsafe {

struct BackupJob {
  int64_t seq_id = 0;
  int slot = 0;   // progress slot
  int start = 0;  // positions [start, end) were written
  int end = 0;
  struct Copy {
    const char* page;  // device page holding the positions' K then V (device memory)
    char* dst;         // backup slot of the same logical block
    int from, to;      // positions within the block
  };
  std::vector<Copy> copies;
};

class BackupWriter {
 public:
  // `progress` (optional): the device's progress slot, moved after every
  // job, so that a device busy draining its backup is seen to be alive.
  // Pages are read through `memory` (the device's backend:
  // BackgroundCopyToHost).
  BackupWriter(void* base, const BackupLayout& layout, int device,
               DeviceProgressSlot* progress = nullptr, DeviceMemory* memory = &HostMemory());
  ~BackupWriter();
  // Called on the writer's thread after each job is copied and published (a
  // device on another host sends the bytes to the coordinator). Set before
  // the first Enqueue.
  void SetUploader(std::function<void(const BackupJob&)> uploader);
  void Enqueue(BackupJob job);
  // Waits until every queued job is copied and published.
  void Drain();
  int64_t bytes_copied() const { return bytes_copied_; }

 private:
  void Run();
  void* const base_;
  const BackupLayout layout_;
  const int device_;
  DeviceProgressSlot* const progress_;
  DeviceMemory* const memory_;
  std::function<void(const BackupJob&)> uploader_;  // set before the first job
  std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  std::deque<BackupJob> queue_;                 // guarded by mu_
  bool busy_ = false;                           // guarded by mu_
  bool stop_ = false;                           // guarded by mu_
  int64_t bytes_copied_ = 0;                    // written by the writer thread, read after Drain
  std::vector<DeviceMemory::HostCopy> copies_;  // the writer thread's, a job's
  std::thread thread_;
};

}  // namespace failsafe
