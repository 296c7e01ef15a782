#include "worker/device_group_reducer.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <thread>
#include <vector>

#include "backend/peer_memory.h"
#include "common/check.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/rng.h"

namespace failsafe {
namespace {

// What a member says of itself at a group's setup.
struct Offer {
  uint32_t ok = 0;  // the library is there and not broken here
  char boot[40] = {};
  char netns[40] = {};
  char device[80] = {};  // Backend::CollectiveDevice
  // The group it holds for a shrink (Membership; id 0: none).
  uint64_t parent_id = 0;
  int32_t parent_rank = -1, parent_size = 0;
};

// A group's identity from the id it was made from (never 0: none).
uint64_t IdentityOf(const char (&id)[Backend::kDeviceGroupIdBytes]) {
  uint64_t h = 0;
  for (size_t i = 0; i < sizeof(id); i += sizeof(uint64_t)) {
    uint64_t word = 0;
    std::memcpy(&word, id + i, sizeof(word));
    h = HashCombine(h, word);
  }
  return h | 1;
}

// Whether every member holds the same group for a shrink, this group's
// members in its order; its ranks not among them in *excluded.
bool Shrinkable(const std::vector<Offer>& offers, std::vector<int>* excluded) {
  const Offer& first = offers[0];
  // (A shrink leaves out one member or more: the same members keep their
  // revoked group for none, and make a new one from an id.)
  if (first.parent_id == 0 || first.parent_size <= static_cast<int32_t>(offers.size()))
    return false;
  std::vector<bool> kept(static_cast<size_t>(first.parent_size), false);
  int32_t last = -1;
  for (const Offer& o : offers) {
    if (o.parent_id != first.parent_id || o.parent_size != first.parent_size ||
        o.parent_rank <= last || o.parent_rank >= first.parent_size)
      return false;
    last = o.parent_rank;
    kept[static_cast<size_t>(o.parent_rank)] = true;
  }
  excluded->clear();
  for (int r = 0; r < first.parent_size; ++r) {
    if (!kept[static_cast<size_t>(r)]) excluded->push_back(r);
  }
  return true;
}

struct IdOffer {
  uint32_t ok = 0;
  char id[Backend::kDeviceGroupIdBytes] = {};
};

// This process's network namespace: the library's bootstrap connects by
// the host's addresses, which another namespace may not reach.
std::string NetNamespace() {
  char buf[64] = {};
  const ssize_t n = readlink("/proc/self/ns/net", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

void Put(char* dst, size_t cap, const std::string& s) {
  std::memcpy(dst, s.data(), std::min(cap - 1, s.size()));
}

}  // namespace

Result<bool> DeviceGroupReducer::Ready(Communicator& comm) {
  if (comm.serial() == serial_) return ready_;
  // The group before is done with: every operation of it finished or
  // failed. Revoked (or aborted) it waits for no member.
  Retire();
  ready_ = false;
  failed_ = Status::Ok();
  serial_ = comm.serial();
  if (comm.size() <= 1) {
    parent_ = {};
    return false;
  }
  bool ready = false;
  FS_RETURN_IF_ERROR(SetUp(comm, &ready));
  ready_ = ready;
  return ready_;
}

Status DeviceGroupReducer::SetUp(Communicator& comm, bool* ready) {
  *ready = false;
  const int size = comm.size(), rank = comm.rank();
  // 1. Who can take part.
  Offer mine;
  const std::string device = broken_ ? std::string() : backend_->CollectiveDevice();
  const std::string boot = HostBootId(), netns = NetNamespace();
  if (!device.empty() && device.size() < sizeof(mine.device) && !boot.empty() &&
      boot.size() < sizeof(mine.boot) && !netns.empty() && netns.size() < sizeof(mine.netns)) {
    mine.ok = 1;
    Put(mine.boot, sizeof(mine.boot), boot);
    Put(mine.netns, sizeof(mine.netns), netns);
    Put(mine.device, sizeof(mine.device), device);
    if (parent_.group) {
      mine.parent_id = parent_.member.id;
      mine.parent_rank = parent_.member.rank;
      mine.parent_size = parent_.member.size;
    }
  }
  std::vector<Offer> offers(static_cast<size_t>(size));
  FS_RETURN_IF_ERROR(comm.AllGather(&mine, sizeof(Offer), offers.data()));
  std::string why;
  std::set<std::string> devices;
  for (int m = 0; m < size && why.empty(); ++m) {
    const Offer& o = offers[static_cast<size_t>(m)];
    if (!o.ok) {
      why = fmt::format("member {} has no library of collectives", m);
    } else if (std::strncmp(o.boot, offers[0].boot, sizeof(o.boot)) != 0 ||
               std::strncmp(o.netns, offers[0].netns, sizeof(o.netns)) != 0) {
      why = fmt::format("member {} is on another host or network namespace", m);
    } else if (!devices.emplace(o.device, strnlen(o.device, sizeof(o.device))).second) {
      why = fmt::format("member {} shares a device with another", m);
    }
  }
  if (!why.empty()) {
    if (why != why_not_) FS_LOG_DEBUG("all-reduces not by the device library: {}", why);
    why_not_ = why;
    parent_ = {};
    return Status::Ok();
  }

  // 2. Shrunk from the group every member holds, where each does;
  std::vector<int> excluded;
  if (Shrinkable(offers, &excluded)) {
    bool shrunk = false;
    FS_RETURN_IF_ERROR(Shrink(comm, excluded, &shrunk));
    if (shrunk) {
      *ready = true;
      return Status::Ok();
    }
  }
  parent_ = {};

  // else member 0 makes the group's id.
  IdOffer id;
  if (rank == 0) {
    auto made = backend_->NewDeviceGroupId();
    if (made.ok() && made->size() <= sizeof(id.id)) {
      id.ok = 1;
      std::memcpy(id.id, made->data(), made->size());
    } else {
      FS_LOG_WARN("device group: no id ({})", made.ok() ? "too long" : made.status().ToString());
    }
  }
  std::vector<IdOffer> ids(static_cast<size_t>(size));
  FS_RETURN_IF_ERROR(comm.AllGather(&id, sizeof(IdOffer), ids.data()));
  if (!ids[0].ok) {
    why_not_ = "member 0 could not make a group id";
    return Status::Ok();
  }

  // 3. Every member starts its join, and says whether it could.
  auto joined = backend_->JoinDeviceGroup(std::string(ids[0].id, sizeof(ids[0].id)), rank, size);
  uint32_t started = joined.ok() ? 1 : 0;
  if (joined.ok()) {
    group_ = std::move(*joined);
    waited_ = 0;
    member_ = {IdentityOf(ids[0].id), rank, size};
  } else {
    FS_LOG_WARN("device group: cannot join ({}); the device library is not used again",
                joined.status().ToString());
    broken_ = true;
  }
  std::vector<uint32_t> all(static_cast<size_t>(size));
  Status st = comm.AllGather(&started, sizeof(started), all.data());
  if (!st.ok() || !std::all_of(all.begin(), all.end(), [](uint32_t v) { return v != 0; })) {
    group_.reset();
    member_ = {};
    why_not_ = "a member could not join the device group";
    return st;
  }

  // 4. The join finishes once every member has joined; then the first
  // operations.
  const int64_t t0 = MonotonicNanos();
  FS_RETURN_IF_ERROR(Wait(comm));
  const int64_t t1 = MonotonicNanos();
  FS_RETURN_IF_ERROR(WarmUp(comm));
  FS_LOG_DEBUG(
      "all-reduces by the device library among the {} members (joined in {:.1f} ms, first "
      "operations {:.1f} ms)",
      size, static_cast<double>(t1 - t0) / 1e6, static_cast<double>(MonotonicNanos() - t1) / 1e6);
  *ready = true;
  return Status::Ok();
}

Status DeviceGroupReducer::Shrink(Communicator& comm, const std::vector<int>& excluded,
                                  bool* shrunk) {
  *shrunk = false;
  const int size = comm.size(), rank = comm.rank();
  const int from = parent_.member.size;
  const uint64_t parent_id = parent_.member.id;
  const int64_t t0 = MonotonicNanos();
  // The parent settles (its operations ended): within kSettleMs here, so
  // that a parent that does not still lets this member say so below, where
  // every member hears it, rather than miss the group's deadline alone.
  bool unsettled = false;
  Status st = comm.Await([&]() -> Result<bool> {
    auto done = parent_.group->Done();
    if (done.ok() && *done) return true;
    if (done.ok() && MonotonicNanos() - t0 < kSettleMs * 1'000'000) return false;
    unsettled = true;
    return true;
  });
  if (!st.ok()) {
    parent_ = {};
    return st;
  }
  // Every member starts its shrink, and says whether it could.
  std::unique_ptr<Backend::DeviceGroup> started_group;
  if (!unsettled) {
    auto made = parent_.group->Shrink(excluded);
    if (made.ok()) {
      started_group = std::move(*made);  // it carries the parent from here on
    } else {
      FS_LOG_DEBUG("device group: no shrink ({})", made.status().ToString());
    }
  } else {
    FS_LOG_DEBUG("device group: the group to shrink did not settle in {} ms", kSettleMs);
  }
  parent_ = {};
  uint32_t started = started_group ? 1 : 0;
  std::vector<uint32_t> all(static_cast<size_t>(size));
  st = comm.AllGather(&started, sizeof(started), all.data());
  if (!st.ok() || !std::all_of(all.begin(), all.end(), [](uint32_t v) { return v != 0; })) {
    started_group.reset();  // its parent aborted first, which ends its join
    return st;              // ok: the new id's way
  }
  uint64_t id = parent_id;
  for (int r : excluded) id = HashCombine(id, static_cast<uint64_t>(r)) | 1;
  group_ = std::move(started_group);
  waited_ = 0;
  member_ = {id, rank, size};
  FS_RETURN_IF_ERROR(Wait(comm));  // its join
  const int64_t t1 = MonotonicNanos();
  FS_RETURN_IF_ERROR(WarmUp(comm));
  FS_LOG_DEBUG(
      "all-reduces by the device library among the {} members (shrunk from {} in {:.1f} ms, "
      "first operations {:.1f} ms)",
      size, from, static_cast<double>(t1 - t0) / 1e6,
      static_cast<double>(MonotonicNanos() - t1) / 1e6);
  *shrunk = true;
  return Status::Ok();
}

Status DeviceGroupReducer::WarmUp(Communicator& comm) {
  const int size = comm.size(), rank = comm.rank();
  int64_t* one = warm_sum_.Reserve(1);
  float* floats = gathered_.Reserve(static_cast<size_t>(size));
  backend_->SetZero(one, sizeof(int64_t));
  backend_->SetZero(floats, sizeof(float) * static_cast<size_t>(size));
  FS_RETURN_IF_ERROR(Started(group_->StartAllReduce(one, 1)));
  FS_RETURN_IF_ERROR(Wait(comm));
  FS_RETURN_IF_ERROR(Started(group_->StartAllGather(floats + rank, 1, floats)));
  return Wait(comm);
}

void DeviceGroupReducer::Retire() {
  if (!group_) return;  // (a group kept before stays)
  Held kept{std::move(group_), member_};
  member_ = {};
  parent_ = {};
  // (A group whose join did not finish aborts in Revoke.)
  if (!broken_ && kept.member.id != 0 && kept.group->Revoke()) parent_ = std::move(kept);
}

DeviceGroupReducer::~DeviceGroupReducer() {
  group_.reset();  // ends any operation before its buffers go
  parent_ = {};
}

Status DeviceGroupReducer::Await(Communicator& comm, const std::function<Result<bool>()>& done) {
  // The library's own failure (kInternal), not a peer's (kUnavailable: a
  // connection to a dead member gone) or the group's deadline or abort.
  bool library_failed = false;
  Status st = comm.Await([&]() -> Result<bool> {
    auto r = done();
    if (!r.ok() && r.status().code() == StatusCode::kInternal) library_failed = true;
    return r;
  });
  if (!st.ok()) Failed(st, library_failed);
  return st;
}

Status DeviceGroupReducer::Wait(Communicator& comm) {
  FS_RETURN_IF_ERROR(Await(comm, [&] { return group_->Done(); }));
  waited_ = group_->started();
  return Status::Ok();
}

Status DeviceGroupReducer::WaitEnqueued(Communicator& comm) {
  // Typically at once: an operation the library could not enqueue in its
  // call is its own thread's job for a moment. Polled here, not as a
  // collective of comm: each member's progress moves once an operation, as
  // its device passes it (Settle), wherever its host waits for enqueues,
  // so members waiting at the same operation stand alike. (Past
  // kEnqueueSpinNs, an enqueue that long is waited for under comm's
  // deadline and abort.)
  const int64_t t0 = MonotonicNanos();
  for (;;) {
    auto enqueued = group_->Enqueued();
    if (!enqueued.ok()) {
      Failed(enqueued.status(), enqueued.status().code() == StatusCode::kInternal);
      return enqueued.status();
    }
    if (*enqueued) return Status::Ok();
    if (MonotonicNanos() - t0 > kEnqueueSpinNs) break;
    std::this_thread::yield();
  }
  return Await(comm, [&] { return group_->Enqueued(); });
}

Status DeviceGroupReducer::Gone() const {
  return failed_.ok() ? Aborted("the device group failed") : failed_;
}

Status DeviceGroupReducer::Settle(Communicator& comm) {
  if (!unsettled()) return failed_;
  // Each operation in turn, as the device passes it: each a move of this
  // member's progress, as when each was waited for alone, so that the
  // group's deadlines and its judgement of who is hung see the same pace.
  for (uint64_t n = waited_ + 1; n <= group_->started(); ++n) {
    FS_RETURN_IF_ERROR(Await(comm, [&] { return group_->Reached(n); }));
    waited_ = n;
  }
  return Status::Ok();
}

Status DeviceGroupReducer::Started(Status st) {
  if (!st.ok()) Failed(st, st.code() == StatusCode::kInternal);
  return st;
}

void DeviceGroupReducer::Failed(const Status& st, bool library_failed) {
  if (failed_.ok()) failed_ = st;
  // Its operations end; whatever they wrote is not used (the step fails).
  // The library's own failure ends its use here.
  if (library_failed) {
    FS_LOG_WARN("device group: {}; the device library is not used again", st.ToString());
    broken_ = true;
  }
  Retire();
}

Status DeviceGroupReducer::AllReduceSum(Communicator& comm, int64_t* data, size_t count) {
  FS_CHECK_MSG(ready_ && comm.serial() == serial_, "device-group all-reduce on a group not set up");
  if (!group_) return Gone();
  FS_RETURN_IF_ERROR(Started(group_->StartAllReduce(data, count)));
  return WaitEnqueued(comm);
}

Status DeviceGroupReducer::AllReduceSum(Communicator& comm, float* data, size_t count) {
  FS_CHECK_MSG(ready_ && comm.serial() == serial_, "device-group all-reduce on a group not set up");
  if (!group_) return Gone();
  const size_t size = static_cast<size_t>(comm.size());
  const size_t chunk = std::max<size_t>(1, kGatherBytes / sizeof(float) / size);
  float* gathered = gathered_.Reserve(std::min(chunk, count) * size);
  const float* srcs[64];
  FS_CHECK(size <= 64);
  for (size_t off = 0; off < count; off += chunk) {
    // (A wait of the backend's, in its allocation or upload, waits for the
    // operations started, and may have found the group failed.)
    if (!group_) return Gone();
    const size_t n = std::min(chunk, count - off);
    // (The stream orders the next chunk's gather after this one's sum.)
    FS_RETURN_IF_ERROR(Started(group_->StartAllGather(data + off, n, gathered)));
    FS_RETURN_IF_ERROR(WaitEnqueued(comm));
    for (size_t m = 0; m < size; ++m) srcs[m] = gathered + m * n;
    backend_->SumArrays(srcs, static_cast<int>(size), n, data + off);
  }
  return Status::Ok();
}

}  // namespace failsafe
