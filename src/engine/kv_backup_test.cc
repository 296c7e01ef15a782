#include "engine/kv_backup.h"

#include <gtest/gtest.h>

#include "model/synthetic.h"

namespace failsafe {
namespace {

constexpr int kBlock = 16;

struct Rig {
  ModelConfig config;
  Plan plan;
  std::unique_ptr<HostKvBackup> backup;
  std::vector<int> writers;  // of DP rank 0
};

// A backup of `blocks` blocks for tiny-llama on `devices` devices (hybrid).
std::unique_ptr<Rig> MakeRig(int blocks, int devices = 3, int max_seqs = 8) {
  auto rig = std::make_unique<Rig>();
  rig->config = *SyntheticPresetConfig("tiny-llama");
  std::vector<int> alive;
  for (int d = 0; d < devices; ++d) alive.push_back(d);
  rig->plan = *MakePlan(rig->config, Policy::kHybrid, devices, alive);
  const int64_t block_bytes = int64_t{2} * rig->config.num_layers * rig->config.num_kv_heads *
                              kBlock * rig->config.head_dim * 4;
  auto made = HostKvBackup::Create(rig->config, kBlock, blocks * block_bytes, max_seqs, devices);
  EXPECT_TRUE(made.ok()) << made.status().ToString();
  rig->backup = std::move(*made);
  rig->backup->SetPlan(rig->plan);
  std::vector<char> writes(devices, 0);
  for (int l = 0; l < rig->config.num_layers; ++l) {
    for (int h = 0; h < rig->config.num_kv_heads; ++h) writes[rig->plan.KvWriter(l, h, 0)] = 1;
  }
  for (int d = 0; d < devices; ++d) {
    if (writes[d]) rig->writers.push_back(d);
  }
  return rig;
}

// Hashes standing for the chained hashes of one prompt's blocks.
std::vector<uint64_t> Hashes(uint64_t prompt, int blocks) {
  std::vector<uint64_t> h;
  for (int b = 0; b < blocks; ++b) h.push_back(prompt * 1000 + static_cast<uint64_t>(b) + 1);
  return h;
}

// The tokens of one prompt's first `blocks` blocks (16 tokens each).
std::vector<int32_t> Tokens(uint64_t prompt, int blocks) {
  std::vector<int32_t> t;
  for (int i = 0; i < blocks * 16; ++i) t.push_back(static_cast<int32_t>(prompt * 7919 + i));
  return t;
}

// One step of `seq` (DP rank 0) over [start, end), copied by the devices in
// `copiers` as their backup writers would; returns the step's entry.
StepSeq RunStep(HostKvBackup& b, int64_t seq, int start, int end, std::span<const uint64_t> shared,
                const std::vector<int>& copiers, std::span<const int32_t> tokens = {}) {
  StepSeq st;
  st.seq_id = seq;
  st.start_pos = start;
  st.num_tokens = end - start;
  st.dp_rank = 0;
  std::vector<int32_t> blocks;
  b.Name(seq, shared, tokens, start);
  b.Prepare(seq, start, end, &st, &blocks);
  if (st.backup_slot >= 0) b.CopiedByStep(seq, copiers, std::min(st.backup_from, start), end);
  return st;
}

#define EXPECT_BOOKS(b) EXPECT_TRUE((b).CheckInvariants().ok()) << (b).CheckInvariants().ToString()

// A prefix two sequences share is backed up once: the second names the
// first's complete blocks, starts with its progress at the end of them and
// copies only what follows.
TEST(HostKvBackup, ASharedPrefixIsBackedUpOnce) {
  auto rig = MakeRig(16);
  HostKvBackup& b = *rig->backup;
  const std::vector<uint64_t> h = Hashes(1, 4);
  const std::vector<int32_t> t = Tokens(1, 5);
  RunStep(b, 1, 0, 70, {}, rig->writers);  // 4 full blocks and a partial one
  b.Settle(1, h, t);
  EXPECT_EQ(b.stats().indexed_blocks, 4);
  EXPECT_EQ(b.indexed_blocks(), 4);
  EXPECT_EQ(b.blocks_in_use(), 5);
  EXPECT_BOOKS(b);

  // A hit on its first 3 blocks.
  const StepSeq st = RunStep(b, 2, 48, 60, std::span(h).first(3), rig->writers, t);
  EXPECT_EQ(st.backup_from, 48);
  EXPECT_EQ(st.backup_first_block, 3);
  EXPECT_EQ(b.stats().shared_blocks, 3);
  EXPECT_EQ(b.blocks_in_use(), 6);  // one private block more, not four
  for (int i = 0; i < 3; ++i) EXPECT_EQ(b.Blocks(2)[i], b.Blocks(1)[i]);
  EXPECT_NE(b.Blocks(2)[3], b.Blocks(1)[3]);
  for (int d : rig->writers) EXPECT_EQ(b.Restorable(2, d), 60) << d;
  EXPECT_BOOKS(b);

  // The first finishes: the blocks the second names stay; its own complete
  // block stays cached (nobody names it); its partial block is freed.
  b.Release(1);
  EXPECT_EQ(b.blocks_in_use(), 4);
  EXPECT_EQ(b.indexed_blocks(), 4);
  EXPECT_EQ(b.available_blocks(), 12);
  EXPECT_BOOKS(b);
  b.Release(2);
  EXPECT_EQ(b.blocks_in_use(), 0);
  EXPECT_BOOKS(b);
}

// "Complete" is every writer's progress past the block: a block one writer
// has not copied is not indexed, and a hit on it starts the sharer's backup
// before it (the sharer's devices copy it from their pages).
TEST(HostKvBackup, ABlockIsCompleteOnlyWhenEveryWriterCopiedIt) {
  auto rig = MakeRig(16);
  ASSERT_GE(rig->writers.size(), 2u);
  HostKvBackup& b = *rig->backup;
  const std::vector<uint64_t> h = Hashes(2, 3);
  const std::vector<int32_t> t = Tokens(2, 4);
  const std::vector<int> all_but_last(rig->writers.begin(), rig->writers.end() - 1);
  RunStep(b, 1, 0, 32, {}, rig->writers);
  RunStep(b, 1, 32, 48, {}, all_but_last);  // the last writer lags
  b.Settle(1, h, t);
  EXPECT_EQ(b.indexed_blocks(), 2);
  const StepSeq st = RunStep(b, 2, 48, 50, h, rig->writers, t);
  EXPECT_EQ(b.stats().shared_blocks, 2);
  EXPECT_EQ(st.backup_from, 32);  // block 2 is copied from the sharer's pages
  EXPECT_EQ(st.backup_first_block, 2);
  for (int d : rig->writers) EXPECT_EQ(b.Restorable(2, d), 50) << d;
  // The lagging writer catches up: block 2 of the first becomes complete.
  RunStep(b, 1, 48, 49, {}, rig->writers);  // starts past its progress: claims nothing
  b.Settle(1, h, t);
  EXPECT_EQ(b.indexed_blocks(), 2);
  b.CopiedByStep(1, {rig->writers.back()}, 32, 49);
  b.Settle(1, h, t);
  EXPECT_EQ(b.indexed_blocks(), 3);
  // The sharer's copy of block 2 stays its own (the hash has a copy already).
  b.Settle(2, h, t);
  EXPECT_EQ(b.indexed_blocks(), 3);
  EXPECT_BOOKS(b);
}

// A tiny budget: blocks a running sequence names are never evicted; an
// indexed block nobody names is evicted, least recently used first, before a
// sequence goes without backup; with nothing free or evictable the rest of a
// sequence is not backed up.
TEST(HostKvBackup, ATinyBudgetNeverEvictsWhatARunningSequenceNeeds) {
  auto rig = MakeRig(6);
  HostKvBackup& b = *rig->backup;
  const std::vector<uint64_t> a = Hashes(1, 2), c = Hashes(3, 2);
  const std::vector<int32_t> ta = Tokens(1, 3), tc = Tokens(3, 3);
  RunStep(b, 1, 0, 32, {}, rig->writers);
  b.Settle(1, a, ta);
  RunStep(b, 3, 0, 32, {}, rig->writers);
  b.Settle(3, c, tc);
  b.Release(1);  // its two blocks stay cached, least recently used
  b.Release(3);
  EXPECT_EQ(b.indexed_blocks(), 4);
  // A sharer of prompt 3 names its blocks: they leave the LRU list.
  RunStep(b, 4, 32, 40, c, rig->writers, tc);
  EXPECT_EQ(b.blocks_in_use(), 3);
  EXPECT_BOOKS(b);
  // A long sequence takes the free block, then evicts prompt 1's blocks,
  // then finds nothing: prompt 3's blocks are named by sequence 4.
  RunStep(b, 5, 0, 100, {}, rig->writers);
  EXPECT_EQ(b.stats().evicted_blocks, 2);
  EXPECT_EQ(b.indexed_blocks(), 2);
  const std::vector<int32_t>& blocks = b.Blocks(5);
  ASSERT_EQ(blocks.size(), 7u);
  EXPECT_GE(blocks[2], 0);
  EXPECT_EQ(blocks[3], -1);
  for (int d : rig->writers) {
    EXPECT_EQ(b.Restorable(5, d), 48) << d;
    EXPECT_EQ(b.Restorable(4, d), 40) << d;
  }
  for (int32_t id : b.Blocks(4)) EXPECT_TRUE(std::count(blocks.begin(), blocks.end(), id) == 0);
  EXPECT_EQ(b.blocks_in_use(), 6);
  EXPECT_EQ(b.available_blocks(), 0);
  EXPECT_BOOKS(b);
  // A new sharer of prompt 3 still finds it.
  RunStep(b, 6, 32, 33, c, rig->writers, tc);
  EXPECT_EQ(b.Blocks(6)[0], b.Blocks(4)[0]);
  EXPECT_BOOKS(b);
  b.Release(4);
  b.Release(5);
  b.Release(6);
  EXPECT_EQ(b.blocks_in_use(), 0);
  EXPECT_BOOKS(b);
}

// A sequence rolled back past a block it names from the index writes that
// block again: it gets a private block, and the indexed one is untouched.
TEST(HostKvBackup, ARollbackNeverWritesAnIndexedBlock) {
  auto rig = MakeRig(16);
  HostKvBackup& b = *rig->backup;
  const std::vector<uint64_t> h = Hashes(5, 3);
  const std::vector<int32_t> t = Tokens(5, 4);
  RunStep(b, 1, 0, 48, {}, rig->writers);
  b.Settle(1, h, t);
  RunStep(b, 2, 48, 60, h, rig->writers, t);
  const std::vector<int32_t> before = b.Blocks(2);
  EXPECT_EQ(b.RolledBack(2, 40), 32);  // block 2 (positions 32-47) goes private
  const std::vector<int32_t>& after = b.Blocks(2);
  EXPECT_EQ(after[0], before[0]);
  EXPECT_EQ(after[1], before[1]);
  EXPECT_NE(after[2], before[2]);
  EXPECT_EQ(after[2] == b.Blocks(1)[2], false);
  EXPECT_EQ(after[3], before[3]);  // private already
  EXPECT_EQ(b.RolledBack(2, 32), 32);
  EXPECT_BOOKS(b);
  // One writer's progress is left at 0: the indexed blocks 0-1 hold every
  // slot, so it passes them rather than copy them again.
  for (int d : rig->writers) b.SetProgress(2, d, d == rig->writers[0] ? 0 : 32);
  b.SetPlan(rig->plan);
  b.Rebase(2, 0);
  EXPECT_EQ(b.Progress(2, rig->writers[0]), 32);
  const StepSeq st = RunStep(b, 2, 40, 41, {}, rig->writers);
  EXPECT_EQ(st.backup_from, 32);  // the rollback point's block is copied again
  EXPECT_EQ(st.backup_first_block, 2);
  for (int d : rig->writers) EXPECT_EQ(b.Restorable(2, d), 41) << d;
  EXPECT_BOOKS(b);
}

// A hit needs the block's tokens and its parent, not only its hash: a
// colliding hash with other tokens, or the same block after another parent,
// finds nothing in the host tier, and a sequence names nothing of it.
TEST(HostKvBackup, AHashCollisionIsNotAHit) {
  auto rig = MakeRig(16);
  HostKvBackup& b = *rig->backup;
  const std::vector<uint64_t> h = Hashes(1, 3);
  const std::vector<int32_t> t = Tokens(1, 4);
  RunStep(b, 1, 0, 50, {}, rig->writers);
  b.Settle(1, h, t);
  ASSERT_EQ(b.indexed_blocks(), 3);
  EXPECT_EQ(b.HeldPrefix(h, t), 3);
  // Other tokens in block 1 under the same hashes.
  std::vector<int32_t> other = t;
  other[20] += 1;
  EXPECT_EQ(b.HeldPrefix(h, other), 1);
  // Block 2's hash after another block 1 (its parent differs).
  std::vector<uint64_t> reparented = h;
  reparented[1] = 77;
  EXPECT_EQ(b.HeldPrefix(reparented, t), 1);
  // Too few tokens for the block: no hit either.
  EXPECT_EQ(b.HeldPrefix(h, std::span(t).first(40)), 2);
  // A sequence with the colliding tokens names only what matches, and
  // copies the rest itself.
  const StepSeq st = RunStep(b, 2, 48, 50, h, rig->writers, other);
  EXPECT_EQ(b.stats().shared_blocks, 1);
  EXPECT_EQ(st.backup_from, 16);
  EXPECT_NE(b.Blocks(2)[1], b.Blocks(1)[1]);
  EXPECT_BOOKS(b);
}

}  // namespace
}  // namespace failsafe
