// The host tier of the prefix cache, as the scheduler sees it: full blocks
// whose KV a host copy holds for every (layer, KV head) slot, found by the
// block manager's chained hashes (core/kv_blocks.h). A block the host holds
// is copied into fresh device pages instead of being recomputed.
//
// Implemented by the host KV backup (engine/kv_backup.h). The scheduler only
// looks up; whoever runs the step names the blocks it copies (so they stay
// while the copy is in flight) before anything else can evict them.
//
// Thread-safety: the scheduler's thread only.
#pragma once

#include <cstdint>
#include <span>

namespace failsafe {

class PrefixHostTier {
 public:
  virtual ~PrefixHostTier() = default;
  // Leading entries of `hashes` (chained block hashes from block 0, in order)
  // whose blocks the host holds complete, each with the tokens of that block
  // in `tokens` (the sequence's, from position 0): a hash collision is not
  // a hit.
  virtual int HeldPrefix(std::span<const uint64_t> hashes,
                         std::span<const int32_t> tokens) const = 0;
};

}  // namespace failsafe
