// Replan with per-device weights (a slow device gets a smaller share): shares
// in proportion to the weights for every model shape and policy, with
// minimal movement, and back to even shares without weights.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "model/config.h"
#include "model/synthetic.h"
#include "placement/plan.h"
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

std::vector<ModelConfig> Models() {
  return {*SyntheticPresetConfig("tiny-llama"), *SyntheticPresetConfig("tiny-mixtral"),
          *SyntheticPresetConfig("stories-260k"), Micro("micro-llama", 8, 2),
          Micro("micro-llama", 6, 3)};
}

std::vector<int> Range(int n) {
  std::vector<int> v(n);
  std::iota(v.begin(), v.end(), 0);
  return v;
}

// Per layer and expert, each device holds its quota of FFN shards rounded up
// or down; likewise vocabulary chunks.
void ExpectProportional(const Plan& p, const std::vector<double>& w) {
  // Every FFN shard and vocabulary chunk on exactly one device.
  for (int l = 0; l < p.shape.num_layers; ++l) {
    std::vector<int> seen(p.shape.num_shards(), 0);
    for (int d : p.active) {
      for (int s : p.layers[l].ffn_shards[d]) seen[s]++;
    }
    for (int s = 0; s < p.shape.num_shards(); ++s)
      EXPECT_EQ(seen[s], 1) << "layer " << l << " shard " << s;
  }
  std::vector<int> chunks(p.shape.vocab_chunks, 0);
  for (int d : p.active) {
    for (int c : p.vocab_chunks[d]) chunks[c]++;
  }
  for (int c = 0; c < p.shape.vocab_chunks; ++c) EXPECT_EQ(chunks[c], 1) << "chunk " << c;
  double total = 0;
  for (int d : p.active) total += w[d];
  const int spe = p.shape.shards_per_expert;
  for (int l = 0; l < p.shape.num_layers; ++l) {
    for (int e = 0; e < p.shape.expert_slots; ++e) {
      for (int d : p.active) {
        int held = 0;
        for (int s : p.layers[l].ffn_shards[d]) held += p.shape.ShardExpert(s) == e;
        EXPECT_LT(std::fabs(held - spe * w[d] / total), 1.0)
            << "layer " << l << " expert " << e << " device " << d;
      }
    }
  }
  for (int d : p.active) {
    EXPECT_LT(std::fabs(static_cast<double>(p.vocab_chunks[d].size()) -
                        p.shape.vocab_chunks * w[d] / total),
              1.0)
        << "device " << d;
  }
}

int TotalQueries(const Plan& p, int d) { return p.num_tp_queries_total(d); }

TEST(ReplanWeights, ASlowDeviceGetsItsShareAndGivesItBackWhenWell) {
  for (const auto& c : Models()) {
    for (Policy policy :
         {Policy::kNonUniform, Policy::kCyclic, Policy::kHybrid, Policy::kStandard}) {
      for (int n : {2, 3, 4, 8}) {
        SCOPED_TRACE(std::string(PolicyName(policy)) + " kv=" + std::to_string(c.num_kv_heads) +
                     " q=" + std::to_string(c.num_heads) + " devices=" + std::to_string(n));
        auto fresh = MakePlan(c, policy, n, Range(n));
        if (!fresh.ok()) continue;  // e.g. standard on a TP size it does not allow
        const int slow = fresh->active.back();
        std::vector<double> w(n, 1.0);
        w[slow] = n == 3 ? 0.375 : 0.5;
        auto weighted = Replan(*fresh, c, Range(n), &w);
        ASSERT_TRUE(weighted.ok()) << weighted.status().ToString();
        ASSERT_TRUE(ValidatePlan(*weighted).ok());
        EXPECT_EQ(weighted->active, fresh->active);
        ExpectProportional(*weighted, w);
        // Whole head groups (no replicas): heads in proportion per layer too.
        const int k = static_cast<int>(fresh->active.size());
        if (policy != Policy::kHybrid && k <= c.num_kv_heads) {
          double total = 0;
          for (int d : fresh->active) total += w[d];
          for (int l = 0; l < c.num_layers; ++l) {
            for (int d : fresh->active) {
              EXPECT_LT(
                  std::fabs(weighted->layers[l].tp_heads[d].size() - c.num_kv_heads * w[d] / total),
                  1.0)
                  << "layer " << l << " device " << d;
            }
          }
        }
        if (weighted->max_replicas() <= 1) {
          // Never more query heads for the slow device than for any other.
          for (int d : fresh->active)
            EXPECT_LE(TotalQueries(*weighted, slow), TotalQueries(*weighted, d));
        } else {
          // Replicated groups: within its group, no more query heads than
          // any other holder.
          for (int l = 0; l < c.num_layers; ++l) {
            const auto& lp = weighted->layers[l];
            for (int h : lp.tp_heads[slow]) {
              for (int d : weighted->TpHolders(l, h)) {
                EXPECT_LE(lp.tp_queries[slow].size(), lp.tp_queries[d].size())
                    << "layer " << l << " device " << d;
              }
            }
          }
        }
        // Minimal movement: the other devices drop no FFN shard or chunk.
        PlanDiff diff = DiffPlans(*fresh, *weighted);
        for (int d : fresh->active) {
          if (d == slow) continue;
          EXPECT_TRUE(diff.dropped_shards[d].empty()) << "device " << d;
          EXPECT_TRUE(diff.dropped_chunks[d].empty()) << "device " << d;
        }
        // Equal weights (or none): even shares again, the others keeping theirs.
        std::vector<double> even(n, 2.0);
        for (const std::vector<double>* ew : {static_cast<const std::vector<double>*>(nullptr),
                                              static_cast<const std::vector<double>*>(&even)}) {
          auto back = Replan(*weighted, c, Range(n), ew);
          ASSERT_TRUE(back.ok()) << back.status().ToString();
          ExpectProportional(*back, std::vector<double>(n, 1.0));
          PlanDiff back_diff = DiffPlans(*weighted, *back);
          for (int d : fresh->active) {
            if (d != slow) {
              EXPECT_TRUE(back_diff.gained_shards[d].empty()) << "device " << d;
            }
          }
        }
        // A failure keeps the shares of the survivors in proportion.
        if (k >= 3) {
          std::vector<int> alive = fresh->active;
          alive.erase(alive.begin());
          auto after = Replan(*weighted, c, alive, &w);
          ASSERT_TRUE(after.ok()) << after.status().ToString();
          if (policy != Policy::kStandard) ExpectProportional(*after, w);
        }
      }
    }
  }
}

TEST(ReplanWeights, BadWeightsAreRefused) {
  const auto c = *SyntheticPresetConfig("tiny-llama");
  auto p = MakePlan(c, Policy::kNonUniform, 4, Range(4));
  ASSERT_TRUE(p.ok());
  std::vector<double> short_list(3, 1.0), zero(4, 1.0), nan(4, 1.0);
  zero[2] = 0;
  nan[1] = std::nan("");
  EXPECT_EQ(Replan(*p, c, Range(4), &short_list).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Replan(*p, c, Range(4), &zero).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Replan(*p, c, Range(4), &nan).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace failsafe
