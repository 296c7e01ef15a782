#include "worker/device_progress.h"

#include <new>

#include "common/clock.h"

namespace failsafe {

namespace {

constexpr uint64_t kMagic = 0x4653505247303032ULL;  // "FSPRG002"

struct Header {
  uint64_t magic;
  uint32_t num_devices;
};
constexpr size_t kHeaderBytes = 64;
static_assert(sizeof(Header) <= kHeaderBytes);

}  // namespace

Result<DeviceProgressRegion> DeviceProgressRegion::Create(int num_devices) {
  if (num_devices < 1) return InvalidArgument("a progress region needs at least one device");
  DeviceProgressRegion r;
  FS_ASSIGN_OR_RETURN(r.region_,
                      ShmRegion::Create("failsafe-progress",
                                        kHeaderBytes + num_devices * sizeof(DeviceProgressSlot)));
  auto* h = static_cast<Header*>(r.region_.data());
  h->magic = kMagic;
  h->num_devices = static_cast<uint32_t>(num_devices);
  for (int d = 0; d < num_devices; ++d) new (r.slot(d)) DeviceProgressSlot();
  return r;
}

Result<DeviceProgressRegion> DeviceProgressRegion::Map(int fd) {
  DeviceProgressRegion r;
  FS_ASSIGN_OR_RETURN(r.region_, ShmRegion::Map(fd));
  const auto* h = static_cast<const Header*>(r.region_.data());
  if (r.region_.size() < kHeaderBytes || h->magic != kMagic ||
      kHeaderBytes + h->num_devices * sizeof(DeviceProgressSlot) > r.region_.size()) {
    return InvalidArgument("not a device progress region");
  }
  return r;
}

int DeviceProgressRegion::num_devices() const {
  return valid() ? static_cast<int>(static_cast<const Header*>(region_.data())->num_devices) : 0;
}

DeviceProgressSlot* DeviceProgressRegion::slot(int device) const {
  if (device < 0 || device >= num_devices()) return nullptr;
  return reinterpret_cast<DeviceProgressSlot*>(static_cast<char*>(region_.data()) + kHeaderBytes) +
         device;
}

DeviceProgress DeviceProgressRegion::Read(int device) const {
  DeviceProgress p;
  const DeviceProgressSlot* s = slot(device);
  if (!s) return p;
  p.requests = s->requests.load(std::memory_order_acquire);
  p.entered = s->entered.load(std::memory_order_acquire);
  p.left = s->left.load(std::memory_order_acquire);
  p.last_move_ns = s->last_move_ns.load(std::memory_order_acquire);
  p.heard_ns = s->heard_ns.load(std::memory_order_acquire);
  p.link_rtt_ns = s->link_rtt_ns.load(std::memory_order_acquire);
  p.link_rtt_samples = s->link_rtt_samples.load(std::memory_order_acquire);
  p.host = s->host.load(std::memory_order_acquire);
  p.alias = s->alias.load(std::memory_order_acquire);
  p.loss = ReadLoss(*s);
  return p;
}

std::array<LossPeer, kLossPeers> DeviceProgressRegion::ReadLoss(const DeviceProgressSlot& s) {
  std::array<LossPeer, kLossPeers> out{};
  for (int i = 0; i < kLossPeers; ++i) {
    // An entry being replaced reads with time 0 in between (NoteLoss): a
    // host is never paired with a time later than its own.
    const int64_t t = s.loss[i].last_ns.load(std::memory_order_acquire);
    const uint64_t h = s.loss[i].host.load(std::memory_order_acquire);
    if (t != 0 && h != 0 && s.loss[i].last_ns.load(std::memory_order_acquire) >= t) out[i] = {h, t};
  }
  return out;
}

void DeviceProgressRegion::Reset(int device) {
  DeviceProgressSlot* s = slot(device);
  if (!s) return;
  s->requests.store(0);
  s->entered.store(0);
  s->left.store(0);
  s->last_move_ns.store(MonotonicNanos());
  s->heard_ns.store(0);
  s->link_rtt_ns.store(0);
  s->link_rtt_samples.store(0);
  s->host.store(0);
  s->alias.store(0);
  for (LossPeerSlot& l : s->loss) {
    l.last_ns.store(0);
    l.host.store(0);
  }
}

void DeviceProgressRegion::NoteLoss(DeviceProgressSlot* slot, uint64_t host, int64_t when_ns) {
  if (!slot || host == 0 || when_ns == 0) return;
  LossPeerSlot* oldest = &slot->loss[0];
  for (LossPeerSlot& l : slot->loss) {
    if (l.host.load(std::memory_order_relaxed) == host) {
      if (when_ns > l.last_ns.load(std::memory_order_relaxed))
        l.last_ns.store(when_ns, std::memory_order_release);
      return;
    }
    if (l.last_ns.load(std::memory_order_relaxed) < oldest->last_ns.load(std::memory_order_relaxed))
      oldest = &l;
  }
  // Replaced while its time reads 0, so no reader pairs the old time with
  // the new host.
  oldest->last_ns.store(0, std::memory_order_release);
  oldest->host.store(host, std::memory_order_release);
  oldest->last_ns.store(when_ns, std::memory_order_release);
}

uint64_t HostId(std::string_view address) {
  constexpr std::string_view kMapped = "::ffff:";
  if (address.substr(0, kMapped.size()) == kMapped && address.find('.') != std::string_view::npos) {
    address.remove_prefix(kMapped.size());
  }
  uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a
  for (char c : address) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ULL;
  }
  return h | 1;
}

void DeviceProgressRegion::TookRequest(DeviceProgressSlot* slot) {
  if (!slot) return;
  slot->last_move_ns.store(MonotonicNanos(), std::memory_order_release);
  slot->requests.fetch_add(1, std::memory_order_acq_rel);
}

void DeviceProgressRegion::Moved(DeviceProgressSlot* slot) {
  if (slot) slot->last_move_ns.store(MonotonicNanos(), std::memory_order_release);
}

void ProgressCommunicator::Enter() {
  slot_->last_move_ns.store(MonotonicNanos(), std::memory_order_release);
  slot_->entered.fetch_add(1, std::memory_order_acq_rel);
}

void ProgressCommunicator::Leave() {
  slot_->last_move_ns.store(MonotonicNanos(), std::memory_order_release);
  slot_->left.fetch_add(1, std::memory_order_acq_rel);
}

Status ProgressCommunicator::AllReduceSum(float* data, size_t count) {
  Enter();
  Status st = inner_->AllReduceSum(data, count);
  Leave();
  return st;
}

Status ProgressCommunicator::AllReduceSum(int64_t* data, size_t count) {
  Enter();
  Status st = inner_->AllReduceSum(data, count);
  Leave();
  return st;
}

Status ProgressCommunicator::AllGather(const void* send, size_t bytes, void* recv) {
  Enter();
  Status st = inner_->AllGather(send, bytes, recv);
  Leave();
  return st;
}

Status ProgressCommunicator::Await(const std::function<Result<bool>()>& done) {
  Enter();
  Status st = inner_->Await(done);
  Leave();
  return st;
}

Status ProgressCommunicator::Barrier() {
  Enter();
  Status st = inner_->Barrier();
  Leave();
  return st;
}

}  // namespace failsafe
