#include "core/kv_accounting.h"

#include "common/check.h"

namespace failsafe {

const char* FinishReasonName(FinishReason r) {
  switch (r) {
    case FinishReason::kNone:
      return "none";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kAborted:
      return "abort";
    case FinishReason::kError:
      return "error";
  }
  return "?";
}

KvAccounting::KvAccounting(const Plan& plan, int block_size, std::vector<int64_t> capacity_pages)
    : block_size_(block_size) {
  Reconfigure(plan, std::move(capacity_pages), {});
}

void KvAccounting::Reconfigure(const Plan& plan, std::vector<int64_t> capacity_pages,
                               const std::vector<const Sequence*>& live) {
  devices_ = plan.active;
  tp_slots_.assign(plan.num_devices, 0);
  for (int d : plan.active) tp_slots_[d] = plan.num_tp_heads_total(d);
  dp_slots_ = plan.num_dp_heads_total();
  capacity_ = std::move(capacity_pages);
  capacity_.resize(plan.num_devices, 0);
  used_.assign(plan.num_devices, 0);
  for (const Sequence* s : live) {
    for (int d : devices_)
      used_[d] += static_cast<int64_t>(s->kv_blocks) * PagesPerBlock(d, s->dp_rank);
  }
}

bool KvAccounting::CanGrow(const Sequence& s, int tokens, int64_t keep_free) const {
  const int add = BlocksFor(tokens) - s.kv_blocks;
  if (add <= 0) return true;
  for (int d : devices_) {
    if (used_[d] + add * PagesPerBlock(d, s.dp_rank) + keep_free > capacity_[d]) return false;
  }
  return true;
}

bool KvAccounting::Fits(int dp_rank, int blocks, int tokens, const std::vector<int64_t>& pending,
                        const std::vector<int64_t>& keep_free) const {
  const int add = BlocksFor(tokens) - blocks;
  if (add <= 0) return true;
  for (int d : devices_) {
    if (used_[d] + pending[d] + add * PagesPerBlock(d, dp_rank) + keep_free[d] > capacity_[d])
      return false;
  }
  return true;
}

void KvAccounting::AddPending(int dp_rank, int blocks, int tokens,
                              std::vector<int64_t>* pending) const {
  const int add = BlocksFor(tokens) - blocks;
  if (add <= 0) return;
  for (int d : devices_) (*pending)[d] += add * PagesPerBlock(d, dp_rank);
}

bool KvAccounting::FitsAlone(int dp_rank, int tokens) const {
  for (int d : devices_) {
    if (BlocksFor(tokens) * PagesPerBlock(d, dp_rank) > capacity_[d]) return false;
  }
  return true;
}

void KvAccounting::Grow(Sequence& s, int tokens) {
  const int add = BlocksFor(tokens) - s.kv_blocks;
  if (add <= 0) return;
  for (int d : devices_) used_[d] += add * PagesPerBlock(d, s.dp_rank);
  s.kv_blocks += add;
}

void KvAccounting::Release(Sequence& s) {
  for (int d : devices_) {
    used_[d] -= static_cast<int64_t>(s.kv_blocks) * PagesPerBlock(d, s.dp_rank);
    FS_CHECK(used_[d] >= 0);
  }
  s.kv_blocks = 0;
}

bool KvAccounting::OverCapacity() const {
  for (int d : devices_) {
    if (used_[d] > capacity_[d]) return true;
  }
  return false;
}

}  // namespace failsafe
