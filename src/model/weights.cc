#include "model/weights.h"

#include <sys/stat.h>

#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "common/check.h"
#include "model/file_util.h"

namespace failsafe {

namespace tensor_names {
std::string Embedding() { return "model.embed_tokens.weight"; }
std::string FinalNorm() { return "model.norm.weight"; }
std::string LmHead(const ModelConfig& c) {
  return c.tie_word_embeddings ? Embedding() : "lm_head.weight";
}
static std::string L(int layer) { return "model.layers." + std::to_string(layer) + "."; }
std::string AttnNorm(int layer) { return L(layer) + "input_layernorm.weight"; }
std::string FfnNorm(const ModelConfig& c, int layer) {
  return L(layer) +
         (c.gemma() ? "pre_feedforward_layernorm.weight" : "post_attention_layernorm.weight");
}
std::string AttnOutNorm(int layer) { return L(layer) + "post_attention_layernorm.weight"; }
std::string FfnOutNorm(int layer) { return L(layer) + "post_feedforward_layernorm.weight"; }
std::string Q(int layer) { return L(layer) + "self_attn.q_proj.weight"; }
std::string K(int layer) { return L(layer) + "self_attn.k_proj.weight"; }
std::string V(int layer) { return L(layer) + "self_attn.v_proj.weight"; }
std::string O(int layer) { return L(layer) + "self_attn.o_proj.weight"; }
std::string QBias(int layer) { return L(layer) + "self_attn.q_proj.bias"; }
std::string KBias(int layer) { return L(layer) + "self_attn.k_proj.bias"; }
std::string VBias(int layer) { return L(layer) + "self_attn.v_proj.bias"; }
std::string QNorm(int layer) { return L(layer) + "self_attn.q_norm.weight"; }
std::string KNorm(int layer) { return L(layer) + "self_attn.k_norm.weight"; }
static bool MixtralNames(const ModelConfig& c) { return c.architecture == Architecture::kMixtral; }
// A projection of expert slot e (e < 0: the dense FFN's): Mixtral's w1/w3/w2
// under block_sparse_moe, or the dense names under mlp.experts.e, or, past the
// routed experts, Qwen2-MoE's shared expert.
static std::string Ffn(const ModelConfig& c, int layer, int e, const char* proj,
                       const char* mixtral) {
  if (e < 0) return L(layer) + "mlp." + proj + ".weight";
  if (e >= c.num_experts) return L(layer) + "mlp.shared_expert." + proj + ".weight";
  if (MixtralNames(c))
    return L(layer) + "block_sparse_moe.experts." + std::to_string(e) + "." + mixtral + ".weight";
  return L(layer) + "mlp.experts." + std::to_string(e) + "." + proj + ".weight";
}
std::string Gate(const ModelConfig& c, int layer, int e) {
  return Ffn(c, layer, e, "gate_proj", "w1");
}
std::string Up(const ModelConfig& c, int layer, int e) { return Ffn(c, layer, e, "up_proj", "w3"); }
std::string Down(const ModelConfig& c, int layer, int e) {
  return Ffn(c, layer, e, "down_proj", "w2");
}
std::string Router(const ModelConfig& c, int layer) {
  return L(layer) + (MixtralNames(c) ? "block_sparse_moe.gate.weight" : "mlp.gate.weight");
}
std::string SharedExpertGate(int layer) { return L(layer) + "mlp.shared_expert_gate.weight"; }
std::string Qkv(int layer) { return L(layer) + "self_attn.qkv_proj.weight"; }
std::string GateUp(int layer) { return L(layer) + "mlp.gate_up_proj.weight"; }
Rows QRows(const ModelConfig& c, int layer) {
  return c.fused_projections() ? Rows{Qkv(layer), 0} : Rows{Q(layer), 0};
}
Rows KRows(const ModelConfig& c, int layer) {
  return c.fused_projections() ? Rows{Qkv(layer), c.q_dim()} : Rows{K(layer), 0};
}
Rows VRows(const ModelConfig& c, int layer) {
  return c.fused_projections() ? Rows{Qkv(layer), c.q_dim() + c.kv_dim()} : Rows{V(layer), 0};
}
// Where a slot's columns start in the shared expert (0 for the rest).
static int64_t SharedOffset(const ModelConfig& c, int e) {
  return e >= c.num_experts && c.shared_expert_size > 0
             ? static_cast<int64_t>(e - c.num_experts) * c.intermediate_size
             : 0;
}
Rows GateRows(const ModelConfig& c, int layer, int e) {
  return c.fused_projections() && e < 0 ? Rows{GateUp(layer), 0}
                                        : Rows{Gate(c, layer, e), SharedOffset(c, e)};
}
Rows UpRows(const ModelConfig& c, int layer, int e) {
  return c.fused_projections() && e < 0 ? Rows{GateUp(layer), c.intermediate_size}
                                        : Rows{Up(c, layer, e), SharedOffset(c, e)};
}
Rows DownCols(const ModelConfig& c, int layer, int e) {
  return Rows{Down(c, layer, e), SharedOffset(c, e)};
}
}  // namespace tensor_names

std::vector<ExpectedTensor> ExpectedTensors(const ModelConfig& c) {
  namespace tn = tensor_names;
  const int64_t h = c.hidden_size, v = c.vocab_size, inter = c.intermediate_size;
  std::vector<ExpectedTensor> out;
  out.push_back({tn::Embedding(), {v, h}});
  for (int l = 0; l < c.num_layers; ++l) {
    out.push_back({tn::AttnNorm(l), {h}});
    if (c.fused_projections()) {
      out.push_back({tn::Qkv(l), {c.q_dim() + 2 * c.kv_dim(), h}});
    } else {
      out.push_back({tn::Q(l), {c.q_dim(), h}});
      out.push_back({tn::K(l), {c.kv_dim(), h}});
      out.push_back({tn::V(l), {c.kv_dim(), h}});
    }
    out.push_back({tn::O(l), {h, c.q_dim()}});
    if (c.qkv_bias()) {
      out.push_back({tn::QBias(l), {c.q_dim()}});
      out.push_back({tn::KBias(l), {c.kv_dim()}});
      out.push_back({tn::VBias(l), {c.kv_dim()}});
    }
    if (c.qk_norm()) {
      out.push_back({tn::QNorm(l), {c.head_dim}});
      out.push_back({tn::KNorm(l), {c.head_dim}});
    }
    out.push_back({tn::FfnNorm(c, l), {h}});
    if (c.gemma()) {
      out.push_back({tn::AttnOutNorm(l), {h}});
      out.push_back({tn::FfnOutNorm(l), {h}});
    }
    if (c.is_moe()) {
      out.push_back({tn::Router(c, l), {c.num_experts, h}});
      for (int e = 0; e < c.num_experts; ++e) {
        out.push_back({tn::Gate(c, l, e), {inter, h}});
        out.push_back({tn::Down(c, l, e), {h, inter}});
        out.push_back({tn::Up(c, l, e), {inter, h}});
      }
      if (c.shared_expert_size > 0) {
        const int64_t shared = c.shared_expert_size, e = c.num_experts;
        out.push_back({tn::Gate(c, l, e), {shared, h}});
        out.push_back({tn::Down(c, l, e), {h, shared}});
        out.push_back({tn::Up(c, l, e), {shared, h}});
        out.push_back({tn::SharedExpertGate(l), {1, h}});
      }
    } else if (c.fused_projections()) {
      out.push_back({tn::GateUp(l), {2 * inter, h}});
      out.push_back({tn::Down(c, l, -1), {h, inter}});
    } else {
      out.push_back({tn::Gate(c, l, -1), {inter, h}});
      out.push_back({tn::Up(c, l, -1), {inter, h}});
      out.push_back({tn::Down(c, l, -1), {h, inter}});
    }
  }
  out.push_back({tn::FinalNorm(), {h}});
  if (!c.tie_word_embeddings) out.push_back({"lm_head.weight", {v, h}});
  return out;
}

namespace {

std::string ShapeString(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

bool FileExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Where a vision-language checkpoint keeps its language model's tensors,
// as published (`language_model.model.`) or as newer transformers save it
// (`model.language_model.`), and its vision tower and projector.
constexpr std::pair<const char*, const char*> kTextPrefixes[] = {
    {"language_model.model.", "model."},
    {"model.language_model.", "model."},
    {"language_model.lm_head.", "lm_head."},
};
constexpr const char* kVisionPrefixes[] = {"vision_tower.", "multi_modal_projector.",
                                           "model.vision_tower.", "model.multi_modal_projector."};

bool StartsWith(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

}  // namespace

std::optional<std::string> TextModelTensorName(const ModelConfig& config,
                                               const std::string& stored) {
  if (!config.vision_language) return stored;
  for (const char* v : kVisionPrefixes) {
    if (StartsWith(stored, v)) return std::nullopt;
  }
  for (auto [from, to] : kTextPrefixes) {
    if (StartsWith(stored, from)) return to + stored.substr(std::strlen(from));
  }
  return stored;
}

// A tensor the engine would not read (a bias, a norm of another architecture)
// means the checkpoint computes something else: loading it anyway would give
// wrong numbers, so it is refused by name. Tolerated: RoPE frequency buffers
// older checkpoints saved (the engine derives them from config.json) and an
// lm_head.weight beside tied embeddings (Hugging Face ties it to the
// embedding as well).
Status WeightStore::RefuseUnreadTensors(const WeightStore& store,
                                        const std::vector<ExpectedTensor>& expected,
                                        const ModelConfig& config) {
  std::set<std::string> names;
  for (auto& e : expected) names.insert(e.name);
  for (auto& [name, ref] : store.tensors_) {
    if (names.count(name) || EndsWith(name, ".rotary_emb.inv_freq")) continue;
    if (config.tie_word_embeddings && name == "lm_head.weight") continue;
    return InvalidArgument(
        "{}: tensor '{}' is not part of a {} model as config.json describes it (the engine would "
        "not read it)",
        *ref.file, name, ArchitectureName(config.architecture));
  }
  return Status::Ok();
}

Result<std::unique_ptr<WeightStore>> WeightStore::Open(const std::string& model_dir,
                                                       const ModelConfig& config) {
  auto store = std::unique_ptr<WeightStore>(new WeightStore());
  store->model_dir_ = model_dir;
  std::vector<std::string> files;
  const std::string index_path = model_dir + "/model.safetensors.index.json";
  std::map<std::string, std::string> weight_map;  // tensor -> file named by the index
  if (FileExists(index_path)) {
    FS_ASSIGN_OR_RETURN(std::string text, ReadFileToString(index_path));
    auto j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("weight_map") ||
        !j["weight_map"].is_object()) {
      return InvalidArgument("{}: field 'weight_map' is missing or not an object", index_path);
    }
    std::set<std::string> unique;
    for (auto& [name, file] : j["weight_map"].items()) {
      if (!file.is_string())
        return InvalidArgument("{}: field 'weight_map.{}' is not a file name", index_path, name);
      std::string f = file.get<std::string>();
      if (f.find('/') != std::string::npos) {
        return InvalidArgument("{}: field 'weight_map.{}' names a file outside the model directory",
                               index_path, name);
      }
      unique.insert(f);
      std::optional<std::string> text = TextModelTensorName(config, name);
      if (text) weight_map[*text] = f;  // else the vision tower's: mapped, never read
    }
    files.assign(unique.begin(), unique.end());
  } else {
    files.push_back("model.safetensors");
  }
  for (auto& f : files) {
    FS_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(model_dir + "/" + f));
    store->files_.push_back(std::move(file));
  }
  for (auto& file : store->files_) {
    for (auto& t : file->tensors()) {
      std::optional<std::string> name = TextModelTensorName(config, t.name);
      if (!name) {
        store->skipped_tensors_++;
        store->skipped_bytes_ += static_cast<int64_t>(t.end - t.begin);
        continue;
      }
      if (!store->tensors_.emplace(*name, file->Ref(&t)).second)
        return InvalidArgument("{}: tensor '{}' is stored twice{}", file->path(), *name,
                               *name == t.name ? "" : " (the second as '" + t.name + "')");
    }
  }
  std::set<DType> matrix_types;
  const std::vector<ExpectedTensor> expected = ExpectedTensors(config);
  FS_RETURN_IF_ERROR(RefuseUnreadTensors(*store, expected, config));
  for (auto& e : expected) {
    auto it = store->tensors_.find(e.name);
    if (it == store->tensors_.end()) {
      std::string where = weight_map.count(e.name)
                              ? model_dir + "/" + weight_map[e.name]
                              : (files.size() == 1 ? model_dir + "/" + files[0] : index_path);
      return InvalidArgument("{}: tensor '{}' is missing", where, e.name);
    }
    if (it->second.info->shape != e.shape) {
      return InvalidArgument("{}: tensor '{}': field 'shape' is {}, config.json implies {}",
                             *it->second.file, e.name, ShapeString(it->second.info->shape),
                             ShapeString(e.shape));
    }
    if (e.shape.size() == 2) matrix_types.insert(it->second.info->dtype);
    if (!weight_map.empty()) {
      auto wm = weight_map.find(e.name);
      if (wm != weight_map.end() && *it->second.file != model_dir + "/" + wm->second) {
        return InvalidArgument("{}: tensor '{}' is in {}, not in {} as the index says", index_path,
                               e.name, *it->second.file, wm->second);
      }
    }
  }
  if (matrix_types.size() == 1) store->matrix_dtype_ = *matrix_types.begin();
  return store;
}

TensorRef WeightStore::Get(const std::string& name) const {
  auto it = tensors_.find(name);
  FS_CHECK_MSG(it != tensors_.end(), "unknown tensor {}", name);
  return it->second;
}

int64_t WeightStore::FileBytes() const {
  int64_t total = 0;
  for (auto& f : files_) {
    for (auto& t : f->tensors()) total += static_cast<int64_t>(t.end - t.begin);
  }
  return total - skipped_bytes_;
}

}  // namespace failsafe
