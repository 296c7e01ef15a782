#include "worker/peer_reducer.h"

#include <algorithm>
#include <cstring>

#include "common/check.h"
#include "common/log.h"
#include "common/ordered_sums.h"

namespace failsafe {

namespace {

// What each member tells the others at setup.
struct Offer {
  uint32_t ok = 0;
  uint32_t handle_bytes = 0;
  char handle[Backend::kPeerHandleBytes] = {};
};

constexpr int kMaxMembers = 64;

}  // namespace

PeerReducer::PeerReducer(Backend* backend, size_t slot_bytes, size_t scatter_bytes)
    : backend_(backend),
      slot_bytes_(std::max<size_t>(64, slot_bytes / 64 * 64)),
      scatter_bytes_(scatter_bytes) {}

PeerReducer::~PeerReducer() {
  CloseUnused({});
  if (own_.data) backend_->FreePeerMemory(own_.data, 3 * slot_bytes_);
}

void PeerReducer::CloseUnused(const std::vector<std::string>& keep) {
  std::vector<std::string> gone;
  for (const auto& [handle, p] : opened_) {
    if (std::find(keep.begin(), keep.end(), handle) == keep.end()) gone.push_back(handle);
  }
  if (gone.empty()) return;
  // A sum launched before (one of a step a failed barrier cut short) may
  // still read a mapping let go here: none does once the device is idle.
  backend_->Synchronize();
  for (const std::string& handle : gone) {
    backend_->ClosePeerMemory(opened_[handle], 3 * slot_bytes_);
    opened_.erase(handle);
  }
}

Result<bool> PeerReducer::Ready(Communicator& comm) {
  if (comm.serial() == serial_) return ready_;
  if (comm.size() <= 1) {
    CloseUnused({});
    serial_ = comm.serial();
    ready_ = false;
    return false;
  }
  bool ready = false;
  FS_RETURN_IF_ERROR(SetUp(comm, &ready));
  serial_ = comm.serial();
  ready_ = ready;
  ops_ = 0;
  return ready_;
}

Status PeerReducer::SetUp(Communicator& comm, bool* ready) {
  *ready = false;
  // A sum of the group before may still be reading the slots the new
  // group's first chunk writes, or mappings this setup lets go: none is,
  // once the device is idle.
  backend_->Synchronize();
  const int size = comm.size(), rank = comm.rank();
  if (size > kMaxMembers) return InvalidArgument("{} members, at most {}", size, kMaxMembers);
  // 1. Every member offers its slots (allocated once, kept across groups).
  Offer offer;
  std::string why;
  if (!own_.data) {
    auto m = backend_->AllocatePeerMemory(3 * slot_bytes_);
    if (m.ok()) {
      own_ = std::move(*m);
      if (own_.handle.size() > sizeof(offer.handle)) {
        backend_->FreePeerMemory(own_.data, 3 * slot_bytes_);
        own_ = Backend::PeerMemory();
        why = "the backend's peer-memory handle is too long";
      }
    } else {
      why = m.status().ToString();
    }
  }
  if (own_.data) {
    offer.ok = 1;
    offer.handle_bytes = static_cast<uint32_t>(own_.handle.size());
    std::memcpy(offer.handle, own_.handle.data(), own_.handle.size());
  }
  std::vector<Offer> offers(static_cast<size_t>(size));
  FS_RETURN_IF_ERROR(comm.AllGather(&offer, sizeof(Offer), offers.data()));

  // 2. Each maps the others' and says whether it could.
  std::vector<std::string> handles;
  member_base_.assign(static_cast<size_t>(size), nullptr);
  uint32_t mapped = 1;
  for (int m = 0; m < size; ++m) {
    const Offer& o = offers[static_cast<size_t>(m)];
    if (!o.ok || o.handle_bytes > sizeof(o.handle)) {
      mapped = 0;
      if (why.empty()) why = fmt::format("member {} has no memory to share", m);
      break;
    }
    if (m == rank) {
      member_base_[static_cast<size_t>(m)] = own_.data;
      continue;
    }
    std::string handle(o.handle, o.handle_bytes);
    auto it = opened_.find(handle);
    if (it == opened_.end()) {
      auto p = backend_->OpenPeerMemory(handle, 3 * slot_bytes_);
      if (!p.ok()) {
        mapped = 0;
        why = fmt::format("member {}'s memory: {}", m, p.status().ToString());
        break;
      }
      it = opened_.emplace(handle, *p).first;
    }
    member_base_[static_cast<size_t>(m)] = it->second;
    handles.push_back(std::move(handle));
  }
  CloseUnused(mapped ? handles : std::vector<std::string>());
  std::vector<uint32_t> all(static_cast<size_t>(size));
  FS_RETURN_IF_ERROR(comm.AllGather(&mapped, sizeof(mapped), all.data()));
  *ready = std::all_of(all.begin(), all.end(), [](uint32_t v) { return v != 0; });
  if (*ready) {
    FS_LOG_DEBUG("all-reduces read the {} members' device memory", size);
  } else {
    if (why.empty()) why = "another member could not map every peer's memory";
    if (why != why_not_) FS_LOG_INFO("collectives stage through the host: {}", why);
    why_not_ = why;
    member_base_.clear();
  }
  return Status::Ok();
}

Status PeerReducer::AllReduceSum(Communicator& comm, float* data, size_t count) {
  return Reduce(comm, data, count);
}

Status PeerReducer::AllReduceSum(Communicator& comm, int64_t* data, size_t count) {
  return Reduce(comm, data, count);
}

template <typename T>
Status PeerReducer::Reduce(Communicator& comm, T* data, size_t count) {
  FS_CHECK_MSG(ready_ && comm.serial() == serial_, "peer all-reduce on a group not set up");
  const int size = comm.size(), rank = comm.rank();
  const size_t chunk = slot_bytes_ / sizeof(T);
  const T* srcs[kMaxMembers];
  for (size_t off = 0; off < count; off += chunk) {
    const size_t n = std::min(chunk, count - off);
    const int slot = static_cast<int>(ops_++ & 1);
    backend_->CopyOnDevice(Slot(rank, slot), data + off, n * sizeof(T));
    backend_->Synchronize();
    FS_RETURN_IF_ERROR(comm.Barrier());
    if (n * sizeof(T) * static_cast<size_t>(size) <= scatter_bytes_ ||
        n < static_cast<size_t>(size) * 16) {
      for (int m = 0; m < size; ++m) srcs[m] = reinterpret_cast<const T*>(Slot(m, slot));
      backend_->SumArrays(srcs, size, n, data + off);
      continue;
    }
    size_t b, e;
    ScatterPiece<T>(n, size, rank, &b, &e);
    if (e > b) {
      for (int m = 0; m < size; ++m) srcs[m] = reinterpret_cast<const T*>(Slot(m, slot)) + b;
      backend_->SumArrays(srcs, size, e - b, reinterpret_cast<T*>(Slot(rank, 2)));
    }
    backend_->Synchronize();
    FS_RETURN_IF_ERROR(comm.Barrier());
    for (int m = 0; m < size; ++m) {
      size_t mb, me;
      ScatterPiece<T>(n, size, m, &mb, &me);
      if (me > mb) backend_->CopyOnDevice(data + off + mb, Slot(m, 2), (me - mb) * sizeof(T));
    }
  }
  return Status::Ok();
}

}  // namespace failsafe
