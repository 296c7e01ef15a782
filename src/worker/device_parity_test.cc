// Many devices in one process against one device. Each device's DeviceModel
// runs on its own thread and the collectives go through one real
// shared-memory group (ShmCommunicator), so that every placement policy can be
// checked on 1 to 12 devices, for models with 1, 2, 3, 4 and 8 head groups,
// dense and MoE, within seconds: logits bit for bit those of one device
// (exact partial sums, batch-invariant kernels) and the host KV backup
// written exactly once (a replicated head group by one of its holders). Plan
// changes (a device leaving, one joining) are applied to the live devices
// with their KV restored from that backup.
//
// Worker processes, real deaths and the coordinator's recovery are tested in
// src/engine (worker_group_test.cc, recovery_test.cc) on fewer combinations.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <numeric>
#include <thread>

#include "comm/shm_communicator.h"
#include "common/rng.h"
#include "common/row_error.h"
#include "common/scratch_dir.h"
#include "core/kv_blocks.h"
#include "engine/kv_tables.h"
#include "model/synthetic.h"
#include "placement/plan_json.h"
#include "worker/device_model.h"

namespace failsafe {
namespace {

constexpr int kMaxDevices = 12;
constexpr int kBlockSize = 4;
constexpr int kMaxBlocks = 32;  // per sequence in the backup

struct ModelCase {
  std::string preset;
  int heads = 0, kv_heads = 0;  // 0: the preset's
  std::string Name() const {
    std::string p = preset;
    std::replace(p.begin(), p.end(), '-', '_');
    return p + "_q" + std::to_string(heads) + "_kv" + std::to_string(kv_heads);
  }
};

struct Model {
  ModelConfig config;
  std::unique_ptr<WeightStore> host;
};

const Model& GetModel(const ModelCase& m) {
  static std::map<std::string, Model> models;
  auto it = models.find(m.Name());
  if (it != models.end()) return it->second;
  const std::string dir = ProcessScratchDir().Sub(m.Name());
  SyntheticModelOptions o;
  o.preset = m.preset;
  o.num_heads = m.heads;
  o.num_kv_heads = m.kv_heads;
  o.seed = 5;
  Status st = WriteSyntheticModel(dir, o);
  EXPECT_TRUE(st.ok()) << st.ToString();
  Model model;
  model.config = *ModelConfig::Load(dir);
  model.host = std::move(WeightStore::Open(dir, model.config)).value();
  std::filesystem::remove_all(dir);  // the weights stay mapped
  return models[m.Name()] = std::move(model);
}

// The block tables of the test's sequences (ids 1, 2, 3), owned as the
// engine's scheduler owns them and carried to the devices as it carries them.
class Tables {
 public:
  void Reset(const Plan& plan) {
    kv_ = PagedKvBlockManager(plan, kBlockSize, std::vector<int64_t>(plan.num_devices, kPoolPages));
    seqs_.assign(3, Sequence());
    for (int i = 0; i < 3; ++i) seqs_[i].id = i + 1;
  }
  // Gives the step's sequences pages for what they write, and the batch the
  // new table entries.
  void Fill(const Plan& plan, StepBatch* b) {
    b->kv.clear();
    for (const StepSeq& s : b->seqs) {
      Sequence& seq = seqs_[s.seq_id - 1];
      seq.dp_rank = s.dp_rank;
      ASSERT_TRUE(kv_.CanGrow(seq, s.start_pos + s.num_tokens));
      kv_.Grow(seq, s.start_pos + s.num_tokens);
      AddKvTables(kv_, plan, seq, kv_.TakeUnsent(seq.id), b);
    }
    ASSERT_TRUE(kv_.CheckInvariants().ok());
  }
  // The tables moved to `next` (the sequences on their new DP ranks), per device.
  DeviceRestores Move(const Plan& next, const std::vector<SeqRestore>& common) {
    std::vector<const Sequence*> live;
    for (const SeqRestore& sr : common) {
      seqs_[sr.seq_id - 1].dp_rank = sr.dp_rank;
      live.push_back(&seqs_[sr.seq_id - 1]);
    }
    kv_.Reconfigure(next, std::vector<int64_t>(next.num_devices, kPoolPages), live);
    EXPECT_TRUE(kv_.CheckInvariants().ok());
    DeviceRestores out(next.num_devices);
    for (const SeqRestore& sr : common)
      AddRestores(kv_, next, seqs_[sr.seq_id - 1], sr, false, &out);
    return out;
  }

