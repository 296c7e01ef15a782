#include "engine/reply_collector.h"

#include <poll.h>

#include <algorithm>
#include <cerrno>

#include "common/clock.h"
#include "common/log.h"

namespace failsafe {

namespace {

// A reply whose header arrived is complete within this time, or the sender
// stopped half-way and its channel is unusable.
constexpr int64_t kBodyTimeoutMs = 2000;

}  // namespace

std::vector<DeviceReply> CollectReplies(const std::vector<std::pair<int, DeviceProcess*>>& devices,
                                        ReplyWatch& watch, const DeathHandler& on_death) {
  std::vector<DeviceReply> out;
  std::vector<std::pair<int, DeviceProcess*>> pending;
  for (const auto& d : devices) {
    if (d.second) pending.push_back(d);
  }
  std::vector<int> replied;
  auto ids = [](const std::vector<std::pair<int, DeviceProcess*>>& v) {
    std::vector<int> r;
    for (const auto& d : v) r.push_back(d.first);
    return r;
  };
  while (!pending.empty()) {
    const int64_t now = MonotonicNanos();
    if (now >= watch.next_check_ns()) {
      std::vector<Verdict> dead = watch.Check(now, ids(pending), replied);
      for (const Verdict& v : dead) {
        auto it = std::find_if(pending.begin(), pending.end(),
                               [&](const auto& d) { return d.first == v.device; });
        if (it == pending.end()) continue;
        on_death(v);
        pending.erase(it);
      }
      continue;
    }
    std::vector<pollfd> fds;
    for (const auto& [id, p] : pending) {
      fds.push_back({p->channel_fd(), POLLIN, 0});
      fds.push_back({p->pidfd(), POLLIN, 0});
    }
    const int64_t wait_ms = std::max<int64_t>(1, (watch.next_check_ns() - now + 999999) / 1000000);
    const int r =
        ::poll(fds.data(), fds.size(), static_cast<int>(std::min<int64_t>(wait_ms, 1 << 30)));
    if (r < 0 && errno == EINTR) continue;
    std::vector<std::pair<int, DeviceProcess*>> still;
    for (size_t i = 0; i < pending.size(); ++i) {
      const auto [id, p] = pending[i];
      const bool readable = fds[2 * i].revents & POLLIN;
      const bool broken = fds[2 * i].revents & (POLLHUP | POLLERR | POLLNVAL);
      const bool exited = fds[2 * i + 1].revents != 0;
      if (readable) {
        DeviceReply reply;
        bool stale = false;
        Status st = p->ReadReply(kBodyTimeoutMs, &reply.status, &reply.body, &stale);
        if (st.ok() && stale) {
          FS_LOG_WARN("device {}: discarding a late reply", id);
          still.push_back(pending[i]);
          continue;
        }
        if (st.ok()) {
          reply.device = id;
          if (!reply.status.ok() && reply.status.code() != StatusCode::kAborted)
            watch.OnFailedReply(id);
          out.push_back(std::move(reply));
          replied.push_back(id);
          continue;
        }
        on_death({id, "its channel closed", 0});
      } else if (exited || broken) {
        on_death({id, "its process exited", 0});
      } else {
        still.push_back(pending[i]);
      }
    }
    pending.swap(still);
  }
  return out;
}

}  // namespace failsafe
