#include <gtest/gtest.h>

#include <algorithm>

#include "common/rng.h"
#include "model/config.h"
#include "model/published.h"
#include "model/synthetic.h"
#include "placement/plan.h"
#include "placement/plan_json.h"
#include "placement/plan_stats.h"
#include "placement/replan.h"

namespace failsafe {
namespace {

ModelConfig Micro(const std::string& preset, int heads, int kv_heads) {
  SyntheticModelOptions o;
  o.preset = preset;
  o.num_heads = heads;
  o.num_kv_heads = kv_heads;
  return *SyntheticConfig(o);
}

// Models with 1, 2, 3, 4 and 8 head groups of 1 to 8 query heads, dense and MoE.
std::vector<ModelConfig> Models() {
  return {*SyntheticPresetConfig("tiny-llama"),
          *SyntheticPresetConfig("tiny-mixtral"),
          *SyntheticPresetConfig("1b-llama"),
          *PublishedModelConfig("llama-3.1-70b"),
          *PublishedModelConfig("mixtral-8x22b"),
          *SyntheticPresetConfig("stories-260k"),
          Micro("micro-llama", 4, 1),
          Micro("micro-mixtral", 2, 1),
          Micro("micro-llama", 6, 2),
          Micro("micro-llama", 6, 3),
          Micro("micro-mixtral", 3, 3),
          Micro("micro-llama", 8, 8)};
}

constexpr int kMaxDevices = 12;

std::vector<int> Range(int n) {
  std::vector<int> v(n);
  for (int i = 0; i < n; ++i) v[i] = i;
  return v;
}

bool StandardAllows(const ModelConfig& c, int tp) {
  const bool kv = tp <= c.num_kv_heads ? c.num_kv_heads % tp == 0 : tp % c.num_kv_heads == 0;
  return c.num_heads % tp == 0 && c.intermediate_size % tp == 0 && kv;
}

// Per-policy balance bounds of a plan (fresh or replanned).
void ExpectBalanced(const Plan& p, const ModelConfig& c, bool fresh) {
  ASSERT_TRUE(ValidatePlan(p).ok()) << ValidatePlan(p).ToString();
  const int n = static_cast<int>(p.active.size()), h = c.num_kv_heads, g = c.group_size();
  const bool replicated = p.policy != Policy::kHybrid && n > h;
  EXPECT_EQ(p.max_replicas() > 1, replicated && g > 1);
  std::vector<int> totals, query_totals;
  for (int d : p.active) {
    totals.push_back(p.num_tp_heads_total(d));
    query_totals.push_back(p.num_tp_queries_total(d));
  }
  for (int l = 0; l < c.num_layers; ++l) {
    const LayerPlan& lp = p.layers[l];
    int lo = 1 << 30, hi = 0;
    for (int d : p.active) {
      lo = std::min<int>(lo, lp.tp_heads[d].size());
      hi = std::max<int>(hi, lp.tp_heads[d].size());
    }
    if (p.policy == Policy::kHybrid) {
      EXPECT_EQ(lo, h / n);
      EXPECT_EQ(hi, h / n);
      EXPECT_EQ(static_cast<int>(lp.dp_heads.size()), h % n);
    } else if (!replicated) {
      EXPECT_TRUE(lp.dp_heads.empty());
      EXPECT_LE(hi - lo, 1) << "layer " << l;
      for (int d : p.active) EXPECT_EQ(lp.tp_queries[d].size(), lp.tp_heads[d].size() * g);
    } else {
      // One head group per device (none past H * G devices); devices per
      // group within one; query heads per device of a group within one.
      EXPECT_TRUE(lp.dp_heads.empty());
      EXPECT_LE(hi, 1);
      int holding = 0;
      for (int d : p.active) holding += static_cast<int>(lp.tp_heads[d].size());
      EXPECT_EQ(holding, std::min(n, h * g)) << "layer " << l;
      int rlo = 1 << 30, rhi = 0;
      for (int k = 0; k < h; ++k) {
        const auto holders = p.TpHolders(l, k);
        rlo = std::min<int>(rlo, holders.size());
        rhi = std::max<int>(rhi, holders.size());
        int qlo = 1 << 30, qhi = 0;
        for (int d : holders) {
          qlo = std::min<int>(qlo, lp.tp_queries[d].size());
          qhi = std::max<int>(qhi, lp.tp_queries[d].size());
        }
        EXPECT_LE(qhi - qlo, 1) << "layer " << l << " group " << k;
      }
      EXPECT_LE(rhi - rlo, 1) << "layer " << l;
    }
    for (int e = 0; e < p.shape.expert_slots; ++e) {
      int slo = 1 << 30, shi = 0;
      for (int d : p.active) {
        int k = 0;
        for (int s : lp.ffn_shards[d]) k += p.shape.ShardExpert(s) == e;
        slo = std::min(slo, k);
        shi = std::max(shi, k);
      }
      EXPECT_LE(shi - slo, 1) << "layer " << l << " expert " << e;
    }
  }
  if (p.policy == Policy::kNonUniform && (fresh || n <= h * g)) {
    for (int d : p.active) {
      for (int l = 1; l < c.num_layers; ++l)
        EXPECT_EQ(p.layers[l].tp_heads[d].size(), p.layers[0].tp_heads[d].size());
    }
  }
  if (p.policy == Policy::kCyclic) {
    auto [mn, mx] = std::minmax_element(totals.begin(), totals.end());
    EXPECT_LE(*mx - *mn, fresh ? 1 : 2) << "cyclic KV per token is uneven";
    if (replicated && fresh) {
      auto [qmn, qmx] = std::minmax_element(query_totals.begin(), query_totals.end());
      EXPECT_LE(*qmx - *qmn, g) << "cyclic attention work is uneven";
    }
  }
  if (p.policy == Policy::kStandard) {
    EXPECT_TRUE(StandardAllows(c, n)) << n;
    for (int t = n + 1; t <= static_cast<int>(p.alive.size()); ++t)
      EXPECT_FALSE(StandardAllows(c, t)) << "a larger TP size " << t << " was allowed";
  }
  int clo = 1 << 30, chi = 0;
  for (int d : p.active) {
    clo = std::min<int>(clo, p.vocab_chunks[d].size());
    chi = std::max<int>(chi, p.vocab_chunks[d].size());
  }
  EXPECT_LE(chi - clo, 1);
}

TEST(Plan, FreshPlansAreValidAndBalanced) {
  for (const auto& c : Models()) {
    for (Policy policy :
         {Policy::kStandard, Policy::kNonUniform, Policy::kCyclic, Policy::kHybrid}) {
      for (int n = 1; n <= kMaxDevices; ++n) {
        auto p = MakePlan(c, policy, kMaxDevices, Range(n));
        ASSERT_TRUE(p.ok()) << p.status().ToString();
        SCOPED_TRACE(std::string(PolicyName(policy)) + " n=" + std::to_string(n) +
                     " kv=" + std::to_string(c.num_kv_heads) + " q=" + std::to_string(c.num_heads));
        ExpectBalanced(*p, c, true);
        if (policy != Policy::kStandard) {
          EXPECT_EQ(static_cast<int>(p->active.size()), n);
        }
      }
    }
  }
}

TEST(Plan, StandardFallsBackToPowersOfTwo) {
  auto c = *SyntheticPresetConfig("tiny-llama");
  EXPECT_EQ(MakePlan(c, Policy::kStandard, 8, Range(7))->active.size(), 4u);
  EXPECT_EQ(MakePlan(c, Policy::kStandard, 8, Range(6))->active.size(), 4u);
  EXPECT_EQ(MakePlan(c, Policy::kStandard, 8, Range(3))->active.size(), 2u);
  EXPECT_EQ(MakePlan(c, Policy::kStandard, 8, Range(8))->active.size(), 8u);
}

// vLLM's rules past the head group count: TP sizes that are multiples of it
// and divide the query heads (and the FFN); rank r holds KV head r / (tp / H)
// and query heads [r * Hq / tp, (r + 1) * Hq / tp).
TEST(Plan, StandardReplicatesKvHeadsLikeVllm) {
  auto c = Micro("micro-llama", 8, 4);  // FFN 96
  auto p = MakePlan(c, Policy::kStandard, 12, Range(12));
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  ASSERT_EQ(p->active.size(), 8u);  // 12..9 do not divide 8 query heads
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(p->layers[0].tp_heads[r], std::vector<int>{r / 2});
    EXPECT_EQ(p->layers[0].tp_queries[r], std::vector<int>{r});
  }
  EXPECT_EQ(p->max_replicas(), 2);
  // stories260K's FFN of 172 does not split over 8 devices: TP4, as vLLM would.
  EXPECT_EQ(MakePlan(*SyntheticPresetConfig("stories-260k"), Policy::kStandard, 8, Range(8))
                ->active.size(),
            4u);
  // Three head groups of two: 3 and 6 devices are valid, 2, 4 and 5 are not.
  auto three = Micro("micro-llama", 6, 3);
  for (auto [alive, tp] : std::vector<std::pair<int, int>>{{2, 1}, {3, 3}, {5, 3}, {6, 6}, {8, 6}})
    EXPECT_EQ(MakePlan(three, Policy::kStandard, 8, Range(alive))->active.size(),
              static_cast<size_t>(tp))
        << alive;
}

// More devices than head groups: nonuniform splits a group's query heads over
// its replicas; hybrid turns every head into a DP head.
TEST(Plan, MoreDevicesThanHeadGroups) {
  auto c = *SyntheticPresetConfig("stories-260k");  // 4 groups of 2 query heads
  auto nu = MakePlan(c, Policy::kNonUniform, 8, Range(6));
  ASSERT_TRUE(nu.ok()) << nu.status().ToString();
  const std::vector<std::vector<int>> heads = {{0}, {0}, {1}, {1}, {2}, {3}, {}, {}};
  const std::vector<std::vector<int>> queries = {{0}, {1}, {2}, {3}, {4, 5}, {6, 7}, {}, {}};
  for (int l = 0; l < c.num_layers; ++l) {
    EXPECT_EQ(nu->layers[l].tp_heads, heads);
    EXPECT_EQ(nu->layers[l].tp_queries, queries);
  }
  // The KV of a replicated group goes to the backup once, by one holder
  // (which one alternates with the layer); a DP head's by its DP rank.
  EXPECT_EQ(nu->KvWriter(0, 0, 5), 0);
  EXPECT_EQ(nu->KvWriter(1, 0, 5), 1);
  EXPECT_EQ(nu->KvWriter(1, 3, 0), 5);
  // Six devices cache six groups' KV per layer: 1.5 times the model's.
  const PlanBalance nb = BalanceOf(*nu, c);
  EXPECT_EQ(nb.max_replicas, 2);
  EXPECT_NEAR(nb.kv_held_over_model, 1.5, 1e-9);
  EXPECT_NEAR(nb.kv_over_mean, 1.0, 1e-9);
  EXPECT_GT(nb.compute_over_mean, 1.0);  // the devices of unreplicated groups compute two heads
  EXPECT_NE(PlanReportJson(*nu, c).find("\"tp_query_heads\":5"), std::string::npos);

  auto hy = MakePlan(c, Policy::kHybrid, 8, Range(5));
  ASSERT_TRUE(hy.ok());
  for (const auto& l : hy->layers) {
    EXPECT_EQ(l.dp_heads, (std::vector<int>{0, 1, 2, 3}));
    for (int d = 0; d < 5; ++d) EXPECT_TRUE(l.tp_heads[d].empty());
  }
  EXPECT_EQ(hy->KvWriter(2, 1, 4), 4);
  auto costs = PlanCosts(*hy, c);
  EXPECT_EQ(costs[0].tp_kv_bytes_per_token, 0);
  EXPECT_EQ(costs[0].dp_kv_bytes_per_token, c.KvBytesPerToken());
  EXPECT_NEAR(BalanceOf(*hy, c).kv_held_over_model, 1.0, 1e-9);

  // Past H * G devices (8 query heads, 12 devices) some devices compute no
  // attention; cyclic rotates which ones.
  auto cy = MakePlan(c, Policy::kCyclic, 12, Range(12));
  ASSERT_TRUE(cy.ok());
  std::vector<int> idle_layers(12, 0);
  for (const auto& l : cy->layers) {
    for (int d = 0; d < 12; ++d) idle_layers[d] += l.tp_heads[d].empty();
  }
  EXPECT_LE(*std::max_element(idle_layers.begin(), idle_layers.end()), 2);
  EXPECT_NE(PlanReport(*cy, c).find("replicated on up to 2 devices"), std::string::npos);
  EXPECT_NE(PlanReport(*hy, c).find("pure DP attention"), std::string::npos);
}

TEST(Plan, HybridSevenDevicesHasOneDpHeadPerLayer) {
  auto c = *SyntheticPresetConfig("1b-llama");
  auto p = MakePlan(c, Policy::kHybrid, 8, Range(7));
  ASSERT_TRUE(p.ok());
  for (auto& l : p->layers) EXPECT_EQ(l.dp_heads.size(), 1u);
  auto costs = PlanCosts(*p, c);
  for (auto& dc : costs) {
    EXPECT_EQ(dc.tp_kv_bytes_per_token, costs[0].tp_kv_bytes_per_token);
    EXPECT_DOUBLE_EQ(dc.tp_attn_flops_per_token, costs[0].tp_attn_flops_per_token);
    EXPECT_GT(dc.dp_kv_bytes_per_token, 0);
  }
  // Nonuniform: device 0 holds two heads in every layer, twice the KV of the others.
  auto nu = PlanCosts(*MakePlan(c, Policy::kNonUniform, 8, Range(7)), c);
  EXPECT_EQ(nu[0].tp_kv_bytes_per_token, 2 * nu[1].tp_kv_bytes_per_token);
  // Cyclic: even KV per token.
  auto cy = PlanCosts(*MakePlan(c, Policy::kCyclic, 8, Range(7)), c);
  int64_t lo = INT64_MAX, hi = 0;
  for (auto& dc : cy) {
    lo = std::min(lo, dc.tp_kv_bytes_per_token);
    hi = std::max(hi, dc.tp_kv_bytes_per_token);
  }
  EXPECT_LE(hi - lo, 2 * 64 * 4);
}

TEST(Plan, BadRequestsAreRefused) {
  auto c = *SyntheticPresetConfig("tiny-llama");
  EXPECT_EQ(MakePlan(c, Policy::kHybrid, 0, {}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(MakePlan(c, Policy::kHybrid, 8, {}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(MakePlan(c, Policy::kHybrid, 8, {0, 8}).status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(MakePlan(c, Policy::kHybrid, 8, {1, 1}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(ParsePolicy("fancy").ok());
}

TEST(Plan, JsonRoundTrip) {
  for (const auto& c : Models()) {
    auto p = MakePlan(c, Policy::kHybrid, 8, {0, 2, 3, 5, 6});
    ASSERT_TRUE(p.ok());
    auto back = PlanFromJson(PlanToJson(*p));
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_TRUE(*back == *p);
  }
  EXPECT_FALSE(PlanFromJson("{\"policy\": \"hybrid\"}").ok());
}

// One seeded failure or rejoin among kMaxDevices devices: a device of
// `alive` fails (never the last), or a dead one comes back.
struct AliveChange {
  std::vector<int> alive;  // after the change, ascending
  bool fail = false;
  int device = -1;
};
AliveChange NextChange(const std::vector<int>& alive, Rng& rng) {
  AliveChange c{alive};
  std::vector<int> dead;
  for (int d = 0; d < kMaxDevices; ++d) {
    if (!std::binary_search(alive.begin(), alive.end(), d)) dead.push_back(d);
  }
  c.fail = alive.size() > 1 && (dead.empty() || rng.Below(2) == 0);
  if (c.fail) {
    c.device = alive[rng.Below(alive.size())];
    std::erase(c.alive, c.device);
  } else {
    c.device = dead[rng.Below(dead.size())];
    c.alive.push_back(c.device);
    std::sort(c.alive.begin(), c.alive.end());
  }
  return c;
}

// Head groups of one layer with no surviving device in `next` (TP groups
// only: a DP head lives on every device).
int OrphanedGroups(const Plan& prev, const Plan& next, int layer) {
  int orphans = 0;
  for (int h = 0; h < prev.shape.num_kv_heads; ++h) {
    if (prev.IsDpHead(layer, h)) continue;
    bool survives = false;
    for (int d : prev.TpHolders(layer, h)) survives |= next.IsActive(d);
    orphans += !survives;
  }
  return orphans;
}

// Failures and rejoins in a seeded random order: every plan stays valid and
// balanced. With whole head groups survivors never pass items among
// themselves; with replicated groups a survivor leaves its group only when
// another group is left without any device, and a failure moves at most that
// device's query heads between survivors.
TEST(Replan, MinimalMovementThroughFailuresAndRejoins) {
  for (const auto& c : Models()) {
    for (Policy policy :
         {Policy::kNonUniform, Policy::kCyclic, Policy::kHybrid, Policy::kStandard}) {
      SCOPED_TRACE(std::string(PolicyName(policy)) + " kv=" + std::to_string(c.num_kv_heads) +
                   " q=" + std::to_string(c.num_heads));
      Rng rng(static_cast<uint64_t>(policy) * 100 + c.num_layers + c.num_kv_heads);
      auto plan = MakePlan(c, policy, kMaxDevices, Range(kMaxDevices));
      ASSERT_TRUE(plan.ok());
      Plan cur = *plan;
      for (int event = 0; event < 24; ++event) {
        const AliveChange change = NextChange(cur.alive, rng);
        const std::vector<int>& alive = change.alive;
        const bool fail = change.fail;
        const int changed = change.device;
        SCOPED_TRACE((fail ? "fail " : "rejoin ") + std::to_string(changed) + " to " +
                     std::to_string(alive.size()));
        auto next = Replan(cur, c, alive);
        ASSERT_TRUE(next.ok()) << next.status().ToString();
        ExpectBalanced(*next, c, false);
        if (policy == Policy::kStandard) {
          cur = *next;
          continue;
        }
        PlanDiff diff = DiffPlans(cur, *next);
        const bool whole = cur.max_replicas() <= 1 && next->max_replicas() <= 1;
        if (whole) {
          EXPECT_EQ(diff.moved_between_survivors, 0);
        }
        int orphans = 0;
        for (int l = 0; l < c.num_layers; ++l) {
          const int layer_orphans = OrphanedGroups(cur, *next, l);
          orphans += layer_orphans;
          // Survivors that stop computing a group they computed for another.
          int switched = 0;
          for (int d : next->active) {
            if (!cur.IsActive(d)) continue;
            bool lost = false, gained = false;
            for (int h : cur.layers[l].tp_heads[d]) lost |= !next->HoldsTpHead(d, l, h);
            for (int h : next->layers[l].tp_heads[d]) gained |= !cur.HoldsTpHead(d, l, h);
            switched += lost && gained;
          }
          if (!whole && fail) {
            EXPECT_LE(switched, layer_orphans) << "layer " << l;
          }
          if (!whole && !fail && cur.active.size() >= static_cast<size_t>(c.num_kv_heads)) {
            EXPECT_EQ(switched, 0) << "layer " << l;
          }
        }
        if (!whole && fail) {
          EXPECT_LE(diff.moved_between_survivors, orphans * c.group_size());
        }
        if (fail) {
          // Survivors drop nothing when a device fails.
          for (int d : next->active) {
            EXPECT_TRUE(diff.dropped_shards[d].empty());
            EXPECT_TRUE(diff.dropped_chunks[d].empty());
          }
        }
        cur = *next;
      }
    }
  }
}

// An engine that chooses hybrid attention or cyclic placement by device
// count changes policy as devices fail and rejoin: every plan is valid and
// balanced for its policy, survivors keep every FFN shard and vocabulary
// chunk on a failure, with whole groups no item moves between survivors, and
// leaving hybrid, survivors keep their TP heads while the DP head groups
// become TP heads.
TEST(Replan, ChangingPolicyWithTheDeviceCount) {
  for (const auto& c : Models()) {
    SCOPED_TRACE("kv=" + std::to_string(c.num_kv_heads) + " q=" + std::to_string(c.num_heads));
    Rng rng(7 + c.num_layers + c.num_kv_heads);
    auto choose = [](size_t alive) { return alive % 2 == 1 ? Policy::kHybrid : Policy::kCyclic; };
    auto plan = MakePlan(c, choose(kMaxDevices), kMaxDevices, Range(kMaxDevices));
    ASSERT_TRUE(plan.ok());
    Plan cur = *plan;
    int changes = 0;
    for (int event = 0; event < 24; ++event) {
      const AliveChange change = NextChange(cur.alive, rng);
      const std::vector<int>& alive = change.alive;
      const bool fail = change.fail;
      const Policy policy = choose(alive.size());
      SCOPED_TRACE(std::string(fail ? "fail" : "rejoin") + " to " + std::to_string(alive.size()) +
                   " " + PolicyName(policy));
      auto next = Replan(cur, c, alive, nullptr, policy);
      ASSERT_TRUE(next.ok()) << next.status().ToString();
      ASSERT_EQ(next->policy, policy);
      ExpectBalanced(*next, c, false);
      changes += next->policy != cur.policy;
      const PlanDiff diff = DiffPlans(cur, *next);
      const bool whole = cur.max_replicas() <= 1 && next->max_replicas() <= 1;
      if (whole) {
        EXPECT_EQ(diff.moved_between_survivors, 0);
      }
      if (fail) {
        for (int d : next->active) {
          EXPECT_TRUE(diff.dropped_shards[d].empty());
          EXPECT_TRUE(diff.dropped_chunks[d].empty());
        }
      }
      if (fail && whole && cur.policy == Policy::kHybrid && policy != Policy::kHybrid) {
        for (int l = 0; l < c.num_layers; ++l) {
          for (int d : next->active) {
            for (int h : cur.layers[l].tp_heads[d]) {
              EXPECT_TRUE(next->HoldsTpHead(d, l, h));
            }
          }
          for (int h : cur.layers[l].dp_heads) {
            EXPECT_EQ(next->TpHolders(l, h).size(), 1u);
          }
        }
      }
      cur = *next;
    }
    EXPECT_GT(changes, 4);
  }
}

TEST(Replan, HybridTurnsTheDeadDevicesHeadIntoTheDpHead) {
  auto c = *SyntheticPresetConfig("1b-llama");
  auto eight = MakePlan(c, Policy::kHybrid, 8, Range(8));
  ASSERT_TRUE(eight.ok());
  auto seven = Replan(*eight, c, {0, 1, 2, 4, 5, 6, 7});
  ASSERT_TRUE(seven.ok());
  for (int l = 0; l < c.num_layers; ++l) {
    EXPECT_EQ(seven->layers[l].dp_heads, eight->layers[l].tp_heads[3]);
    for (int d : seven->active)
      EXPECT_EQ(seven->layers[l].tp_heads[d], eight->layers[l].tp_heads[d]);
  }
  // Rejoin: the DP head goes back to the returning device as a TP head.
  auto back = Replan(*seven, c, Range(8));
  ASSERT_TRUE(back.ok());
  for (int l = 0; l < c.num_layers; ++l) {
    EXPECT_TRUE(back->layers[l].dp_heads.empty());
    EXPECT_EQ(back->layers[l].tp_heads[3], seven->layers[l].dp_heads);
  }
}

}  // namespace
}  // namespace failsafe
