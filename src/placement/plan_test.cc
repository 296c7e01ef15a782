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

std::vector<ModelConfig> Models() {
  return {*SyntheticPresetConfig("tiny-llama"), *SyntheticPresetConfig("tiny-mixtral"),
          *SyntheticPresetConfig("1b-llama"), *PublishedModelConfig("llama-3.1-70b"),
          *PublishedModelConfig("mixtral-8x22b")};
}

std::vector<int> Range(int n) {
  std::vector<int> v(n);
  for (int i = 0; i < n; ++i) v[i] = i;
  return v;
}

// Per-policy balance bounds of a plan (fresh or replanned).
void ExpectBalanced(const Plan& p, const ModelConfig& c, bool fresh) {
  ASSERT_TRUE(ValidatePlan(p).ok()) << ValidatePlan(p).ToString();
  const int n = static_cast<int>(p.active.size()), h = c.num_kv_heads;
  std::vector<int> totals;
  for (int d : p.active) totals.push_back(p.num_tp_heads_total(d));
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
    } else {
      EXPECT_TRUE(lp.dp_heads.empty());
      EXPECT_LE(hi - lo, 1) << "layer " << l;
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
  if (p.policy == Policy::kNonUniform) {
    for (int d : p.active) {
      for (int l = 1; l < c.num_layers; ++l)
        EXPECT_EQ(p.layers[l].tp_heads[d].size(), p.layers[0].tp_heads[d].size());
    }
  }
  if (p.policy == Policy::kCyclic) {
    auto [mn, mx] = std::minmax_element(totals.begin(), totals.end());
    EXPECT_LE(*mx - *mn, fresh ? 1 : 2) << "cyclic KV per token is uneven";
  }
  if (p.policy == Policy::kStandard) {
    EXPECT_EQ(n & (n - 1), 0);
    EXPECT_EQ(h % n, 0);
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
      for (int n = 1; n <= 8; ++n) {
        auto p = MakePlan(c, policy, 8, Range(n));
        ASSERT_TRUE(p.ok()) << p.status().ToString();
        SCOPED_TRACE(std::string(PolicyName(policy)) + " n=" + std::to_string(n));
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
  EXPECT_EQ(MakePlan(c, Policy::kHybrid, 16, Range(9)).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(MakePlan(c, Policy::kStandard, 16, Range(16)).status().code(),
            StatusCode::kInvalidArgument);
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

// Failures and rejoins in a seeded random order: every plan stays valid and
// balanced, and survivors never pass items among themselves.
TEST(Replan, MinimalMovementThroughFailuresAndRejoins) {
  for (const auto& c : Models()) {
    for (Policy policy :
         {Policy::kNonUniform, Policy::kCyclic, Policy::kHybrid, Policy::kStandard}) {
      SCOPED_TRACE(PolicyName(policy));
      Rng rng(static_cast<uint64_t>(policy) * 100 + c.num_layers);
      auto plan = MakePlan(c, policy, 8, Range(8));
      ASSERT_TRUE(plan.ok());
      Plan cur = *plan;
      for (int event = 0; event < 12; ++event) {
        std::vector<int> alive = cur.alive;
        std::vector<int> dead;
        for (int d = 0; d < 8; ++d) {
          if (!std::binary_search(alive.begin(), alive.end(), d)) dead.push_back(d);
        }
        const bool fail = alive.size() > 2 && (dead.empty() || rng.Below(2) == 0);
        int changed;
        if (fail) {
          changed = alive[rng.Below(alive.size())];
          std::erase(alive, changed);
        } else {
          changed = dead[rng.Below(dead.size())];
          alive.push_back(changed);
          std::sort(alive.begin(), alive.end());
        }
        auto next = Replan(cur, c, alive);
        ASSERT_TRUE(next.ok()) << next.status().ToString();
        ExpectBalanced(*next, c, false);
        PlanDiff diff = DiffPlans(cur, *next);
        if (policy != Policy::kStandard) {
          EXPECT_EQ(diff.moved_between_survivors, 0) << (fail ? "fail " : "rejoin ") << changed;
        }
        if (fail && policy != Policy::kStandard) {
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