 private:
  static constexpr int64_t kPoolPages = 4096;
  PagedKvBlockManager kv_;
  std::vector<Sequence> seqs_;
};

// The steps of three sequences (prefill chunks of at most 8 tokens, then
// decodes of the greedy token), and one device's logits for each.
struct Reference {
  std::vector<StepBatch> steps;            // dp_rank, KV table and backup fields unset
  std::vector<std::vector<float>> logits;  // [step] -> [rows, vocab]
};

const Reference& GetReference(const ModelCase& m) {
  static std::map<std::string, Reference> refs;
  auto it = refs.find(m.Name());
  if (it != refs.end()) return it->second;
  const Model& model = GetModel(m);
  const ModelConfig& c = model.config;
  auto backend = MakeCpuBackend(1);
  DeviceOptions o;
  o.block_size = kBlockSize;
  o.kv_pages = 4096;
  DeviceModel one(c, 0, backend.get(), o);
  EXPECT_TRUE(one.LoadShare(*MakePlan(c, Policy::kNonUniform, 1, {0}), *model.host).ok());
  LocalCommunicator comm;
  Tables tables;
  tables.Reset(one.plan());
  Rng rng(7);
  std::vector<std::vector<int32_t>> tokens(3);
  const int prompt[] = {21, 6, 13};
  for (int i = 0; i < 3; ++i) {
    for (int k = 0; k < prompt[i]; ++k)
      tokens[i].push_back(static_cast<int32_t>(rng.Below(c.vocab_size)));
  }
  std::vector<int> done(3, 0);
  Reference ref;
  for (int step = 0; step < 9; ++step) {
    StepBatch b;
    for (int i = 0; i < 3; ++i) {
      const int n = std::min<int>(8, static_cast<int>(tokens[i].size()) - done[i]);
      StepSeq s;
      s.seq_id = i + 1;
      s.start_pos = done[i];
      s.num_tokens = n;
      s.token_offset = b.num_tokens();
      s.logits_row = done[i] + n == static_cast<int>(tokens[i].size()) ? b.num_logits_rows++ : -1;
      b.seqs.push_back(s);
      b.tokens.insert(b.tokens.end(), tokens[i].begin() + done[i], tokens[i].begin() + done[i] + n);
    }
    std::vector<float> logits(static_cast<size_t>(b.num_logits_rows) * c.vocab_size);
    tables.Fill(one.plan(), &b);
    EXPECT_TRUE(one.Forward(b, comm, logits.data(), nullptr).ok());
    b.kv.clear();
    for (size_t i = 0; i < b.seqs.size(); ++i) {
      done[i] += b.seqs[i].num_tokens;
      if (b.seqs[i].logits_row < 0) continue;
      const float* row = logits.data() + static_cast<int64_t>(b.seqs[i].logits_row) * c.vocab_size;
      tokens[i].push_back(static_cast<int32_t>(std::max_element(row, row + c.vocab_size) - row));
    }
    ref.steps.push_back(std::move(b));
    ref.logits.push_back(std::move(logits));
  }
  return refs[m.Name()] = std::move(ref);
}

// Devices 0..N-1 in this process, each with its own backend, KV pool and
// backup writer, sharing one host KV backup region laid out as the
// coordinator lays it out (sequence i: progress slot i, backup blocks
// i * kMaxBlocks onwards).
class Devices {
 public:
  // peer: the devices all-reduce from one another's memory
  // (DeviceOptions::peer_collectives), each mapping the others' as the
  // device processes of one host do.
  Devices(const Model& model, int num_devices, bool peer = false)
      : model_(model),
        peer_(peer),
        layout_(model.config.num_layers, model.config.num_kv_heads, kBlockSize,
                model.config.head_dim, 3 * kMaxBlocks, 4, num_devices) {
    backup_ = std::move(ShmRegion::Create("test-kv-backup", layout_.total_bytes())).value();
    devices_.resize(num_devices);
  }

  // Starts device d (a new one if it was gone).
  void Start(int d) {
    Device& dev = devices_[d];
    dev.backend = MakeCpuBackend(1);
    DeviceOptions o;
    o.block_size = kBlockSize;
    o.kv_pages = 4096;
    o.peer_collectives = peer_;
    dev.model = std::make_unique<DeviceModel>(model_.config, d, dev.backend.get(), o);
    dev.writer = std::make_unique<BackupWriter>(backup_.data(), layout_, d);
    dev.model->SetBackup(dev.writer.get(), layout_, backup_.data());
  }
  // Device d leaves, its backup copies done (the writer stops before the KV
  // pool it reads goes away).
  void Stop(int d) {
    Device& dev = devices_[d];
    dev.model->DrainBackup();
    dev.comm.reset();
    dev.writer.reset();
    dev.model.reset();
    dev.backend.reset();
  }

