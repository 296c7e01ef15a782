#include "placement/replan.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <set>

namespace failsafe {

namespace {

// Per-device counts `base + 1` for `extra` devices chosen by preference
// (higher first), `base` for the rest. Returns [device] -> target.
std::vector<int> Targets(const std::vector<int>& devices, int items,
                         const std::vector<double>& preference, int num_devices) {
  const int n = static_cast<int>(devices.size());
  const int base = items / n, extra = items % n;
  std::vector<int> order = devices;
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return preference[a] > preference[b]; });
  std::vector<int> t(num_devices, 0);
  for (int i = 0; i < n; ++i) t[order[i]] = base + (i < extra ? 1 : 0);
  return t;
}

// Counts proportional to `weights` summing to `items` (largest remainder;
// equal remainders go by preference, higher first). With equal weights this
// is Targets. [device] -> target.
std::vector<int> WeightedTargets(const std::vector<int>& devices, int items,
                                 const std::vector<double>& preference,
                                 const std::vector<double>& weights, int num_devices) {
  double total = 0;
  for (int d : devices) total += weights[d];
  std::vector<int> t(num_devices, 0);
  std::vector<std::pair<double, int>> rest;  // (remainder, device)
  int given = 0;
  for (int d : devices) {
    const double quota = items * weights[d] / total;
    t[d] = static_cast<int>(quota + 1e-9);
    given += t[d];
    rest.emplace_back(quota - t[d], d);
  }
  std::stable_sort(rest.begin(), rest.end(), [&](const auto& a, const auto& b) {
    if (std::fabs(a.first - b.first) > 1e-9) return a.first > b.first;
    return preference[a.second] > preference[b.second];
  });
  for (size_t i = 0; given < items; ++i, ++given) t[rest[i % rest.size()].second]++;
  return t;
}

// Keeps each device's items up to its target, hands the rest to devices below
// target (largest deficit first, lowest id on ties). held: [device] -> items.
void Rebalance(const std::vector<int>& devices, const std::vector<int>& target,
               std::vector<int> pool, std::vector<std::vector<int>>* held) {
  for (int d : devices) {
    auto& h = (*held)[d];
    while (static_cast<int>(h.size()) > target[d]) {
      pool.push_back(h.back());
      h.pop_back();
    }
  }
  std::sort(pool.begin(), pool.end());
  for (int item : pool) {
    int best = -1;
    for (int d : devices) {
      int deficit = target[d] - static_cast<int>((*held)[d].size());
      if (deficit > 0 &&
          (best < 0 || deficit > target[best] - static_cast<int>((*held)[best].size())))
        best = d;
    }
    if (best >= 0) (*held)[best].push_back(item);
  }
  for (auto& h : *held) std::sort(h.begin(), h.end());
}

// The query heads of head group h among `queries` (ascending).
std::vector<int> QueriesOf(const std::vector<int>& queries, int h, int group) {
  std::vector<int> out;
  for (int q : queries) {
    if (q / group == h) out.push_back(q);
  }
  return out;
}

// Head groups whole on each active device (no more devices than groups): a
// survivor keeps the groups it held; a group held in parts by several
// survivors (replicas before) stays with the one computing most of it. The
// rest go to the pool. held: [device] -> groups.
void KeepWholeGroups(const Plan& prev, const LayerPlan& old, const std::vector<int>& act, int heads,
                     int group, std::vector<std::vector<int>>* held, std::vector<int>* pool) {
  for (int h = 0; h < heads; ++h) {
    int keeper = -1;
    size_t most = 0;
    for (int d : act) {
      if (!prev.IsActive(d)) continue;
      const size_t q = QueriesOf(old.tp_queries[d], h, group).size();
      if (q > most) {
        most = q;
        keeper = d;
      }
    }
    if (keeper >= 0) {
      (*held)[keeper].push_back(h);
    } else if (!std::binary_search(old.dp_heads.begin(), old.dp_heads.end(), h)) {
      pool->push_back(h);
    }
  }
}

