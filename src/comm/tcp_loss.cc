#include "comm/tcp_loss.h"

// The kernel's struct tcp_info (with the duplicate-SACK count, which the C
// library's <netinet/tcp.h> lacks); not mixed with that header here.
#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <algorithm>

#include "comm/tcp.h"

namespace failsafe {

namespace {

bool ReadKernelState(int fd, TcpLossState* out) {
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) return false;
  tcp_info ti{};
  socklen_t len = sizeof(ti);
  if (::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0) return false;
  out->inode = st.st_ino;
  out->retransmitted = ti.tcpi_total_retrans;
  // (Kernels before 5.1 do not count them: every retransmission is loss.)
  out->spurious = len >= offsetof(tcp_info, tcpi_dsack_dups) + sizeof(ti.tcpi_dsack_dups)
                      ? ti.tcpi_dsack_dups
                      : 0;
  out->timed_out = ti.tcpi_retransmits > 0;
  return true;
}

}  // namespace

TcpLossSampler::TcpLossSampler(const std::vector<int>& fds) : read_(ReadKernelState) {
  for (int fd : fds) {
    const std::string peer = PeerAddress(fd);
    if (peer.empty() || peer == LocalAddress(fd)) continue;
    TcpLossState s;
    if (read_(fd, &s)) conns_.push_back({fd, peer, s});
  }
}

TcpLossSampler::TcpLossSampler(const std::vector<std::pair<int, std::string>>& conns,
                               StateReader read)
    : read_(std::move(read)) {
  for (const auto& [fd, peer] : conns) {
    TcpLossState s;
    if (read_(fd, &s)) conns_.push_back({fd, peer, s});
  }
}

std::vector<TcpLossSampler::Lossy> TcpLossSampler::Sample(int64_t now_ns) {
  std::vector<std::string> timed_out;
  for (auto c = conns_.begin(); c != conns_.end();) {
    TcpLossState s;
    if (!read_(c->fd, &s) || s.inode != c->last.inode) {
      c = conns_.erase(c);  // closed (its number may name another socket now)
      continue;
    }
    // (Differences of the kernel's 32-bit counters, wrap included.)
    const int64_t lost = static_cast<int32_t>(s.retransmitted - c->last.retransmitted) -
                         static_cast<int64_t>(static_cast<int32_t>(s.spurious - c->last.spurious));
    if (lost != 0) seen_[c->peer].push_back({now_ns, lost});
    if (s.timed_out) timed_out.push_back(c->peer);
    c->last = s;
    ++c;
  }
  std::vector<Lossy> lossy;
  for (auto it = seen_.begin(); it != seen_.end();) {
    auto& events = it->second;
    while (!events.empty() && events.front().first <= now_ns - kLossyWindowNs) events.pop_front();
    if (events.empty()) {
      it = seen_.erase(it);
      continue;
    }
    // In order, never below 0: a correction whose loss left the window
    // hides no later loss.
    int64_t segments = 0, last = 0;
    for (const auto& [when, n] : events) {
      segments = std::max<int64_t>(0, segments + n);
      if (n > 0) last = when;
    }
    if (segments >= static_cast<int64_t>(kLossyRetransmits)) lossy.push_back({it->first, last});
    ++it;
  }
  for (const std::string& peer : timed_out) {
    auto l =
        std::find_if(lossy.begin(), lossy.end(), [&](const Lossy& x) { return x.peer == peer; });
    if (l == lossy.end()) {
      lossy.push_back({peer, now_ns});
    } else {
      l->last_ns = now_ns;
    }
  }
  return lossy;
}

}  // namespace failsafe
