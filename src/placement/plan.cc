#include "placement/plan.h"

#include <algorithm>
#include <numeric>
#include <tuple>

namespace failsafe {

const char* PolicyName(Policy p) {
  switch (p) {
    case Policy::kStandard:
      return "standard";
    case Policy::kNonUniform:
      return "nonuniform";
    case Policy::kCyclic:
      return "cyclic";
    case Policy::kHybrid:
      return "hybrid";
  }
  return "?";
}

Result<Policy> ParsePolicy(const std::string& name) {
  if (name == "standard") return Policy::kStandard;
  if (name == "nonuniform") return Policy::kNonUniform;
  if (name == "cyclic") return Policy::kCyclic;
  if (name == "hybrid") return Policy::kHybrid;
  return InvalidArgument(
      "unknown placement policy '{}' (known: standard, nonuniform, cyclic, hybrid)", name);
}

PlanShape PlanShape::ForModel(const ModelConfig& c) {
  PlanShape s;
  s.num_layers = c.num_layers;
  s.num_kv_heads = c.num_kv_heads;
  s.group_size = c.num_kv_heads > 0 ? c.group_size() : 1;
  s.expert_slots = c.expert_slots();
  // The largest divisor of the intermediate size that is at most 128: fine
  // enough that 7 devices are within a few percent of even.
  s.shards_per_expert = 1;
  for (int d = std::min(128, c.intermediate_size); d >= 1; --d) {
    if (c.intermediate_size % d == 0) {
      s.shards_per_expert = d;
      break;
    }
  }
  s.shard_width = c.intermediate_size / s.shards_per_expert;
  s.vocab_size = c.vocab_size;
  s.vocab_chunks = std::min(64, c.vocab_size);
  s.vocab_chunk_size = (c.vocab_size + s.vocab_chunks - 1) / s.vocab_chunks;
  s.vocab_chunks = (c.vocab_size + s.vocab_chunk_size - 1) / s.vocab_chunk_size;
  return s;
}

int PlanShape::ChunkEnd(int chunk) const {
  return std::min(vocab_size, (chunk + 1) * vocab_chunk_size);
}

bool Plan::IsActive(int device) const { return RankOf(device) >= 0; }

int Plan::RankOf(int device) const {
  auto it = std::lower_bound(active.begin(), active.end(), device);
  return it != active.end() && *it == device ? static_cast<int>(it - active.begin()) : -1;
}

bool Plan::HoldsTpHead(int device, int layer, int head) const {
  const auto& h = layers[layer].tp_heads[device];
  return std::binary_search(h.begin(), h.end(), head);
}

bool Plan::IsDpHead(int layer, int head) const {
  const auto& h = layers[layer].dp_heads;
  return std::binary_search(h.begin(), h.end(), head);
}

std::vector<int> Plan::TpHolders(int layer, int head) const {
  std::vector<int> out;
  for (int d : active) {
    if (HoldsTpHead(d, layer, head)) out.push_back(d);
  }
  return out;
}

int Plan::KvWriter(int layer, int head, int dp_rank) const {
  if (IsDpHead(layer, head)) return dp_rank;
  const std::vector<int> holders = TpHolders(layer, head);
  if (holders.empty()) return -1;
  return holders[layer % holders.size()];
}

std::vector<int> Plan::KvWriters(int dp_rank) const {
  std::vector<char> writes(num_devices, 0);
  for (int l = 0; l < static_cast<int>(layers.size()); ++l) {
    for (int h = 0; h < shape.num_kv_heads; ++h) {
      const int w = KvWriter(l, h, dp_rank);
      if (w >= 0) writes[w] = 1;
    }
  }
  std::vector<int> out;
  for (int d = 0; d < num_devices; ++d) {
    if (writes[d]) out.push_back(d);
  }
  return out;
}

std::vector<int> Plan::KvHolders(int layer, int head, int dp_rank) const {
  if (IsDpHead(layer, head)) return {dp_rank};
  return TpHolders(layer, head);
}

std::vector<int> Plan::KvSlots(int device, int dp_rank) const {
  std::vector<int> out;
  if (!IsActive(device)) return out;
  for (int l = 0; l < static_cast<int>(layers.size()); ++l) {
    const LayerPlan& lp = layers[l];
    std::vector<int> heads = lp.tp_heads[device];
    if (device == dp_rank) heads.insert(heads.end(), lp.dp_heads.begin(), lp.dp_heads.end());
    std::sort(heads.begin(), heads.end());
    for (int h : heads) out.push_back(l * shape.num_kv_heads + h);
  }
  return out;
}

int Plan::max_replicas() const {
  int most = 0;
  for (int l = 0; l < static_cast<int>(layers.size()); ++l) {
    for (int h = 0; h < shape.num_kv_heads; ++h)
      most = std::max(most, static_cast<int>(TpHolders(l, h).size()));
  }
  return most;
}

int Plan::num_dp_heads_total() const {
  int n = 0;
  for (auto& l : layers) n += static_cast<int>(l.dp_heads.size());
  return n;
}

int Plan::num_tp_heads_total(int device) const {
  int n = 0;
  for (auto& l : layers) n += static_cast<int>(l.tp_heads[device].size());
  return n;
}

int Plan::num_tp_queries_total(int device) const {
  int n = 0;
  for (auto& l : layers) n += static_cast<int>(l.tp_queries[device].size());
  return n;
}

bool Plan::operator==(const Plan& o) const {
  if (policy != o.policy || num_devices != o.num_devices || alive != o.alive ||
      active != o.active || vocab_chunks != o.vocab_chunks || layers.size() != o.layers.size()) {
    return false;
  }
  for (size_t l = 0; l < layers.size(); ++l) {
    if (layers[l].tp_heads != o.layers[l].tp_heads ||
        layers[l].tp_queries != o.layers[l].tp_queries ||
        layers[l].dp_heads != o.layers[l].dp_heads ||
        layers[l].ffn_shards != o.layers[l].ffn_shards) {
      return false;
    }
  }
  return true;
}

namespace {

// Splits items [0, count) contiguously over `devices` in the given order; the
// first `count % n` devices in that order get one more.
void SplitContiguous(int first_item, int count, const std::vector<int>& order,
                     std::vector<std::vector<int>>* out) {
  const int n = static_cast<int>(order.size());
  const int base = count / n, extra = count % n;
  int item = first_item;
  for (int i = 0; i < n; ++i) {
    int c = base + (i < extra ? 1 : 0);
    for (int k = 0; k < c; ++k) (*out)[order[i]].push_back(item++);
  }
}

std::vector<int> Rotated(const std::vector<int>& v, int by) {
  std::vector<int> out(v.size());
  const int n = static_cast<int>(v.size());
  for (int i = 0; i < n; ++i) out[i] = v[(i + by) % n];
  return out;
}

// The TP size `standard` takes on n alive devices, by vLLM's rules: the
// largest size that divides the query heads and the FFN's intermediate size,
// and that divides the head groups or, when larger, is a multiple of their
// count (each group then lives on size / H devices).
int StandardTpSize(const ModelConfig& c, int n) {
  for (int tp = n; tp > 1; --tp) {
    const bool kv_ok = tp <= c.num_kv_heads ? c.num_kv_heads % tp == 0 : tp % c.num_kv_heads == 0;
    if (c.num_heads % tp == 0 && c.intermediate_size % tp == 0 && kv_ok) return tp;
  }
  return 1;
}

// One device's part of a replicated head group: query heads [q_begin, q_end).
struct Role {
  int head, q_begin, q_end;
  int size() const { return q_end - q_begin; }
};

// More devices than head groups: the parts of n devices. Head group h is
// split over floor(n/H) devices, one more for the first n mod H groups, but
// never more devices than it has query heads (devices past H * G get no
// part); each takes a contiguous run of its query heads, the first ones one
// more.
std::vector<Role> ReplicatedRoles(int heads, int group, int n) {
  const int used = std::min(n, heads * group);
  const int base = used / heads, extra = used % heads;
  std::vector<Role> roles;
  for (int h = 0; h < heads; ++h) {
    const int r = base + (h < extra ? 1 : 0);
    int q = h * group;
    for (int i = 0; i < r; ++i) {
      const int c = group / r + (i < group % r ? 1 : 0);
      roles.push_back({h, q, q + c});
      q += c;
    }
  }
  return roles;
}

}  // namespace

void SetWholeGroupQueries(int group_size, LayerPlan* lp) {
  lp->tp_queries.assign(lp->tp_heads.size(), {});
  for (size_t d = 0; d < lp->tp_heads.size(); ++d) {
    for (int h : lp->tp_heads[d]) {
      for (int j = 0; j < group_size; ++j) lp->tp_queries[d].push_back(h * group_size + j);
    }
  }
}

Result<Plan> MakePlan(const ModelConfig& config, Policy policy, int num_devices,
                      const std::vector<int>& alive_in) {
  if (num_devices < 1)
    return InvalidArgument("the number of devices must be at least 1 (got {})", num_devices);
  std::vector<int> alive = alive_in;
  std::sort(alive.begin(), alive.end());
  if (alive.empty()) return InvalidArgument("no device is alive");
  if (std::adjacent_find(alive.begin(), alive.end()) != alive.end()) {
    return InvalidArgument("device {} is listed twice",
                           *std::adjacent_find(alive.begin(), alive.end()));
  }
  for (int d : alive) {
    if (d < 0 || d >= num_devices)
      return OutOfRange("device id {} is out of range [0, {})", d, num_devices);
  }
  if (config.num_kv_heads < 1 || config.num_heads % config.num_kv_heads != 0) {
    return InvalidArgument("the model's {} query heads do not form groups over {} KV heads",
                           config.num_heads, config.num_kv_heads);
  }
  const int heads = config.num_kv_heads;
  Plan p;
  p.policy = policy;
  p.num_devices = num_devices;
  p.alive = alive;
  p.shape = PlanShape::ForModel(config);
  const int group = p.shape.group_size;
  const int n_alive = static_cast<int>(alive.size());
  if (policy == Policy::kStandard) {
    p.active.assign(alive.begin(), alive.begin() + StandardTpSize(config, n_alive));
  } else {
    p.active = alive;
  }
  const int n = static_cast<int>(p.active.size());
  const bool replicate = n > heads && policy != Policy::kHybrid;
  p.layers.resize(config.num_layers);
  // With cyclic and hybrid, the devices that get an extra item take turns:
  // the k-th extra over all layers (and experts) goes to the k-th device.
  const bool rotate = policy == Policy::kCyclic || policy == Policy::kHybrid;
  int next_head_extra = 0, next_shard_extra = 0;
  // Cyclic with replicas: query heads and KV heads given per device so far.
  std::vector<int> query_load(num_devices, 0), kv_load(num_devices, 0);
  for (int l = 0; l < config.num_layers; ++l) {
    LayerPlan& lp = p.layers[l];
    lp.tp_heads.assign(num_devices, {});
    lp.ffn_shards.assign(num_devices, {});
    if (replicate) {
      std::vector<Role> roles = ReplicatedRoles(heads, group, n);
      std::vector<int> order = p.active;
      if (policy == Policy::kCyclic) {
        // The largest parts go to the devices that have computed least so far.
        std::stable_sort(roles.begin(), roles.end(),
                         [](const Role& a, const Role& b) { return a.size() > b.size(); });
        std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
          return std::tie(query_load[a], kv_load[a]) < std::tie(query_load[b], kv_load[b]);
        });
      }
      lp.tp_queries.assign(num_devices, {});
      for (size_t i = 0; i < roles.size(); ++i) {
        const int d = order[i];
        lp.tp_heads[d].push_back(roles[i].head);
        for (int q = roles[i].q_begin; q < roles[i].q_end; ++q) lp.tp_queries[d].push_back(q);
        query_load[d] += roles[i].size();
        kv_load[d] += 1;
      }
    } else {
      switch (policy) {
        case Policy::kStandard:
        case Policy::kNonUniform:
          SplitContiguous(0, heads, p.active, &lp.tp_heads);
          break;
        case Policy::kCyclic:
          SplitContiguous(0, heads, Rotated(p.active, next_head_extra % n), &lp.tp_heads);
          next_head_extra += heads % n;
          break;
        case Policy::kHybrid: {
          const int per = heads / n;
          SplitContiguous(0, per * n, p.active, &lp.tp_heads);
          for (int h = per * n; h < heads; ++h) lp.dp_heads.push_back(h);
          break;
        }
      }
      for (auto& v : lp.tp_heads) std::sort(v.begin(), v.end());
      SetWholeGroupQueries(group, &lp);
    }
    // FFN: every expert is split over all active devices.
    for (int e = 0; e < p.shape.expert_slots; ++e) {
      auto order = rotate ? Rotated(p.active, next_shard_extra % n) : p.active;
      SplitContiguous(e * p.shape.shards_per_expert, p.shape.shards_per_expert, order,
                      &lp.ffn_shards);
      next_shard_extra += p.shape.shards_per_expert % n;
    }
    for (auto& v : lp.ffn_shards) std::sort(v.begin(), v.end());
  }
  p.vocab_chunks.assign(num_devices, {});
  SplitContiguous(0, p.shape.vocab_chunks, p.active, &p.vocab_chunks);
  FS_RETURN_IF_ERROR(ValidatePlan(p));
  return p;
}