  Status Load(const Plan& plan) {
    for (int d : plan.alive) Start(d);
    for (int d : plan.alive) FS_RETURN_IF_ERROR(devices_[d].model->LoadShare(plan, *model_.host));
    plan_ = plan;
    tables_.Reset(plan);
    return FormGroup();
  }

  // One step on every active device, each on its own thread.
  Result<std::vector<float>> Step(StepBatch b) {
    for (size_t i = 0; i < b.seqs.size(); ++i) {
      StepSeq& s = b.seqs[i];
      s.backup_slot = static_cast<int32_t>(i);
      s.backup_first_block = s.start_pos / kBlockSize;
      s.backup_count =
          (s.start_pos + s.num_tokens + kBlockSize - 1) / kBlockSize - s.backup_first_block;
      s.backup_offset = static_cast<int32_t>(b.backup_blocks.size());
      for (int k = 0; k < s.backup_count; ++k)
        b.backup_blocks.push_back(static_cast<int32_t>(i * kMaxBlocks + s.backup_first_block + k));
    }
    tables_.Fill(plan_, &b);
    std::vector<float> logits(static_cast<size_t>(b.num_logits_rows) * model_.config.vocab_size);
    FS_RETURN_IF_ERROR(OnActive([&](int d, Communicator& comm) {
      return devices_[d].model->Forward(b, comm, logits.data(), nullptr);
    }));
    return logits;
  }

  // Moves the alive devices of `next` to it (devices no longer alive are
  // gone; joining ones must have been started).
  Status Apply(const Plan& next, const std::vector<SeqRestore>& seqs) {
    // As the coordinator does: every backup is complete before any restore.
    for (Device& dev : devices_) {
      if (dev.model) dev.model->DrainBackup();
    }
    for (int d : plan_.alive) {
      if (!next.IsActive(d) && !std::count(next.alive.begin(), next.alive.end(), d)) Stop(d);
    }
    const Plan prev = plan_;
    plan_ = next;
    FS_RETURN_IF_ERROR(FormGroup());
    const DeviceRestores tables = tables_.Move(next, seqs);
    return OnActive([&](int d, Communicator& comm) {
      ApplyStats stats;
      return devices_[d].model->ApplyPlan(prev, next, RecoveryMode::kFull, *model_.host, comm,
                                          tables[d], &stats);
    });
  }

  // KV bytes the devices have copied into the backup.
  int64_t BackupBytes() {
    int64_t total = 0;
    for (Device& dev : devices_) {
      if (!dev.model) continue;
      dev.model->DrainBackup();
      total += dev.writer->bytes_copied();
    }
    return total;
  }
  const Plan& plan() const { return plan_; }
  // Whether every active device's last all-reduces read the others' memory.
  bool PeerReady() const {
    for (int d : plan_.active) {
      if (!devices_[d].model->peer_collectives_ready()) return false;
    }
    return true;
  }

 private:
  struct Device {
    std::unique_ptr<Backend> backend;
    std::unique_ptr<DeviceModel> model;
    std::unique_ptr<BackupWriter> writer;
    std::unique_ptr<Communicator> comm;
  };

  Status FormGroup() {
    const int n = static_cast<int>(plan_.active.size());
    FS_ASSIGN_OR_RETURN(ShmRegion region, ShmCommunicator::CreateRegion(n, 64 << 10));
    for (int i = 0; i < n; ++i) {
      FS_ASSIGN_OR_RETURN(ShmRegion mapped, ShmRegion::Map(::dup(region.fd())));
      devices_[plan_.active[i]].comm =
          std::make_unique<ShmCommunicator>(std::move(mapped), i, 30000);
    }
    return Status::Ok();
  }

