// Collectives over TCP with gloo, for devices on several hosts.
//
// Rendezvous goes through a KvStoreServer (the coordinator's). A dead peer
// closes its connections; a member whose collective fails closes all of its
// own, so the failure spreads through the group and every pending collective
// fails fast with kAborted. A hung peer is caught by the coordinator, which
// raises the group's AbortSignal: every member's watcher thread then shuts
// its connections down, so a collective waiting on the hung peer fails at
// once (the collective timeout is only the last resort), and interrupts the
// waits of the collective under way, which a torn-down connection does not
// always reach inside gloo. Abort() does the same for this member.
//
// The collectives are the member's own over gloo's point-to-point buffers:
// each member exchanges with every other directly, and sums in rank order
// (the same bits as the shared-memory group).
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/abort_signal.h"
#include "comm/communicator.h"

namespace gloo {
class Context;
namespace transport {
class UnboundBuffer;
}
}  // namespace gloo

namespace failsafe {

struct GlooGroupOptions {
  std::string store_host = "127.0.0.1";
  int store_port = 0;
  std::string prefix;                  // unique per group (epoch)
  std::string hostname = "127.0.0.1";  // this member's address for peers
  int rank = 0;
  int size = 1;
  int64_t timeout_ms = 60000;
  // Called from the member's watcher thread (so only with an abort signal)
  // every kLossSampleMs while the group is up, with each peer address whose
  // connections lose frames (comm/tcp_loss.h) and when they were last seen
  // losing them.
  std::function<void(const std::string& peer, int64_t now_ns)> on_lossy_peer;
};

class GlooCommunicator final : public Communicator {
 public:
  static constexpr int64_t kLossSampleMs = 50;

  // `abort` (optional) is the group's signal; the member watches it.
  static Result<std::unique_ptr<GlooCommunicator>> Connect(const GlooGroupOptions& options,
                                                           AbortSignal abort = {});
  ~GlooCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Status AllReduceSum(float* data, size_t count) override;
  Status AllReduceSum(int64_t* data, size_t count) override;
  Status AllGather(const void* send, size_t bytes, void* recv) override;
  Status Barrier() override;
  Status Await(const std::function<Result<bool>()>& done) override;
  void Abort() override;

 private:
  class Ops;

  GlooCommunicator() = default;
  // In place over `count` elements of `data`.
  template <typename T>
  Status AllReduce(T* data, size_t count);
  void Fail();
  // Interrupts the waits of the collective under way; mu_ held.
  void AbortWaits();
  // Shuts this member's connections down: pending collectives fail now.
  void ShutdownConnections();
  void Watch();

  std::shared_ptr<gloo::Context> context_;
  int rank_ = 0;
  int size_ = 1;
  int64_t timeout_ms_ = 60000;
  uint32_t tag_ = 0;
  std::atomic<bool> aborted_{false};
  AbortSignal signal_;
  std::mutex mu_;
  std::vector<int> sockets_;  // the group's TCP connections, guarded by mu_
  // The buffers of the collective under way (Ops), guarded by mu_.
  std::vector<gloo::transport::UnboundBuffer*> active_;
  std::unique_ptr<char[]> scratch_;  // the all-reduce's receives
  size_t scratch_bytes_ = 0;
  bool closed_ = false;  // the connections are closed, guarded by mu_
  std::atomic<bool> stop_{false};
  std::function<void(const std::string&, int64_t)> on_lossy_peer_;
  std::thread watcher_;
};

}  // namespace failsafe