Status ValidatePlan(const Plan& p) {
  const int nd = p.num_devices;
  if (p.active.empty()) return Internal("plan has no active device");
  if (p.shape.num_kv_heads < 1 || p.shape.group_size < 1)
    return Internal("plan: bad head group shape");
  if (static_cast<int>(p.vocab_chunks.size()) != nd)
    return Internal("plan: vocab chunk lists have the wrong size");
  if (!std::is_sorted(p.alive.begin(), p.alive.end()) ||
      !std::is_sorted(p.active.begin(), p.active.end())) {
    return Internal("plan: device lists are not sorted");
  }
  for (int d : p.alive) {
    if (d < 0 || d >= nd) return Internal("plan: device {} out of range", d);
  }
  for (int d : p.active) {
    if (!std::binary_search(p.alive.begin(), p.alive.end(), d))
      return Internal("active device {} is not alive", d);
  }
  if (static_cast<int>(p.layers.size()) != p.shape.num_layers)
    return Internal("plan has the wrong layer count");
  for (int l = 0; l < p.shape.num_layers; ++l) {
    const LayerPlan& lp = p.layers[l];
    if (static_cast<int>(lp.tp_heads.size()) != nd ||
        static_cast<int>(lp.tp_queries.size()) != nd ||
        static_cast<int>(lp.ffn_shards.size()) != nd) {
      return Internal("layer {}: per-device lists have the wrong size", l);
    }
    const int group = p.shape.group_size;
    std::vector<int> query_count(p.shape.num_query_heads(), 0);
    for (int h : lp.dp_heads) {
      if (h < 0 || h >= p.shape.num_kv_heads)
        return Internal("layer {}: DP head {} out of range", l, h);
      for (int j = 0; j < group; ++j) query_count[h * group + j]++;
    }
    if (!std::is_sorted(lp.dp_heads.begin(), lp.dp_heads.end()))
      return Internal("layer {}: DP heads are not sorted", l);
    std::vector<int> shard_count(p.shape.num_shards(), 0);
    for (int d = 0; d < nd; ++d) {
      bool active = p.IsActive(d);
      if (!active &&
          (!lp.tp_heads[d].empty() || !lp.tp_queries[d].empty() || !lp.ffn_shards[d].empty())) {
        return Internal("layer {}: inactive device {} holds a share", l, d);
      }
      // tp_heads must be exactly the groups of tp_queries, both ascending.
      std::vector<int> groups;
      for (size_t i = 0; i < lp.tp_queries[d].size(); ++i) {
        const int q = lp.tp_queries[d][i];
        if (q < 0 || q >= p.shape.num_query_heads())
          return Internal("layer {}: query head {} out of range", l, q);
        if (i > 0 && q <= lp.tp_queries[d][i - 1])
          return Internal("layer {}: device {}'s query heads are not ascending", l, d);
        if (groups.empty() || groups.back() != q / group) groups.push_back(q / group);
        query_count[q]++;
      }
      if (groups != lp.tp_heads[d]) {
        return Internal("layer {}: device {} holds head groups that do not match its query heads",
                        l, d);
      }
      for (int s : lp.ffn_shards[d]) {
        if (s < 0 || s >= p.shape.num_shards())
          return Internal("layer {}: shard {} out of range", l, s);
        shard_count[s]++;
      }
    }
    for (int q = 0; q < p.shape.num_query_heads(); ++q) {
      if (query_count[q] != 1) {
        return Internal("layer {}: query head {} (head group {}) is placed {} times", l, q,
                        q / group, query_count[q]);
      }
    }
    for (int s = 0; s < p.shape.num_shards(); ++s) {
      if (shard_count[s] != 1)
        return Internal("layer {}: FFN shard {} is placed {} times", l, s, shard_count[s]);
    }
  }
  std::vector<int> chunk_count(p.shape.vocab_chunks, 0);
  for (int d = 0; d < nd; ++d) {
    if (!p.IsActive(d) && !p.vocab_chunks[d].empty())
      return Internal("inactive device {} holds vocab chunks", d);
    for (int c : p.vocab_chunks[d]) {
      if (c < 0 || c >= p.shape.vocab_chunks) return Internal("vocab chunk {} out of range", c);
      chunk_count[c]++;
    }
  }
  for (int c = 0; c < p.shape.vocab_chunks; ++c) {
    if (chunk_count[c] != 1)
      return Internal("vocab chunk {} is placed {} times", c, chunk_count[c]);
  }
  return Status::Ok();
}

}  // namespace failsafe
