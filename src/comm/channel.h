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
  // timeout in the middle of a message leaves the channel unusable).
  Status Receive(Message* msg, int64_t timeout_ms = -1);

 private:
  Status ReadFully(char* dst, size_t n, std::vector<int>* fds, int64_t deadline_ns);
  int fd_ = -1;
};

}  // namespace failsafe
