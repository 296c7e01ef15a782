#include "comm/channel.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/clock.h"

namespace failsafe {

namespace {
constexpr uint32_t kMaxFds = 16;

struct FrameHeader {
  uint32_t type;
  uint32_t num_fds;
  uint64_t length;
};
static_assert(sizeof(FrameHeader) == FrameReader::kHeaderBytes);
}  // namespace

Channel& Channel::operator=(Channel&& o) noexcept {
  if (this != &o) {
    Close();
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

Channel::~Channel() { Close(); }

void Channel::Close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

int Channel::Release() {
  int fd = fd_;
  fd_ = -1;
  return fd;
}

Result<std::pair<Channel, Channel>> Channel::Pair() {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    return Internal("socketpair: {}", std::strerror(errno));
  }
  return std::make_pair(Channel(sv[0]), Channel(sv[1]));
}

Status Channel::Send(uint32_t type, const std::string& payload, const std::vector<int>& fds) {
  if (fd_ < 0) return Unavailable("channel is closed");
  if (fds.size() > kMaxFds) return InvalidArgument("too many descriptors in one message");
  FrameHeader h{type, static_cast<uint32_t>(fds.size()), payload.size()};
  // The header goes first, with the descriptors attached.
  iovec iov{&h, sizeof(h)};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFds)];
  if (!fds.empty()) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  ssize_t n;
  do {
    n = ::sendmsg(fd_, &msg, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return Unavailable("send failed: {}", std::strerror(errno));
  size_t sent = static_cast<size_t>(n);
  const char* base = reinterpret_cast<const char*>(&h);
  while (sent < sizeof(h)) {
    ssize_t m = ::send(fd_, base + sent, sizeof(h) - sent, MSG_NOSIGNAL);
    if (m < 0 && errno == EINTR) continue;
    if (m <= 0) return Unavailable("send failed: {}", std::strerror(errno));
    sent += static_cast<size_t>(m);
  }
  size_t off = 0;
  while (off < payload.size()) {
    ssize_t m = ::send(fd_, payload.data() + off, payload.size() - off, MSG_NOSIGNAL);
    if (m < 0 && errno == EINTR) continue;
    if (m <= 0) return Unavailable("send failed: {}", std::strerror(errno));
    off += static_cast<size_t>(m);
  }
  return Status::Ok();
}

Status Channel::ReadFully(char* dst, size_t n, std::vector<int>* fds, int64_t deadline_ns) {
  size_t got = 0;
  while (got < n) {
    if (deadline_ns >= 0) {
      int64_t left_ms = (deadline_ns - MonotonicNanos()) / 1000000;
      if (left_ms <= 0) return DeadlineExceeded("no message within the deadline");
      pollfd p{fd_, POLLIN, 0};
      int r = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left_ms, 1 << 30)));
      if (r < 0 && errno == EINTR) continue;
      if (r == 0) return DeadlineExceeded("no message within the deadline");
    }
    iovec iov{dst + got, n - got};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFds)];
    if (fds) {
      msg.msg_control = control;
      msg.msg_controllen = sizeof(control);
    }
    ssize_t r = ::recvmsg(fd_, &msg, MSG_CMSG_CLOEXEC);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return Unavailable("receive failed: {}", std::strerror(errno));
    if (r == 0) return Unavailable("peer closed the channel");
    if (fds) {
      for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
          size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
          const int* p = reinterpret_cast<const int*>(CMSG_DATA(c));
          fds->insert(fds->end(), p, p + k);
        }
      }
    }
    got += static_cast<size_t>(r);
  }
  return Status::Ok();
}

Status Channel::Receive(Message* out, int64_t timeout_ms, uint64_t max_payload) {
  if (fd_ < 0) return Unavailable("channel is closed");
  const int64_t deadline = timeout_ms < 0 ? -1 : MonotonicNanos() + timeout_ms * 1000000;
  FrameHeader h;
  out->fds.clear();
  FS_RETURN_IF_ERROR(ReadFully(reinterpret_cast<char*>(&h), sizeof(h), &out->fds, deadline));
  if (h.length > kMaxPayload || h.num_fds > kMaxFds || out->fds.size() != h.num_fds) {
    for (int fd : out->fds) ::close(fd);
    out->fds.clear();
    return Internal("malformed frame on channel");
  }
  if (h.length > max_payload) {
    for (int fd : out->fds) ::close(fd);
    out->fds.clear();
    return InvalidArgument("a frame of {} bytes where at most {} may come", h.length, max_payload);
  }
  out->type = h.type;
  out->payload.resize(h.length);
  // The body follows the header at once; a sender that stops half-way (a
  // process stopped or hung mid-write) fails the receive at the same
  // deadline, and the channel is then unusable.
  return ReadFully(out->payload.data(), h.length, nullptr, deadline);
}

size_t FrameReader::Want() const {
  if (bad_) return 0;
  if (header_got_ < kHeaderBytes) return kHeaderBytes - header_got_;
  return static_cast<size_t>(length_ - payload_.size());
}

Status FrameReader::Add(const char* data, size_t n) {
  if (bad_) return InvalidArgument("the frame was refused");
  if (n > Want()) return InvalidArgument("more bytes than the frame wants");
  if (header_got_ < kHeaderBytes) {
    std::memcpy(header_ + header_got_, data, n);
    header_got_ += n;
    if (header_got_ < kHeaderBytes) return Status::Ok();
    FrameHeader h;
    std::memcpy(&h, header_, sizeof(h));
    if (h.num_fds != 0 || h.length > max_payload_) {
      bad_ = true;
      return InvalidArgument(
          "a frame of {} bytes and {} descriptors where at most {} bytes may come", h.length,
          h.num_fds, max_payload_);
    }
    type_ = h.type;
    length_ = h.length;
    payload_.reserve(static_cast<size_t>(length_));
    return Status::Ok();
  }
  payload_.append(data, n);
  return Status::Ok();
}

void FrameReader::Reset() {
  header_got_ = 0;
  type_ = 0;
  length_ = 0;
  bad_ = false;
  payload_.clear();
}

}  // namespace failsafe