  Status OnActive(const std::function<Status(int, Communicator&)>& fn) {
    std::vector<Status> results(plan_.active.size());
    std::vector<std::thread> threads;
    for (size_t i = 0; i < plan_.active.size(); ++i) {
      const int d = plan_.active[i];
      threads.emplace_back([&, i, d] { results[i] = fn(d, *devices_[d].comm); });
    }
    for (auto& t : threads) t.join();
    for (size_t i = 0; i < results.size(); ++i) {
      if (!results[i].ok())
        return results[i].WithContext("device " + std::to_string(plan_.active[i]));
    }
    return Status::Ok();
  }

  const Model& model_;
  const bool peer_;
  BackupLayout layout_;
  ShmRegion backup_;
  std::vector<Device> devices_;
  Plan plan_;
  Tables tables_;
};

// Replays reference steps [from, to) on the devices, with each sequence's DP
// rank from `dp_ranks`; the logits must be the reference's, bit for bit.
void Replay(const ModelCase& m, Devices& devices, const std::vector<int>& dp_ranks, int from,
            int to, double* worst) {
  const Reference& ref = GetReference(m);
  const int vocab = GetModel(m).config.vocab_size;
  for (int step = from; step < to; ++step) {
    StepBatch b = ref.steps[step];
    for (size_t i = 0; i < b.seqs.size(); ++i) b.seqs[i].dp_rank = dp_ranks[i];
    auto got = devices.Step(b);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    for (int r = 0; r < b.num_logits_rows; ++r) {
      const float* g = got->data() + static_cast<int64_t>(r) * vocab;
      const float* w = ref.logits[step].data() + static_cast<int64_t>(r) * vocab;
      *worst = std::max(*worst, RowError(g, w, vocab));
      // Bit for bit: partial sums are exact and every kernel batch-invariant.
      EXPECT_TRUE(std::equal(g, g + vocab, w))
          << "logits differ at step " << step << " row " << r << " by " << RowError(g, w, vocab);
      ASSERT_EQ(std::max_element(g, g + vocab) - g, std::max_element(w, w + vocab) - w)
          << "greedy choice differs at step " << step << " row " << r;
    }
  }
}

// Spread over the active devices, as the router would.
std::vector<int> DpRanks(const Plan& p) {
  const int n = static_cast<int>(p.active.size());
  return {p.active[0], p.active[(3 + n / 2) % n], p.active[(7 * n / 8 + 1) % n]};
}

int64_t TokensAfter(const Reference& ref, int steps) {
  int64_t t = 0;
  for (int s = 0; s < steps; ++s) t += ref.steps[s].num_tokens();
  return t;
}

std::vector<ModelCase> Cases() {
  // Head groups 1, 2, 3, 4, 8; group sizes 1 to 4; dense and MoE. The 4-group
  // dense model has the shape of stories260K.
  return {{"micro-llama", 4, 1},     {"micro-llama", 4, 2},     {"micro-llama", 6, 3},
          {"stories-260k", 0, 0},    {"micro-llama", 16, 8},    {"micro-mixtral", 3, 1},
          {"micro-mixtral", 6, 2},   {"micro-mixtral", 3, 3},   {"micro-mixtral", 8, 4},
          {"micro-mixtral", 8, 8},   {"micro-qwen2", 6, 3},     {"micro-qwen2", 8, 1},
          {"micro-qwen3", 8, 4},     {"micro-qwen3", 10, 5},    {"micro-qwen3-moe", 8, 4},
          {"micro-qwen3-moe", 6, 3}, {"micro-phi3", 8, 4},      {"micro-phi3", 6, 6},
          {"micro-gemma3", 8, 4},    {"micro-gemma3", 4, 1},    {"micro-gemma2", 8, 4},
          {"micro-gemma2", 6, 3},    {"micro-qwen2-moe", 8, 4}, {"micro-qwen2-moe", 6, 3}};
}

class EveryPlacement : public ::testing::TestWithParam<ModelCase> {};

// 1 to 12 devices under every policy (a plan already checked under another
// policy or count is not run twice).
TEST_P(EveryPlacement, MatchesOneDeviceAndBacksUpEachSlotOnce) {
  const ModelCase m = GetParam();
  const Model& model = GetModel(m);
  const ModelConfig& c = model.config;
  const Reference& ref = GetReference(m);
  const int steps = static_cast<int>(ref.steps.size());
  std::vector<std::string> seen;
  for (int n = 1; n <= kMaxDevices; ++n) {
    for (Policy policy :
         {Policy::kStandard, Policy::kNonUniform, Policy::kCyclic, Policy::kHybrid}) {
      SCOPED_TRACE(std::string(PolicyName(policy)) + " on " + std::to_string(n) + " devices");
      std::vector<int> alive(n);
      std::iota(alive.begin(), alive.end(), 0);
      auto plan = MakePlan(c, policy, n, alive);
      ASSERT_TRUE(plan.ok()) << plan.status().ToString();
      // The plan's layout without the policy's name and the idle devices.
      Plan key = *plan;
      key.policy = Policy::kHybrid;
      key.alive = key.active;
      const std::string layout = PlanToJson(key);
      if (std::count(seen.begin(), seen.end(), layout)) continue;
      seen.push_back(layout);
      Devices devices(model, n);
      ASSERT_TRUE(devices.Load(*plan).ok());
      double worst = 0;
      Replay(m, devices, DpRanks(*plan), 0, steps, &worst);
      EXPECT_EQ(worst, 0.0);
      // Every (layer, head group) of every token, K and V, exactly once.
      EXPECT_EQ(devices.BackupBytes(),
                TokensAfter(ref, steps) * c.num_layers * c.num_kv_heads * 2 * c.head_dim * 4);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, EveryPlacement, ::testing::ValuesIn(Cases()),
                         [](const auto& info) { return info.param.Name(); });

// All-reduces from the devices' own memory (PeerReducer): the same logits,
// bit for bit, on every device count; a small and a MoE model, the hybrid
// placement (TP and DP attention rows).
TEST(PeerCollectives, MatchOneDevice) {
  for (const ModelCase& m : {ModelCase{"micro-llama", 6, 3}, ModelCase{"micro-mixtral", 8, 4}}) {
    const Model& model = GetModel(m);
    const Reference& ref = GetReference(m);
    for (int n : {2, 3, 5, 8}) {
      SCOPED_TRACE(m.Name() + " on " + std::to_string(n) + " devices");
      std::vector<int> alive(n);
      std::iota(alive.begin(), alive.end(), 0);
      auto plan = MakePlan(model.config, Policy::kHybrid, n, alive);
      ASSERT_TRUE(plan.ok());
      Devices devices(model, n, /*peer=*/true);
      ASSERT_TRUE(devices.Load(*plan).ok());
      double worst = 0;
      Replay(m, devices, DpRanks(*plan), 0, static_cast<int>(ref.steps.size()), &worst);
      EXPECT_EQ(worst, 0.0);
      EXPECT_TRUE(devices.PeerReady());
    }
  }
}

// Plan changes on live devices: a device leaves (its share and the KV it
// cached move to the others, restored from the backup whichever device wrote
// it), later one joins; the outputs do not change.
struct ChangeCase {
  ModelCase model;
  Policy policy;
  int devices;
  std::vector<std::pair<bool, int>> events;  // (joins, device), one after each of the first steps
  // DeviceOptions::peer_collectives: each new group maps the members it
  // had not mapped and lets go of those that left.
  bool peer = false;
};

class PlanChanges : public ::testing::TestWithParam<ChangeCase> {};

TEST_P(PlanChanges, KeepTheOutputs) {
  const ChangeCase cc = GetParam();
  const Model& model = GetModel(cc.model);
  const ModelConfig& c = model.config;
  const Reference& ref = GetReference(cc.model);
  std::vector<int> alive(cc.devices);
  std::iota(alive.begin(), alive.end(), 0);
  auto plan = MakePlan(c, cc.policy, cc.devices, alive);
  ASSERT_TRUE(plan.ok());
  Devices devices(model, cc.devices, cc.peer);
  ASSERT_TRUE(devices.Load(*plan).ok());
  std::vector<int> ranks = DpRanks(*plan);
  double worst = 0;
  int step = 0;
  for (auto [joins, d] : cc.events) {
    Replay(cc.model, devices, ranks, step, step + 1, &worst);
    ++step;
    if (joins) {
      alive.push_back(d);
      std::sort(alive.begin(), alive.end());
      devices.Start(d);
    } else {
      std::erase(alive, d);
    }
    auto next = Replan(devices.plan(), c, alive);
    ASSERT_TRUE(next.ok()) << next.status().ToString();
    SCOPED_TRACE(std::string(joins ? "join " : "leave ") + std::to_string(d));
    // Sequences whose DP rank left go to another device; every KV position
    // so far is in the backup (the devices drain it before a change).
    std::vector<SeqRestore> seqs;
    for (size_t i = 0; i < ranks.size(); ++i) {
      if (!next->IsActive(ranks[i])) ranks[i] = next->active[i % next->active.size()];
      SeqRestore sr;
      sr.seq_id = static_cast<int64_t>(i) + 1;
      sr.dp_rank = ranks[i];
      for (int s = 0; s < step; ++s) sr.restore_tokens += ref.steps[s].seqs[i].num_tokens;
      for (int k = 0; k < kMaxBlocks; ++k)
        sr.backup_blocks.push_back(static_cast<int32_t>(i * kMaxBlocks + k));
      seqs.push_back(sr);
    }
    Status st = devices.Apply(*next, seqs);
    ASSERT_TRUE(st.ok()) << st.ToString();
  }
  Replay(cc.model, devices, ranks, step, static_cast<int>(ref.steps.size()), &worst);
  EXPECT_EQ(worst, 0.0);
  if (cc.peer) {
    EXPECT_TRUE(devices.PeerReady());
  }
}

std::vector<ChangeCase> ChangeCases() {
  const ModelCase stories{"stories-260k", 0, 0}, one_group{"micro-llama", 4, 1},
      moe{"micro-mixtral", 8, 4}, moe_three{"micro-mixtral", 6, 3}, qwen2{"micro-qwen2", 6, 3},
      qwen3{"micro-qwen3", 10, 5}, qwen3_moe{"micro-qwen3-moe", 6, 3}, phi3{"micro-phi3", 6, 6},
      gemma3{"micro-gemma3", 8, 4}, qwen2_moe{"micro-qwen2-moe", 8, 4};
  return {
      // Replicated groups: lose a writer, fall to whole groups, grow back.
      {stories,
       Policy::kNonUniform,
       8,
       {{false, 0}, {false, 3}, {false, 5}, {false, 6}, {true, 6}, {true, 0}}},
      {stories, Policy::kCyclic, 8, {{false, 1}, {false, 2}, {false, 4}, {true, 2}, {true, 4}}},
      {moe, Policy::kCyclic, 10, {{false, 9}, {false, 4}, {true, 9}, {false, 0}, {true, 4}}},
      // One group of four query heads on 12 devices: 8 compute nothing.
      {one_group, Policy::kCyclic, 12, {{false, 2}, {false, 0}, {false, 1}, {true, 0}}},
      {one_group, Policy::kNonUniform, 6, {{false, 0}, {false, 3}, {true, 0}, {true, 3}}},
      // Pure DP attention, then TP heads again, then DP again.
      {stories, Policy::kHybrid, 6, {{false, 2}, {false, 5}, {false, 0}, {true, 5}, {true, 2}}},
      {moe_three, Policy::kHybrid, 5, {{false, 4}, {false, 1}, {true, 1}, {false, 0}}},
      // vLLM's layout (TP 8 over 4 groups), then TP 4 on the survivors.
      {moe, Policy::kStandard, 8, {{false, 7}, {true, 7}}},
      // Biases and head norms go with their heads (replicated, so any device
      // gaining a head has them).
      {qwen2, Policy::kNonUniform, 7, {{false, 1}, {false, 4}, {true, 4}, {false, 0}}},
      {qwen3, Policy::kHybrid, 6, {{false, 5}, {false, 2}, {true, 2}, {true, 5}}},
      {qwen3_moe, Policy::kCyclic, 9, {{false, 8}, {false, 3}, {true, 8}, {false, 0}}},
      // Fused projections: a device gaining a head reads only its rows.
      {phi3, Policy::kNonUniform, 5, {{false, 2}, {false, 4}, {true, 2}, {true, 4}}},
      {gemma3, Policy::kHybrid, 7, {{false, 6}, {false, 1}, {true, 1}, {true, 6}}},
      // The shared expert's slots move with the routed experts' shards.
      {qwen2_moe, Policy::kCyclic, 7, {{false, 3}, {false, 6}, {true, 6}, {false, 0}}},
      // All-reduces from the devices' own memory across leaves and joins.
      {moe, Policy::kHybrid, 6, {{false, 2}, {false, 0}, {true, 2}, {true, 0}}, true},
  };
}

INSTANTIATE_TEST_SUITE_P(Scripts, PlanChanges, ::testing::ValuesIn(ChangeCases()),
                         [](const auto& info) {
                           return info.param.model.Name() + "_" + PolicyName(info.param.policy) +
                                  "_" + std::to_string(info.param.devices) +
                                  (info.param.peer ? "_peer" : "");
                         });

}  // namespace
}  // namespace failsafe
