// What the scheduler tests share: a model, requests, and a driver that checks
// the KV books after every step.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <vector>

#include "core/scheduler.h"
#include "model/synthetic.h"

namespace failsafe {

inline ModelConfig Model() { return *SyntheticPresetConfig("1b-llama"); }

inline std::vector<int> Range(int n) {
  std::vector<int> v(n);
  for (int i = 0; i < n; ++i) v[i] = i;
  return v;
}

inline std::unique_ptr<Sequence> Req(int64_t id, int prompt, int out, double arrival = 0) {
  auto s = std::make_unique<Sequence>();
  s->id = id;
  s->tokens.assign(prompt, 5);
  s->prompt_len = prompt;
  s->max_new_tokens = out;
  s->arrival = arrival;
  return s;
}

struct DriveResult {
  int steps = 0;
  int max_running = 0;
  int preemptions = 0;
  std::map<int64_t, int> outputs;
};

// The block manager's books: CheckInvariants (no page owned twice, owned +
// free ids = ids handed out, used <= capacity, reference counts and the
// evictable pages of the prefix cache); every running sequence has a table of
// exactly its blocks on every active device (its DP slots on its DP rank
// only), covering its computed tokens; waiting ones hold nothing; the pages
// the running sequences' tables name (a shared cached page once) are all the
// pages in use but the evictable cached ones.
inline void ExpectKvBooks(const Scheduler& s, const StepPlan* plan = nullptr) {
  const KvBlockManager& kv = s.kv();
  const Status st = kv.CheckInvariants();
  ASSERT_TRUE(st.ok()) << st.ToString();
  std::map<int, std::vector<char>> named;  // [device] -> [page] named by a table
  std::map<int, int64_t> held;             // distinct pages named
  for (const Sequence* q : s.Running()) {
    EXPECT_GE(q->kv_blocks * kv.block_size(), q->num_computed) << q->id;
    for (int d : kv.devices()) {
      const size_t slots = kv.Slots(d, q->dp_rank).size();
      const std::vector<int32_t>& table = kv.Table(q->id, d);
      EXPECT_EQ(table.size(), slots * q->kv_blocks) << q->id << " on " << d;
      std::vector<char>& seen = named[d];
      for (int32_t page : table) {
        if (page >= static_cast<int32_t>(seen.size())) seen.resize(page + 1, 0);
        if (!seen[page]++) held[d]++;
      }
    }
    // Shared blocks are read-only: the sequence computes past them.
    EXPECT_LE(kv.SharedBlocks(q->id) * kv.block_size(), q->num_computed) << q->id;
  }
  for (const Sequence* q : s.Waiting()) {
    for (int d : kv.devices()) EXPECT_TRUE(kv.Table(q->id, d).empty()) << q->id;
  }
  for (int d : kv.devices()) {
    EXPECT_LE(kv.used(d), kv.capacity(d)) << d;
    EXPECT_EQ(kv.used(d) - kv.evictable(d), held[d]) << d;
    EXPECT_EQ(kv.free(d) + kv.used(d) - kv.evictable(d), kv.capacity(d)) << d;
  }
  if (!plan) return;
  for (const ScheduledSeq& ss : plan->seqs) {
    const Sequence* q = s.Find(ss.seq_id);
    ASSERT_NE(q, nullptr);
    EXPECT_GE(q->kv_blocks * kv.block_size(), ss.start + ss.num_tokens) << ss.seq_id;
    EXPECT_LE(ss.kv_first_block, q->kv_blocks) << ss.seq_id;
    EXPECT_GE(ss.start, kv.SharedBlocks(ss.seq_id) * kv.block_size()) << ss.seq_id;
  }
}

// Drives a scheduler to completion, sampling token 7 everywhere.
inline DriveResult Drive(Scheduler& s, int max_steps = 100000) {
  DriveResult r;
  while (!s.idle() && r.steps < max_steps) {
    StepPlan p = s.Schedule();
    EXPECT_LE(p.num_tokens(), s.config().max_batch_tokens);
    // The step's logits fit the rows the devices have.
    int rows = 0;
    for (const ScheduledSeq& ss : p.seqs) {
      rows += ss.logits_rows;
      EXPECT_GE(ss.logits_rows, ss.sample ? 1 : 0);
      EXPECT_LE(ss.logits_rows, ss.num_tokens);
    }
    EXPECT_LE(rows, s.config().max_num_seqs);
    r.preemptions += static_cast<int>(p.preempted.size());
    r.max_running = std::max(r.max_running, s.num_running());
    ExpectKvBooks(s, &p);
    s.Update(p, std::vector<int32_t>(p.seqs.size(), 7));
    ExpectKvBooks(s);
    for (auto& f : s.TakeFinished()) r.outputs[f->id] = f->output_len();
    ++r.steps;
  }
  return r;
}

}  // namespace failsafe