// More active devices than head groups, replicating groups (nonuniform,
// cyclic, standard): each device computes part of one group's query heads.
// Survivors stay with the group they compute most of, as far as the new
// per-group device counts allow; a group left without devices takes a device
// from a group that has more than its count (or a joining one). Within a
// group, devices keep their query heads up to their new count and the group's
// orphaned heads go to those below it, in proportion to `weights` if given
// ([device], see Replan). load: [device] -> query heads given so far (cyclic
// evens it out); updated.
void ReplanReplicated(const Plan& prev, const LayerPlan& old, const std::vector<int>& act,
                      int heads, int group, bool cyclic, const std::vector<double>* weights,
                      std::vector<int>* load, LayerPlan* lp) {
  const int nd = static_cast<int>(lp->tp_heads.size());
  const int n = static_cast<int>(act.size());
  auto computes = [&](int d, int h) {
    return prev.IsActive(d) ? static_cast<int>(QueriesOf(old.tp_queries[d], h, group).size()) : 0;
  };
  // 1) A survivor's home: the group it computes most of.
  std::vector<int> home(nd, -1), homes(heads, 0);
  for (int d : act) {
    int most = 0;
    for (int h = 0; h < heads; ++h) {
      if (computes(d, h) > most) {
        most = computes(d, h);
        home[d] = h;
      }
    }
    if (home[d] >= 0) homes[home[d]]++;
  }
  // 2) Devices per group: floor or ceil of used / H, at most one per query
  // head; the extra devices go to the groups with most devices at home.
  const int used = std::min(n, heads * group);
  const int base = used / heads, extra = used % heads;
  std::vector<int> by_homes(heads);
  std::iota(by_homes.begin(), by_homes.end(), 0);
  std::stable_sort(by_homes.begin(), by_homes.end(),
                   [&](int a, int b) { return homes[a] > homes[b]; });
  std::vector<int> count(heads, base);
  for (int i = 0; i < extra; ++i) count[by_homes[i]]++;
  // 3) Each group keeps up to its count of the devices at home there, those
  // computing most of it first; the others are free.
  auto less_loaded = [&](int a, int b) {
    return cyclic && (*load)[a] != (*load)[b] ? (*load)[a] < (*load)[b] : a < b;
  };
  std::vector<std::vector<int>> members(heads);
  std::vector<int> free;
  for (int h = 0; h < heads; ++h) {
    std::vector<int> cands;
    for (int d : act) {
      if (home[d] == h) cands.push_back(d);
    }
    std::stable_sort(cands.begin(), cands.end(), [&](int a, int b) {
      return computes(a, h) != computes(b, h) ? computes(a, h) > computes(b, h) : less_loaded(a, b);
    });
    for (size_t i = 0; i < cands.size(); ++i)
      (static_cast<int>(i) < count[h] ? members[h] : free).push_back(cands[i]);
  }
  for (int d : act) {
    if (home[d] < 0) free.push_back(d);
  }
  // 4) Groups short of devices take free ones: a device computing some of the
  // group first, then the least loaded (cyclic), then the lowest id.
  while (!free.empty()) {
    int h_best = -1;
    for (int h = 0; h < heads; ++h) {
      const int deficit = count[h] - static_cast<int>(members[h].size());
      if (deficit > 0 &&
          (h_best < 0 || deficit > count[h_best] - static_cast<int>(members[h_best].size())))
        h_best = h;
    }
    if (h_best < 0) break;  // the remaining devices compute no head in this layer
    auto it = std::min_element(free.begin(), free.end(), [&](int a, int b) {
      return computes(a, h_best) != computes(b, h_best) ? computes(a, h_best) > computes(b, h_best)
                                                        : less_loaded(a, b);
    });
    members[h_best].push_back(*it);
    free.erase(it);
  }
  // Past H * G devices some compute nothing in this layer. Cyclic rotates
  // that: an idle device that has computed less so far takes the part of the
  // busiest one (a joining device takes its share this way).
  while (cyclic && !free.empty()) {
    auto idle =
        std::min_element(free.begin(), free.end(), [&](int a, int b) { return less_loaded(a, b); });
    int busiest = -1, busiest_h = -1;
    for (int h = 0; h < heads; ++h) {
      for (int d : members[h]) {
        if (busiest < 0 || less_loaded(busiest, d)) {
          busiest = d;
          busiest_h = h;
        }
      }
    }
    if (busiest < 0 || (*load)[busiest] <= (*load)[*idle] + 1) break;
    std::replace(members[busiest_h].begin(), members[busiest_h].end(), busiest, *idle);
    *idle = busiest;
  }
  // 5) Query heads within each group.
  for (int h = 0; h < heads; ++h) {
    std::vector<std::vector<int>> held(nd);
    std::vector<int> pool;
    std::vector<char> kept(group, 0);
    for (int d : members[h]) {
      held[d] = prev.IsActive(d) ? QueriesOf(old.tp_queries[d], h, group) : std::vector<int>{};
      for (int q : held[d]) kept[q - h * group] = 1;
    }
    for (int j = 0; j < group; ++j) {
      if (!kept[j]) pool.push_back(h * group + j);
    }
    std::vector<double> pref(nd, 0);
    for (int d : members[h]) {
      pref[d] = computes(d, h) * 1e6 - (cyclic ? (*load)[d] * 1e3 : 0) + 1e-3 * (nd - d);
    }
    Rebalance(members[h],
              weights ? WeightedTargets(members[h], group, pref, *weights, nd)
                      : Targets(members[h], group, pref, nd),
              pool, &held);
    for (int d : members[h]) {
      lp->tp_heads[d] = {h};
      lp->tp_queries[d] = held[d];
      (*load)[d] += static_cast<int>(held[d].size());
    }
  }
}

}  // namespace

