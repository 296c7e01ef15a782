// The device's page store with shared (cached) blocks: a table may name
// pages another table holds only in its shared leading blocks, a page stays
// in use while any table names it, and a table's shared count cannot change.
#include "worker/kv_cache.h"

#include <gtest/gtest.h>

namespace failsafe {
namespace {

TEST(KvCache, SharedBlocksMayNameHeldPagesOthersMayNot) {
  KvCache kv(/*num_layers=*/1, /*num_kv_heads=*/2, /*block_size=*/4, /*head_dim=*/8,
             /*max_pages=*/16);
  const std::vector<int> slots = {0, 1};
  // Sequence 1: blocks 0 and 1 on pages {0, 1} and {2, 3}.
  const int32_t a[] = {0, 1, 2, 3};
  ASSERT_TRUE(kv.AddBlocks(1, slots, 0, 2, a).ok());
  EXPECT_EQ(kv.used_pages(), 4);
  // Sequence 2 shares block 0 (pages 0, 1) and has its own block 1.
  const int32_t b[] = {0, 1, 4, 5};
  ASSERT_TRUE(kv.AddBlocks(2, slots, 0, 2, b, /*shared_blocks=*/1).ok());
  EXPECT_EQ(kv.SharedBlocks(2), 1);
  EXPECT_EQ(kv.used_pages(), 6);  // shared pages once
  // Not declared shared: a held page is refused, and nothing changes.
  const int32_t c[] = {0, 1, 6, 7};
  EXPECT_FALSE(kv.AddBlocks(3, slots, 0, 2, c).ok());
  EXPECT_FALSE(kv.HasSeq(3));
  // A page held by another table past the shared blocks is refused too.
  const int32_t d[] = {0, 1, 2, 3};
  EXPECT_FALSE(kv.AddBlocks(3, slots, 0, 2, d, /*shared_blocks=*/1).ok());
  // The same table sent again must say the same shared blocks.
  EXPECT_FALSE(kv.AddBlocks(2, slots, 0, 2, b, /*shared_blocks=*/0).ok());
  EXPECT_TRUE(kv.AddBlocks(2, slots, 0, 2, b, /*shared_blocks=*/1).ok());
  // The shared pages stay in use until the last table naming them goes.
  kv.FreeSeq(1);
  EXPECT_EQ(kv.used_pages(), 4);
  const int32_t e[] = {2, 3};  // sequence 1's own pages are free again
  EXPECT_TRUE(kv.AddBlocks(4, slots, 0, 1, e).ok());
  kv.FreeSeq(2);
  kv.FreeSeq(4);
  EXPECT_EQ(kv.used_pages(), 0);
  EXPECT_TRUE(kv.AddBlocks(5, slots, 0, 1, a).ok());  // free pages: no sharing needed
}

}  // namespace
}  // namespace failsafe
