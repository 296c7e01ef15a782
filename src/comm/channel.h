// A message channel over a connected stream socket (Unix or TCP): framed
// messages of a type and a payload, optionally carrying file descriptors
// (Unix sockets only). Used between the coordinator and its workers.
//
// Thread-safety: one sender thread and one receiver thread at a time.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace failsafe {

struct Message {
  uint32_t type = 0;
  std::string payload;
  std::vector<int> fds;  // received descriptors; the receiver owns them
};

class Channel {
 public:
  Channel() = default;
  explicit Channel(int fd) : fd_(fd) {}
  Channel(Channel&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Channel& operator=(Channel&& o) noexcept;
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;
  ~Channel();

  // A connected pair of Unix sockets.
  static Result<std::pair<Channel, Channel>> Pair();

  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  // Gives up ownership of the socket.
  int Release();
  void Close();

  // Sends one message; fails with kUnavailable if the peer is gone.
  Status Send(uint32_t type, const std::string& payload, const std::vector<int>& fds = {});
  // Receives one message, waiting at most timeout_ms (< 0: forever). Fails
  // with kUnavailable when the peer closed, kDeadlineExceeded on timeout (a
  // timeout in the middle of a message leaves the channel unusable), and
  // kInvalidArgument, before reading or allocating its body, for a frame
  // that claims more than max_payload bytes.
  Status Receive(Message* msg, int64_t timeout_ms = -1, uint64_t max_payload = kMaxPayload);

  // The largest body a frame may claim.
  static constexpr uint64_t kMaxPayload = 1ull << 34;

 private:
  Status ReadFully(char* dst, size_t n, std::vector<int>* fds, int64_t deadline_ns);
  int fd_ = -1;
};

// Reassembles one channel frame from bytes as a non-blocking socket yields
// them, for a reader that must not trust the peer: a header claiming more
// than max_payload bytes, or descriptors, is refused before anything is
// allocated for the body. Takes no descriptors.
class FrameReader {
 public:
  explicit FrameReader(uint64_t max_payload) : max_payload_(max_payload) {}

  // Bytes still missing from the header or the body (0 once done); the
  // caller reads at most this many, so no byte past the frame is taken.
  size_t Want() const;
  // Takes n <= Want() bytes. Fails, for good, on a header out of bounds.
  Status Add(const char* data, size_t n);
  bool done() const { return header_got_ == kHeaderBytes && payload_.size() == length_; }
  uint32_t type() const { return type_; }
  const std::string& payload() const { return payload_; }
  // Ready for the next frame.
  void Reset();

  static constexpr size_t kHeaderBytes = 16;

 private:
  uint64_t max_payload_;
  char header_[kHeaderBytes] = {};
  size_t header_got_ = 0;
  uint32_t type_ = 0;
  uint64_t length_ = 0;
  bool bad_ = false;
  std::string payload_;
};

}  // namespace failsafe