Result<Plan> Replan(const Plan& prev, const ModelConfig& config, const std::vector<int>& alive_in,
                    const std::vector<double>* weights_in, std::optional<Policy> policy) {
  std::vector<int> alive = alive_in;
  std::sort(alive.begin(), alive.end());
  // A fresh plan validates the request and fixes the active set and policy.
  FS_ASSIGN_OR_RETURN(Plan fresh,
                      MakePlan(config, policy.value_or(prev.policy), prev.num_devices, alive));
  if (fresh.policy == Policy::kStandard) {
    // Keep previously active devices active where possible.
    std::vector<int> keep, others;
    for (int d : alive) (prev.IsActive(d) ? keep : others).push_back(d);
    keep.insert(keep.end(), others.begin(), others.end());
    keep.resize(fresh.active.size());
    std::sort(keep.begin(), keep.end());
    fresh.active = keep;
  }
  Plan p = fresh;
  const std::vector<int>& act = p.active;
  const int n = static_cast<int>(act.size());
  const int nd = p.num_devices;
  bool weighted = false;
  std::vector<double> weights(nd, 1.0);
  if (weights_in) {
    if (static_cast<int>(weights_in->size()) != nd)
      return InvalidArgument("replan: {} weights for {} devices", weights_in->size(), nd);
    for (int d : act) {
      if (!((*weights_in)[d] > 0)) return InvalidArgument("replan: device {} has weight <= 0", d);
      weights[d] = (*weights_in)[d];
      weighted |= weights[d] != (*weights_in)[act[0]];
    }
  }
  // Targets, in proportion to the weights if they differ.
  auto targets = [&](int items, const std::vector<double>& pref) {
    return weighted ? WeightedTargets(act, items, pref, weights, nd)
                    : Targets(act, items, pref, nd);
  };
  const int heads = p.shape.num_kv_heads;
  std::vector<int> extras_so_far(nd, 0);  // cyclic: extra heads given per device so far
  std::vector<int> shard_total(nd, 0);    // FFN shards given per device so far
  // nonuniform: the same devices get the extra head in every layer; prefer those holding most.
  std::vector<double> total_held(nd, 0);
  for (int d : act)
    total_held[d] = prev.IsActive(d) ? prev.num_tp_heads_total(d) + 1e-3 * (nd - d) : 0;

  const int group = p.shape.group_size;
  std::vector<int> query_load(nd, 0);  // cyclic with replicas: query heads given so far

  for (int l = 0; l < p.shape.num_layers; ++l) {
    const LayerPlan& old = prev.layers[l];
    LayerPlan& lp = p.layers[l];
    lp.tp_heads.assign(nd, {});
    lp.tp_queries.assign(nd, {});
    lp.dp_heads.clear();
    if (p.policy != Policy::kHybrid && n > heads) {
      ReplanReplicated(prev, old, act, heads, group, p.policy == Policy::kCyclic,
                       weighted ? &weights : nullptr, &query_load, &lp);
    } else {
      std::vector<std::vector<int>> held(nd);
      std::vector<int> pool;
      KeepWholeGroups(prev, old, act, heads, group, &held, &pool);
      // Leaving hybrid attention: the DP head groups become TP heads.
      if (p.policy != Policy::kHybrid)
        pool.insert(pool.end(), old.dp_heads.begin(), old.dp_heads.end());
      std::vector<int> tp_target(nd, 0);
      if (p.policy == Policy::kHybrid) {
        const int per = heads / n, dp = heads % n;
        // DP heads: those already DP first, then orphans, then excess TP heads.
        std::vector<int> dp_candidates = old.dp_heads;
        dp_candidates.insert(dp_candidates.end(), pool.begin(), pool.end());
        std::vector<int> excess;
        for (int d : act) {
          for (size_t i = per; i < held[d].size(); ++i) excess.push_back(held[d][i]);
        }
        dp_candidates.insert(dp_candidates.end(), excess.begin(), excess.end());
        std::set<int> dp_set(dp_candidates.begin(),
                             dp_candidates.begin() + std::min<size_t>(dp, dp_candidates.size()));
        lp.dp_heads.assign(dp_set.begin(), dp_set.end());
        if (weighted) {
          // As many TP heads as without weights, apportioned by weight.
          std::vector<double> pref(nd, 0);
          for (int d : act) pref[d] = static_cast<double>(held[d].size()) + 1e-3 * (nd - d);
          tp_target = targets(per * n, pref);
        }
        for (int d : act) {
          if (!weighted) tp_target[d] = per;
          std::erase_if(held[d], [&](int h) { return dp_set.count(h); });
        }
        std::erase_if(pool, [&](int h) { return dp_set.count(h); });
        for (int h : old.dp_heads) {
          if (!dp_set.count(h)) pool.push_back(h);
        }
      } else {
        std::vector<double> pref(nd, 0);
        // The most a survivor holds here (all hold as many leaving hybrid).
        size_t most = 0;
        for (int d : act) most = std::max(most, held[d].size());
        for (int d : act) {
          if (p.policy == Policy::kNonUniform) {
            pref[d] = total_held[d];
          } else {
            // standard, cyclic: extras stay with devices that hold one here (no
            // moves between survivors); a joining device competes as if it held
            // one (as many as the survivors holding most, if that is fewer),
            // and ties go to the device with the fewest extras so far.
            const double holds = prev.IsActive(d)
                                     ? static_cast<double>(held[d].size())
                                     : std::min<double>(heads / n + 1, static_cast<double>(most));
            pref[d] = holds * 1000 - extras_so_far[d] + 1e-3 * (nd - d);
          }
        }
        tp_target = targets(heads, pref);
        for (int d : act) extras_so_far[d] += tp_target[d] > heads / n ? 1 : 0;
      }
      Rebalance(act, tp_target, pool, &held);
      lp.tp_heads = held;
      SetWholeGroupQueries(group, &lp);
    }

    // FFN shards, expert by expert.
    std::vector<std::vector<int>> shards(nd);
    for (int e = 0; e < p.shape.expert_slots; ++e) {
      const int lo = e * p.shape.shards_per_expert, hi = lo + p.shape.shards_per_expert;
      std::vector<std::vector<int>> held_e(nd);
      std::vector<int> orphans;
      for (int d = 0; d < nd; ++d) {
        for (int s : old.ffn_shards[d]) {
          if (s < lo || s >= hi) continue;
          (p.IsActive(d) ? held_e[d] : orphans).push_back(s);
        }
      }
      // Extra shards go to devices that hold more of this expert, then to
      // those with fewer shards in this layer, then in earlier layers.
      std::vector<double> pref(nd, 0);
      for (int d : act) {
        const double holds = prev.IsActive(d) ? static_cast<double>(held_e[d].size())
                                              : p.shape.shards_per_expert / n + 1;
        pref[d] = holds * 1e6 - static_cast<double>(shards[d].size()) * 1e3 -
                  static_cast<double>(shard_total[d]) + 1e-3 * (nd - d);
      }
      Rebalance(act, targets(p.shape.shards_per_expert, pref), orphans, &held_e);
      for (int d : act) shards[d].insert(shards[d].end(), held_e[d].begin(), held_e[d].end());
    }
    for (auto& v : shards) std::sort(v.begin(), v.end());
    for (int d : act) shard_total[d] += static_cast<int>(shards[d].size());
    lp.ffn_shards = shards;
  }

  // Vocabulary chunks.
  std::vector<std::vector<int>> chunks(nd);
  std::vector<int> orphans;
  for (int d = 0; d < nd; ++d) {
    if (p.IsActive(d)) {
      chunks[d] = prev.vocab_chunks[d];
    } else {
      orphans.insert(orphans.end(), prev.vocab_chunks[d].begin(), prev.vocab_chunks[d].end());
    }
  }
  std::vector<double> pref(nd, 0);
  for (int d : act) pref[d] = chunks[d].size() + 1e-3 * (nd - d);
  Rebalance(act, targets(p.shape.vocab_chunks, pref), orphans, &chunks);
  p.vocab_chunks = chunks;
  FS_RETURN_IF_ERROR(ValidatePlan(p));
  return p;
}

