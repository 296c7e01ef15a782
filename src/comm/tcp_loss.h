// Which peers a set of connected TCP sockets loses frames to, from the
// kernel's TCP state of each socket.
//
// A segment sent again counts as lost unless the peer says it had it
// already (a duplicate SACK: the retransmission was spurious, as a
// tail-loss probe sent ahead of a delayed acknowledgement is, on healthy
// links too). A peer is lossy while one of its connections waits on a
// retransmission timeout that fired, or while its connections lost at least
// kLossyRetransmits segments within the last kLossyWindowNs. A peer that is
// stopped or busy is not lossy: its kernel still acknowledges what arrives.
// Sockets that are not connected, or whose peer has the socket's own local
// address (a peer on the same host), are left out; a descriptor that was
// closed, or now names another socket, drops out.
//
// Thread-safety: one thread uses a sampler.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace failsafe {

// What a sampler reads of a socket.
struct TcpLossState {
  uint64_t inode = 0;          // the socket's (a descriptor reused names another)
  uint32_t retransmitted = 0;  // segments sent again, in all
  uint32_t spurious = 0;       // of those, the peer had already (duplicate SACKs)
  bool timed_out = false;      // a retransmission timeout fired, not yet answered
};

class TcpLossSampler {
 public:
  static constexpr uint32_t kLossyRetransmits = 2;
  static constexpr int64_t kLossyWindowNs = 1000 * 1000000LL;
  // Reads a descriptor's state; false if it is no TCP socket (now).
  using StateReader = std::function<bool(int fd, TcpLossState*)>;

  // Over connected sockets `fds`, their state read from the kernel.
  explicit TcpLossSampler(const std::vector<int>& fds);
  // Over (descriptor, peer address) pairs whose state `read` gives (tests).
  TcpLossSampler(const std::vector<std::pair<int, std::string>>& conns, StateReader read);

  struct Lossy {
    std::string peer;  // its address as text
    int64_t last_ns;   // when its connections were last seen losing frames
  };
  // The peers whose connections are lossy at `now_ns`.
  std::vector<Lossy> Sample(int64_t now_ns);
  size_t connections() const { return conns_.size(); }

 private:
  struct Conn {
    int fd;
    std::string peer;
    TcpLossState last;  // at the previous sample
  };
  StateReader read_;
  std::vector<Conn> conns_;
  // Per peer: (when, segments lost) in the window; negative: found spurious
  // after they were counted (a duplicate SACK may come a sample later).
  std::map<std::string, std::deque<std::pair<int64_t, int64_t>>> seen_;
};

}  // namespace failsafe
