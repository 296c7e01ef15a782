// How far each device has got, in shared memory: every device counts the
// requests it takes up and the collectives it enters and leaves, with the
// time of its latest move. The coordinator reads these to tell a hung device
// from the peers waiting for it: at a step's deadline, a device that has not
// moved for the whole deadline while a peer is further along (or done) is the
// one that hangs.
//
// The coordinator creates the region (one slot per device id) and resets a
// device's slot before starting its process; each device writes only its own
// slot. CLOCK_MONOTONIC is shared by every process of a host.
//
// Thread-safety: lock-free; one writer per slot, any number of readers.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string_view>

#include "comm/communicator.h"
#include "comm/shm_region.h"

namespace failsafe {

// A host's id: a hash of its address as text (an IPv4 address in IPv6 form
// as IPv4), never 0. The coordinator names a remote device's host by the
// address it joined from; a device names its collective peers' hosts by the
// addresses of its connections to them (comm/tcp.h PeerAddress).
uint64_t HostId(std::string_view address);

// The coordinator's host as the peer of a remote device whose link to it
// loses frames, seen from the coordinator's end (HostId never gives it: its
// ids are odd).
inline constexpr uint64_t kCoordinatorHostId = 2;

// How many peer hosts a device's progress slot tracks loss toward.
inline constexpr int kLossPeers = 8;

// How long ago a loss is still worth telling the coordinator over a link.
inline constexpr int64_t kLossHeardNs = 2000 * 1000000LL;

// A peer host toward which a device's connections lost frames lately: its
// host id and when (0: an empty entry).
struct LossPeerSlot {
  std::atomic<uint64_t> host;
  std::atomic<int64_t> last_ns;
};

struct LossPeer {
  uint64_t host = 0;
  int64_t last_ns = 0;
};

struct alignas(64) DeviceProgressSlot {
  std::atomic<uint64_t> requests;     // requests taken up (every op from the coordinator)
  std::atomic<uint64_t> entered;      // collectives entered
  std::atomic<uint64_t> left;         // collectives left (done, failed or aborted)
  std::atomic<int64_t> last_move_ns;  // the latest of those moves
  // A device on another host: when its counters were last heard (its link's
  // heartbeat); 0 for a local device, whose counters are always current.
  std::atomic<int64_t> heard_ns;
  // Its link's round trip (a heartbeat of the coordinator's echoed back), the
  // worst of the last 2 s, heartbeats' lateness counted; 0 until measured or
  // for a local device. How many round trips were measured.
  std::atomic<int64_t> link_rtt_ns;
  std::atomic<uint64_t> link_rtt_samples;
  // The host it is on (a hash of its address; 0: local or unknown): the
  // devices of one host reach the coordinator over one link.
  std::atomic<uint64_t> host;
  // The host id its collective peers know it by (the address it gives them
  // for the group: a local device's names the coordinator's host as remote
  // peers see it); 0 until it joins a group over TCP.
  std::atomic<uint64_t> alias;
  // The hosts its collective connections lost frames to lately (this host's
  // clock, a remote device's dated as heard).
  LossPeerSlot loss[kLossPeers];
};

// A point-in-time copy of a slot.
struct DeviceProgress {
  uint64_t requests = 0, entered = 0, left = 0;
  int64_t last_move_ns = 0;
  int64_t heard_ns = 0;     // 0: current (a local device)
  int64_t link_rtt_ns = 0;  // 0: not measured, or a local device
  uint64_t link_rtt_samples = 0;
  uint64_t host = 0;                        // 0: local or unknown
  uint64_t alias = 0;                       // 0: not said
  std::array<LossPeer, kLossPeers> loss{};  // entries with host 0 are empty
  bool in_collective() const { return entered > left; }
};

class DeviceProgressRegion {
 public:
  static Result<DeviceProgressRegion> Create(int num_devices);
  // Maps a region from its fd (takes ownership of the fd).
  static Result<DeviceProgressRegion> Map(int fd);

  DeviceProgressRegion() = default;
  bool valid() const { return region_.valid(); }
  int fd() const { return region_.fd(); }
  int num_devices() const;
  // nullptr for an id outside the region.
  DeviceProgressSlot* slot(int device) const;
  DeviceProgress Read(int device) const;
  void Reset(int device);
  // The device's own moves (a null slot is ignored): it took up a request;
  // it did a piece of work (a sign of life that is not a collective).
  static void TookRequest(DeviceProgressSlot* slot);
  static void Moved(DeviceProgressSlot* slot);
  // The device's connections to `host` lost frames at `when_ns` (the slot's
  // one writer: the device's collective watcher, or its link's proxy).
  static void NoteLoss(DeviceProgressSlot* slot, uint64_t host, int64_t when_ns);
  // The slot's loss entries (any thread).
  static std::array<LossPeer, kLossPeers> ReadLoss(const DeviceProgressSlot& slot);

 private:
  ShmRegion region_;
};

// A communicator that records every collective of the one it wraps in a
// device's progress slot.
class ProgressCommunicator final : public Communicator {
 public:
  ProgressCommunicator(std::unique_ptr<Communicator> inner, DeviceProgressSlot* slot)
      : inner_(std::move(inner)), slot_(slot) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  Status AllReduceSum(float* data, size_t count) override;
  Status AllReduceSum(int64_t* data, size_t count) override;
  Status AllGather(const void* send, size_t bytes, void* recv) override;
  Status Barrier() override;
  Status Await(const std::function<Result<bool>()>& done) override;
  void Abort() override { inner_->Abort(); }

 private:
  void Enter();
  void Leave();
  std::unique_ptr<Communicator> inner_;
  DeviceProgressSlot* const slot_;
};

}  // namespace failsafe