const char* RecoveryModeName(RecoveryMode m) {
  switch (m) {
    case RecoveryMode::kRecompute:
      return "recompute";
    case RecoveryMode::kHost:
      return "host";
    case RecoveryMode::kFull:
      return "full";
    case RecoveryMode::kOracle:
      return "oracle";
  }
  return "?";
}

Result<RecoveryMode> ParseRecoveryMode(const std::string& name) {
  if (name == "recompute") return RecoveryMode::kRecompute;
  if (name == "host") return RecoveryMode::kHost;
  if (name == "full") return RecoveryMode::kFull;
  if (name == "oracle") return RecoveryMode::kOracle;
  return InvalidArgument("unknown recovery mode '{}' (known: recompute, host, full)", name);
}

PlanDiff DiffPlans(const Plan& from, const Plan& to) {
  const int nd = to.num_devices;
  PlanDiff diff;
  for (auto* v :
       {&diff.gained_tp_heads, &diff.gained_tp_queries, &diff.gained_dp_heads, &diff.gained_shards,
        &diff.gained_chunks, &diff.dropped_tp_heads, &diff.dropped_tp_queries,
        &diff.dropped_dp_heads, &diff.dropped_shards, &diff.dropped_chunks}) {
    v->assign(nd, {});
  }
  // Active before and after: moving items between such devices is avoidable work.
  auto survivor = [&](int d) { return from.IsActive(d) && to.IsActive(d); };
  auto compare = [&](int layer, const std::vector<int>& before, const std::vector<int>& after,
                     std::vector<PlanDiff::Item>* gained, std::vector<PlanDiff::Item>* dropped) {
    for (int x : after) {
      if (!std::binary_search(before.begin(), before.end(), x)) gained->push_back({layer, x});
    }
    for (int x : before) {
      if (!std::binary_search(after.begin(), after.end(), x)) dropped->push_back({layer, x});
    }
  };
  for (int l = 0; l < to.shape.num_layers; ++l) {
    const LayerPlan& a = from.layers[l];
    const LayerPlan& b = to.layers[l];
    for (int d = 0; d < nd; ++d) {
      const bool was = from.IsActive(d), is = to.IsActive(d);
      compare(l, was ? a.tp_heads[d] : std::vector<int>{}, is ? b.tp_heads[d] : std::vector<int>{},
              &diff.gained_tp_heads[d], &diff.dropped_tp_heads[d]);
      compare(l, was ? a.tp_queries[d] : std::vector<int>{},
              is ? b.tp_queries[d] : std::vector<int>{}, &diff.gained_tp_queries[d],
              &diff.dropped_tp_queries[d]);
      compare(l, was ? a.dp_heads : std::vector<int>{}, is ? b.dp_heads : std::vector<int>{},
              &diff.gained_dp_heads[d], &diff.dropped_dp_heads[d]);
      compare(l, was ? a.ffn_shards[d] : std::vector<int>{},
              is ? b.ffn_shards[d] : std::vector<int>{}, &diff.gained_shards[d],
              &diff.dropped_shards[d]);
    }
    // An item moved between survivors if its old holder is still active and
    // it now lives (as TP) on another device.
    std::map<int, int> query_old;
    for (int d = 0; d < nd; ++d) {
      for (int q : a.tp_queries[d]) query_old[q] = d;
    }
    for (int d = 0; d < nd; ++d) {
      for (int q : b.tp_queries[d]) {
        auto it = query_old.find(q);
        if (it != query_old.end() && it->second != d && survivor(it->second) && survivor(d))
          diff.moved_between_survivors++;
      }
    }
    std::map<int, int> shard_old;
    for (int d = 0; d < nd; ++d) {
      for (int s : a.ffn_shards[d]) shard_old[s] = d;
    }
    for (int d = 0; d < nd; ++d) {
      for (int s : b.ffn_shards[d]) {
        const int o = shard_old[s];
        if (o != d && survivor(o) && survivor(d)) diff.moved_between_survivors++;
      }
    }
  }
  for (int d = 0; d < nd; ++d) {
    compare(-1, from.IsActive(d) ? from.vocab_chunks[d] : std::vector<int>{},
            to.IsActive(d) ? to.vocab_chunks[d] : std::vector<int>{}, &diff.gained_chunks[d],
            &diff.dropped_chunks[d]);
    for (int c : to.vocab_chunks[d]) {
      for (int o = 0; o < nd; ++o) {
        if (o != d && survivor(o) && survivor(d) &&
            std::binary_search(from.vocab_chunks[o].begin(), from.vocab_chunks[o].end(), c)) {
          diff.moved_between_survivors++;
        }
      }
    }
  }
  return diff;
}

}  // namespace failsafe
