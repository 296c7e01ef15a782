// All-reduces of device memory among device processes that map one
// another's memory (Backend::AllocatePeerMemory: CUDA's virtual memory API
// or CUDA IPC between the processes sharing a GPU, a memfd between CPU
// devices), rather than staging each partial sum through the host.
//
// Each member owns three slots of peer memory: two for its contributions
// (alternating, as ShmCommunicator's) and one for its piece of a large
// result. A chunk of an all-reduce is: copy this member's part into its
// slot, wait for the device, meet the group at the communicator's Barrier
// (its deadline, its abort, its progress records), then sum. A small chunk
// every member sums whole from every slot; a large one each member sums
// its piece into its result slot, the group meets again, and each copies
// every piece from its owner. Nothing on the device waits for a peer: a
// peer that dies or hangs leaves the survivors at the barrier, which fails
// by its deadline or by the group's abort as every collective does.
//
// Why two slots are enough: a member's second barrier after writing a slot
// comes after its device finished the sums that read the first (it waits
// for its device before each barrier), so by the time a slot is written
// again every peer's reads of it are done.
//
// The sums are the communicator's own, bit for bit: floats added in rank
// order, fixed-point partial sums wrapping.
//
// A member killed while the others read its slots: its memory stays theirs
// where the backend shares it by a descriptor they hold (a memfd; on a GPU
// CUDA's virtual memory API, the default). With CUDA IPC (where that API is
// missing) reading it then is undefined by CUDA's documentation; the GPU
// check's peer-memory stage measures both.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "comm/communicator.h"
#include "comm/shm_communicator.h"
#include "common/status.h"

namespace failsafe {

class PeerReducer {
 public:
  // Each slot's bytes: a step's all-reduce larger than this goes in chunks.
  static constexpr size_t kDefaultSlotBytes = 16u << 20;
  // A chunk whose traffic (bytes x members) is above this goes as
  // reduce-scatter + all-gather (each member reads each byte of the group's
  // once, not once per member), as ShmCommunicator's.
  static constexpr size_t kDefaultScatterBytes = ShmCommunicator::kScatterThresholdBytes;
  // The device memory a member holds for it (three slots), which a device
  // budget sets aside.
  static constexpr size_t kMemoryBytes = 3 * kDefaultSlotBytes;

  explicit PeerReducer(Backend* backend, size_t slot_bytes = kDefaultSlotBytes,
                       size_t scatter_bytes = kDefaultScatterBytes);
  ~PeerReducer();
  PeerReducer(const PeerReducer&) = delete;
  PeerReducer& operator=(const PeerReducer&) = delete;

  // Whether `comm`'s members read one another's memory: set up at the first
  // call for each communicator, a collective (every member calls it at the
  // same point, in its first all-reduce on a new group). False, the same on
  // every member, where any member cannot share or map memory (another
  // host, another kind of device): the caller stages through the host. An
  // error where the group failed meanwhile. A group of one has nothing to
  // set up: false, and the mappings of earlier groups are let go.
  Result<bool> Ready(Communicator& comm);
  // data[i] = the sum over the group's members of their data[i], i < count,
  // in device memory. Only after Ready(comm) said true.
  Status AllReduceSum(Communicator& comm, float* data, size_t count);
  Status AllReduceSum(Communicator& comm, int64_t* data, size_t count);

  // Whether the last group set up reads its members' memory.
  bool ready() const { return ready_; }
  // The last setup that found no way to share: why (for the log).
  const std::string& why_not() const { return why_not_; }

 private:
  Status SetUp(Communicator& comm, bool* ready);
  template <typename T>
  Status Reduce(Communicator& comm, T* data, size_t count);
  char* Slot(int member, int slot) const {
    return static_cast<char*>(member_base_[static_cast<size_t>(member)]) +
           static_cast<size_t>(slot) * slot_bytes_;
  }
  void CloseUnused(const std::vector<std::string>& keep);

  Backend* const backend_;
  const size_t slot_bytes_;
  const size_t scatter_bytes_;
  Backend::PeerMemory own_;              // three slots, kept across groups
  std::map<std::string, void*> opened_;  // peers' memory by handle, kept across groups
  uint64_t serial_ = 0;                  // the communicator set up for (0: none)
  bool ready_ = false;                   // for that communicator
  std::vector<void*> member_base_;       // by rank: own_.data or a peer's
  uint64_t ops_ = 0;                     // chunks done: selects the contribution slot
  std::string why_not_;
};

}  // namespace failsafe
