#include "model/config.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "model/file_util.h"

namespace failsafe {

using nlohmann::json;

namespace {

// Each architecture's Hugging Face names: `architectures[0]` and model_type.
struct ArchitectureNames {
  Architecture arch;
  const char* name;
  const char* model_type;
};
constexpr ArchitectureNames kArchitectures[] = {
    {Architecture::kLlama, "LlamaForCausalLM", "llama"},
    {Architecture::kMistral, "MistralForCausalLM", "mistral"},
    {Architecture::kMixtral, "MixtralForCausalLM", "mixtral"},
    {Architecture::kQwen2, "Qwen2ForCausalLM", "qwen2"},
    {Architecture::kQwen3, "Qwen3ForCausalLM", "qwen3"},
    {Architecture::kQwen3Moe, "Qwen3MoeForCausalLM", "qwen3_moe"},
    {Architecture::kQwen2Moe, "Qwen2MoeForCausalLM", "qwen2_moe"},
    {Architecture::kPhi3, "Phi3ForCausalLM", "phi3"},
    {Architecture::kGemma2, "Gemma2ForCausalLM", "gemma2"},
    {Architecture::kGemma3, "Gemma3ForCausalLM", "gemma3_text"},
};

const ArchitectureNames& NamesOf(Architecture arch) {
  for (const ArchitectureNames& a : kArchitectures) {
    if (a.arch == arch) return a;
  }
  return kArchitectures[0];  // unreachable: every value is listed
}

bool IsQwen(Architecture arch) {
  return arch == Architecture::kQwen2 || arch == Architecture::kQwen3 ||
         arch == Architecture::kQwen3Moe || arch == Architecture::kQwen2Moe;
}

}  // namespace

const char* ArchitectureName(Architecture arch) { return NamesOf(arch).name; }

void LongRope::SetContext(int64_t max_positions, double attention) {
  const double factor =
      static_cast<double>(max_positions) / static_cast<double>(original_max_position_embeddings);
  use_long = factor > 1.0;
  attention_factor =
      attention > 0 ? attention
      : factor <= 1.0
          ? 1.0
          : std::sqrt(1.0 + std::log(factor) /
                                std::log(static_cast<double>(original_max_position_embeddings)));
}

float ModelConfig::AttentionScale() const {
  return 1.0f / std::sqrt(static_cast<float>(query_pre_attn_scalar > 0 ? query_pre_attn_scalar
                                                                       : head_dim));
}

int64_t ModelConfig::NumParameters() const {
  int64_t h = hidden_size;
  int64_t attn = h * q_dim() + 2 * h * kv_dim() + int64_t(q_dim()) * h;
  if (qkv_bias()) attn += q_dim() + 2 * kv_dim();
  if (qk_norm()) attn += 2 * head_dim;
  if (gemma()) attn += 2 * h;  // the sandwich norms
  int64_t ffn = 3 * h * intermediate_size;
  if (is_moe()) ffn = ffn * num_experts + h * num_experts;
  if (shared_expert_size > 0) ffn += 3 * h * shared_expert_size + h;  // with its gate
  int64_t per_layer = attn + ffn + 2 * h;
  int64_t embed = int64_t(vocab_size) * h;
  return per_layer * num_layers + embed * (tie_word_embeddings ? 1 : 2) + h;
}

namespace {

// Field readers that name the file and field in every error.
class Reader {
 public:
  Reader(const json& j, const std::string& source) : j_(j), source_(source) {}

  Status Int(const char* field, int* out, bool required, int64_t min_value = 1) {
    auto it = j_.find(field);
    if (it == j_.end() || it->is_null()) {
      if (required) return InvalidArgument("{}: field '{}' is missing", source_, field);
      return Status::Ok();
    }
    if (!it->is_number_integer()) {
      return InvalidArgument("{}: field '{}' must be an integer", source_, field);
    }
    int64_t v = it->get<int64_t>();
    if (v < min_value || v > (1LL << 30)) {
      return InvalidArgument("{}: field '{}' = {} is out of range", source_, field, v);
    }
    *out = static_cast<int>(v);
    return Status::Ok();
  }

  Status Double(const char* field, double* out, bool required) {
    auto it = j_.find(field);
    if (it == j_.end() || it->is_null()) {
      if (required) return InvalidArgument("{}: field '{}' is missing", source_, field);
      return Status::Ok();
    }
    if (!it->is_number()) return InvalidArgument("{}: field '{}' must be a number", source_, field);
    *out = it->get<double>();
    if (!(*out > 0)) return InvalidArgument("{}: field '{}' must be positive", source_, field);
    return Status::Ok();
  }

  Status Bool(const char* field, bool* out) {
    auto it = j_.find(field);
    if (it == j_.end() || it->is_null()) return Status::Ok();
    if (!it->is_boolean())
      return InvalidArgument("{}: field '{}' must be true or false", source_, field);
    *out = it->get<bool>();
    return Status::Ok();
  }

  // bos/eos may be an int or a list of ints (Llama-3.1 lists several eos ids).
  Status TokenId(const char* field, int* out) {
    auto it = j_.find(field);
    if (it == j_.end() || it->is_null()) return Status::Ok();
    const json* v = &*it;
    if (v->is_array()) {
      if (v->empty()) return Status::Ok();
      v = &(*v)[0];
    }
    if (!v->is_number_integer())
      return InvalidArgument("{}: field '{}' must be a token id", source_, field);
    *out = v->get<int>();
    return Status::Ok();
  }

 private:
  const json& j_;
  const std::string& source_;
};

// Fields of Hugging Face configs that change what the model computes in ways
// this engine does not implement (biases, other activations, partial RoPE).
// Ignoring them would load the checkpoint and give wrong numbers, so each is
// refused naming the field; their neutral values are accepted.
Status RefuseUncomputedFeatures(const json& j, const std::string& source, const ModelConfig& c) {
  const bool gemma = c.gemma();
  const char* act = gemma ? "gelu_pytorch_tanh" : "silu";
  for (const char* field : {"attention_bias", "mlp_bias"}) {
    auto it = j.find(field);
    if (it == j.end() || it->is_null() || (it->is_boolean() && !it->get<bool>())) continue;
    return InvalidArgument("{}: field '{}' = {}: biases are not supported", source, field,
                           it->dump());
  }
  for (const char* field : {"hidden_act", "hidden_activation"}) {
    auto it = j.find(field);
    if (it == j.end() || it->is_null()) continue;
    if (it->is_string() && (*it == act || (!gemma && *it == "swish"))) continue;
    return InvalidArgument("{}: field '{}' = {}: only {} is supported", source, field, it->dump(),
                           act);
  }
  auto prf = j.find("partial_rotary_factor");
  if (prf != j.end() && !prf->is_null() && !(prf->is_number() && prf->get<double>() == 1.0)) {
    return InvalidArgument(
        "{}: field 'partial_rotary_factor' = {}: only 1 (RoPE on the whole head) "
        "is supported",
        source, prf->dump());
  }
  return Status::Ok();
}

// Gemma 2's and 3's fields (ModelConfig::gemma()).
Status ParseGemma(const json& j, const std::string& source, ModelConfig* c) {
  Reader r(j, source);
  const bool gemma3 = c->architecture == Architecture::kGemma3;
  FS_RETURN_IF_ERROR(r.Double("attn_logit_softcapping", &c->attn_softcap, false));
  FS_RETURN_IF_ERROR(r.Double("final_logit_softcapping", &c->final_softcap, false));
  c->query_pre_attn_scalar = c->head_dim;
  FS_RETURN_IF_ERROR(r.Double("query_pre_attn_scalar", &c->query_pre_attn_scalar, false));
  if (gemma3) {  // Gemma 2's layers share one RoPE base
    c->rope_local_theta = 10000.0;
    FS_RETURN_IF_ERROR(r.Double("rope_local_base_freq", &c->rope_local_theta, false));
  }
  FS_RETURN_IF_ERROR(r.Int("sliding_window", &c->sliding_window, false));
  // Which layers slide: layer_types, or every layer but each pattern-th.
  c->sliding_layers.assign(c->num_layers, false);
  auto types = j.find("layer_types");
  if (types != j.end() && !types->is_null()) {
    if (!types->is_array() || static_cast<int>(types->size()) != c->num_layers)
      return InvalidArgument("{}: field 'layer_types' must list every layer", source);
    for (int l = 0; l < c->num_layers; ++l) {
      const json& t = (*types)[l];
      if (t != "sliding_attention" && t != "full_attention")
        return InvalidArgument(
            "{}: field 'layer_types' names '{}' (supported: sliding_attention, "
            "full_attention)",
            source, t.dump());
      c->sliding_layers[l] = t == "sliding_attention";
    }
  } else {
    int pattern = gemma3 ? 6 : 2;  // Gemma 2: every other layer, the first sliding
    FS_RETURN_IF_ERROR(r.Int("sliding_window_pattern", &pattern, false));
    for (int l = 0; l < c->num_layers; ++l) c->sliding_layers[l] = (l + 1) % pattern != 0;
  }
  if (c->sliding_window == 0) c->sliding_layers.assign(c->num_layers, false);
  auto rs = j.find("rope_scaling");
  if (rs != j.end() && !rs->is_null()) {
    const std::string type = rs->is_object() ? rs->value("rope_type", rs->value("type", "")) : "";
    if (type != "linear")
      return InvalidArgument(
          "{}: field 'rope_scaling': unsupported rope_type '{}' (supported for "
          "Gemma: linear)",
          source, type);
    Reader sr(*rs, source);
    FS_RETURN_IF_ERROR(sr.Double("factor", &c->rope_linear_factor, true));
  }
  return Status::Ok();
}

// Phi-3's rope_scaling of type longrope (its first name: su).
Status ParseLongRope(const json& j, const json& rs, const std::string& source, ModelConfig* c) {
  LongRope& lr = c->longrope;
  const size_t half = static_cast<size_t>(c->head_dim / 2);
  for (auto [field, out] :
       {std::pair{"short_factor", &lr.short_factor}, std::pair{"long_factor", &lr.long_factor}}) {
    auto it = rs.find(field);
    if (it == rs.end() || !it->is_array() || it->size() != half)
      return InvalidArgument("{}: field 'rope_scaling': '{}' must list head_dim / 2 = {} numbers",
                             source, field, half);
    for (const json& f : *it) {
      if (!f.is_number() || !(f.get<double>() > 0))
        return InvalidArgument("{}: field 'rope_scaling': '{}' holds {}, not a positive number",
                               source, field, f.dump());
      out->push_back(f.get<double>());
    }
  }
  // Where Hugging Face reads the trained context: the config's own field,
  // else the model's context.
  int original = c->max_position_embeddings;
  FS_RETURN_IF_ERROR(Reader(j, source).Int("original_max_position_embeddings", &original, false));
  lr.original_max_position_embeddings = original;
  double attention = 0;
  auto af = rs.find("attention_factor");
  if (af != rs.end() && !af->is_null()) {
    if (!af->is_number() || !(af->get<double>() > 0))
      return InvalidArgument("{}: field 'rope_scaling': 'attention_factor' must be positive",
                             source);
    attention = af->get<double>();
  }
  lr.SetContext(c->max_position_embeddings, attention);
  return Status::Ok();
}

// Gemma 3's text model as transformers' Gemma3TextConfig defines it: its
// published configs leave out what equals these (gemma-3-4b-it's text_config
// names six fields), so each missing field takes its value from here. The
// token ids are left out: the tokenizer and generation_config.json name them.
json Gemma3TextDefaults() {
  return json{{"vocab_size", 262208},
              {"hidden_size", 2304},
              {"intermediate_size", 9216},
              {"num_hidden_layers", 26},
              {"num_attention_heads", 8},
              {"num_key_value_heads", 4},
              {"head_dim", 256},
              {"hidden_activation", "gelu_pytorch_tanh"},
              {"max_position_embeddings", 131072},
              {"rms_norm_eps", 1e-6},
              {"tie_word_embeddings", true},
              {"rope_theta", 1000000.0},
              {"attention_bias", false},
              {"query_pre_attn_scalar", 256},
              {"sliding_window", 4096},
              {"final_logit_softcapping", nullptr},
              {"attn_logit_softcapping", nullptr},
              {"rope_scaling", nullptr},
              {"rope_local_base_freq", 10000.0},
              {"sliding_window_pattern", 6}};
}

// Gemma3ForConditionalGeneration's language model: its text_config over
// Gemma3TextConfig's defaults, with the token ids and embedding tying the
// top level names (transformers reads them there).
Result<json> Gemma3TextOfVisionLanguage(const json& j, const std::string& source) {
  json text = json::object();
  auto tc = j.find("text_config");
  if (tc != j.end() && !tc->is_null()) {
    if (!tc->is_object())
      return InvalidArgument("{}: field 'text_config' must be an object", source);
    text = *tc;
  }
  auto mt = text.find("model_type");
  if (mt != text.end() && *mt != "gemma3_text")
    return InvalidArgument(
        "{}: field 'text_config.model_type' = {}: Gemma3ForConditionalGeneration is supported "
        "with a gemma3_text language model",
        source, mt->dump());
  for (const char* field :
       {"bos_token_id", "eos_token_id", "pad_token_id", "tie_word_embeddings"}) {
    auto top = j.find(field);
    if (top != j.end() && !top->is_null()) text[field] = *top;
  }
  text["architectures"] = {"Gemma3ForCausalLM"};
  text["model_type"] = "gemma3_text";
  return text;
}

}  // namespace

std::string Gemma3TextDefaultsJson() { return Gemma3TextDefaults().dump(); }

Result<ModelConfig> ModelConfig::Parse(const std::string& text, const std::string& source) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgument("{}: not valid JSON", source);
  if (!j.is_object()) return InvalidArgument("{}: expected a JSON object", source);

  ModelConfig c;
  auto arch_it = j.find("architectures");
  if (arch_it == j.end() || !arch_it->is_array() || arch_it->empty() ||
      !(*arch_it)[0].is_string()) {
    return InvalidArgument("{}: field 'architectures' is missing or not a list of names", source);
  }
  std::string arch = (*arch_it)[0].get<std::string>();
  const ArchitectureNames* names = nullptr;
  std::string supported;
  for (const ArchitectureNames& a : kArchitectures) {
    if (arch == a.name) names = &a;
    supported += (supported.empty() ? "" : ", ") + std::string(a.name);
  }
  if (arch == "Gemma3ForConditionalGeneration") {
    FS_ASSIGN_OR_RETURN(json text, Gemma3TextOfVisionLanguage(j, source));
    FS_ASSIGN_OR_RETURN(ModelConfig c, Parse(text.dump(), source + " (text_config)"));
    c.vision_language = true;
    return c;
  }
  if (!names) {
    return InvalidArgument(
        "{}: field 'architectures': unsupported architecture '{}' (supported: {}, and "
        "Gemma3ForConditionalGeneration as text)",
        source, arch, supported);
  }
  if (names->arch == Architecture::kGemma3) {
    json given = std::move(j);
    j = Gemma3TextDefaults();
    j.update(given);  // what the config names over the defaults
  }
  c.architecture = names->arch;
  if (c.gemma()) c.tie_word_embeddings = true;  // Gemma's default

  Reader r(j, source);
  FS_RETURN_IF_ERROR(r.Int("hidden_size", &c.hidden_size, true));
  FS_RETURN_IF_ERROR(r.Int("num_hidden_layers", &c.num_layers, true));
  FS_RETURN_IF_ERROR(r.Int("num_attention_heads", &c.num_heads, true));
  c.num_kv_heads = c.num_heads;
  FS_RETURN_IF_ERROR(r.Int("num_key_value_heads", &c.num_kv_heads, false));
  FS_RETURN_IF_ERROR(r.Int("intermediate_size", &c.intermediate_size, true));
  FS_RETURN_IF_ERROR(r.Int("vocab_size", &c.vocab_size, true));
  c.max_position_embeddings = 2048;
  FS_RETURN_IF_ERROR(r.Int("max_position_embeddings", &c.max_position_embeddings, false));
  FS_RETURN_IF_ERROR(r.Double("rms_norm_eps", &c.rms_norm_eps, false));
  FS_RETURN_IF_ERROR(r.Double("rope_theta", &c.rope_theta, false));
  FS_RETURN_IF_ERROR(r.Bool("tie_word_embeddings", &c.tie_word_embeddings));
  FS_RETURN_IF_ERROR(r.TokenId("bos_token_id", &c.bos_token_id));
  FS_RETURN_IF_ERROR(r.TokenId("eos_token_id", &c.eos_token_id));
  if (c.num_heads % c.num_kv_heads != 0) {
    return InvalidArgument(
        "{}: field 'num_key_value_heads' = {} does not divide num_attention_heads = {}", source,
        c.num_kv_heads, c.num_heads);
  }
  c.head_dim = c.hidden_size / c.num_heads;
  FS_RETURN_IF_ERROR(r.Int("head_dim", &c.head_dim, false));
  if (c.head_dim % 2 != 0) return InvalidArgument("{}: field 'head_dim' must be even", source);
  if (IsQwen(c.architecture)) {
    // Qwen configs name a window (and the layers it would start at) even
    // when no layer uses one: only use_sliding_window turns it on.
    bool windowed = false;
    FS_RETURN_IF_ERROR(r.Bool("use_sliding_window", &windowed));
    if (windowed)
      return InvalidArgument(
          "{}: field 'use_sliding_window' = true: sliding windows on some layers "
          "(max_window_layers) are not supported",
          source);
  } else if (c.architecture != Architecture::kLlama) {
    FS_RETURN_IF_ERROR(r.Int("sliding_window", &c.sliding_window, false));
  }
  if (c.architecture == Architecture::kMixtral) {
    FS_RETURN_IF_ERROR(r.Int("num_local_experts", &c.num_experts, true));
    FS_RETURN_IF_ERROR(r.Int("num_experts_per_tok", &c.experts_per_token, true));
    if (c.experts_per_token > c.num_experts) {
      return InvalidArgument("{}: field 'num_experts_per_tok' exceeds num_local_experts", source);
    }
  }
  if (c.architecture == Architecture::kQwen3Moe || c.architecture == Architecture::kQwen2Moe) {
    // Every layer sparse, each expert moe_intermediate_size wide: Mixtral's
    // routing under other names. Qwen3-MoE renormalises the top-k weights;
    // Qwen2-MoE, as published, keeps the softmax's and adds a shared expert.
    const bool qwen2 = c.architecture == Architecture::kQwen2Moe;
    FS_RETURN_IF_ERROR(r.Int("num_experts", &c.num_experts, true));
    FS_RETURN_IF_ERROR(r.Int("num_experts_per_tok", &c.experts_per_token, true));
    FS_RETURN_IF_ERROR(r.Int("moe_intermediate_size", &c.intermediate_size, true));
    if (c.experts_per_token > c.num_experts)
      return InvalidArgument("{}: field 'num_experts_per_tok' exceeds num_experts", source);
    c.renormalize_topk = false;  // Hugging Face's default
    FS_RETURN_IF_ERROR(r.Bool("norm_topk_prob", &c.renormalize_topk));
    if (!qwen2 && !c.renormalize_topk)
      return InvalidArgument(
          "{}: field 'norm_topk_prob' is false or missing: Qwen3-MoE is supported with "
          "renormalised top-k weights only",
          source);
    if (qwen2) {
      FS_RETURN_IF_ERROR(r.Int("shared_expert_intermediate_size", &c.shared_expert_size, true));
      if (c.shared_expert_size % c.intermediate_size != 0)
        return InvalidArgument(
            "{}: field 'shared_expert_intermediate_size' = {} is not a multiple of "
            "moe_intermediate_size = {}",
            source, c.shared_expert_size, c.intermediate_size);
      bool biased = true;
      FS_RETURN_IF_ERROR(r.Bool("qkv_bias", &biased));
      if (!biased)
        return InvalidArgument("{}: field 'qkv_bias' = false: Qwen2-MoE without biases", source);
    }
    int step = 1;
    FS_RETURN_IF_ERROR(r.Int("decoder_sparse_step", &step, false));
    auto dense = j.find("mlp_only_layers");
    if (step != 1 || (dense != j.end() && !dense->is_null() && !dense->empty()))
      return InvalidArgument(
          "{}: field '{}': dense FFN layers among the sparse ones are not supported", source,
          step != 1 ? "decoder_sparse_step" : "mlp_only_layers");
  }
  if (c.gemma()) FS_RETURN_IF_ERROR(ParseGemma(j, source, &c));
  if (c.bos_token_id >= c.vocab_size || c.eos_token_id >= c.vocab_size) {
    return InvalidArgument("{}: bos/eos token id is not below vocab_size", source);
  }

  FS_RETURN_IF_ERROR(RefuseUncomputedFeatures(j, source, c));

  auto rs = j.find("rope_scaling");
  if (c.gemma()) rs = j.end();  // read with the global layers (ParseGemma)
  if (rs != j.end() && !rs->is_null()) {
    if (!rs->is_object())
      return InvalidArgument("{}: field 'rope_scaling' must be an object", source);
    std::string type;
    if (rs->contains("rope_type") && (*rs)["rope_type"].is_string())
      type = (*rs)["rope_type"];
    else if (rs->contains("type") && (*rs)["type"].is_string())
      type = (*rs)["type"];
    else if (!rs->empty())
      return InvalidArgument("{}: field 'rope_scaling' has no 'rope_type' (supported: llama3)",
                             source);
    if (type == "llama3") {
      Reader sr(*rs, source);
      c.rope_scaling.enabled = true;
      FS_RETURN_IF_ERROR(sr.Double("factor", &c.rope_scaling.factor, true));
      FS_RETURN_IF_ERROR(sr.Double("low_freq_factor", &c.rope_scaling.low_freq_factor, true));
      FS_RETURN_IF_ERROR(sr.Double("high_freq_factor", &c.rope_scaling.high_freq_factor, true));
      int orig = 0;
      FS_RETURN_IF_ERROR(sr.Int("original_max_position_embeddings", &orig, true));
      c.rope_scaling.original_max_position_embeddings = orig;
      if (c.rope_scaling.high_freq_factor <= c.rope_scaling.low_freq_factor) {
        return InvalidArgument("{}: rope_scaling: high_freq_factor must exceed low_freq_factor",
                               source);
      }
    } else if ((type == "longrope" || type == "su") && c.architecture == Architecture::kPhi3) {
      FS_RETURN_IF_ERROR(ParseLongRope(j, *rs, source, &c));
    } else if (type != "default" && !type.empty()) {
      return InvalidArgument(
          "{}: field 'rope_scaling': unsupported rope_type '{}' (supported: llama3{})", source,
          type, c.architecture == Architecture::kPhi3 ? ", longrope" : "");
    }
  }
  return c;
}

Result<ModelConfig> ModelConfig::Load(const std::string& model_dir) {
  std::string path = model_dir + "/config.json";
  FS_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  return Parse(text, path);
}

std::string ModelConfig::ToJson() const {
  json j;
  j["architectures"] = {ArchitectureName(architecture)};
  j["model_type"] = NamesOf(architecture).model_type;
  j["hidden_size"] = hidden_size;
  j["num_hidden_layers"] = num_layers;
  j["num_attention_heads"] = num_heads;
  j["num_key_value_heads"] = num_kv_heads;
  j["head_dim"] = head_dim;
  j["intermediate_size"] = intermediate_size;
  j["vocab_size"] = vocab_size;
  j["max_position_embeddings"] = max_position_embeddings;
  j["rms_norm_eps"] = rms_norm_eps;
  j["rope_theta"] = rope_theta;
  j["tie_word_embeddings"] = tie_word_embeddings;
  if (gemma()) {
    j["hidden_activation"] = "gelu_pytorch_tanh";
  } else {
    j["hidden_act"] = "silu";
  }
  j["torch_dtype"] = "float32";
  if (bos_token_id >= 0) j["bos_token_id"] = bos_token_id;
  if (eos_token_id >= 0) j["eos_token_id"] = eos_token_id;
  if (rope_scaling.enabled) {
    j["rope_scaling"] = {
        {"rope_type", "llama3"},
        {"factor", rope_scaling.factor},
        {"low_freq_factor", rope_scaling.low_freq_factor},
        {"high_freq_factor", rope_scaling.high_freq_factor},
        {"original_max_position_embeddings", rope_scaling.original_max_position_embeddings}};
  }
  if (longrope.enabled()) {
    j["rope_scaling"] = {{"rope_type", "longrope"},
                         {"short_factor", longrope.short_factor},
                         {"long_factor", longrope.long_factor},
                         {"attention_factor", longrope.attention_factor}};
    j["original_max_position_embeddings"] = longrope.original_max_position_embeddings;
  }
  if (architecture == Architecture::kQwen3Moe || architecture == Architecture::kQwen2Moe) {
    j["num_experts"] = num_experts;
    j["num_experts_per_tok"] = experts_per_token;
    j["moe_intermediate_size"] = intermediate_size;
    j["norm_topk_prob"] = renormalize_topk;
    if (shared_expert_size > 0) j["shared_expert_intermediate_size"] = shared_expert_size;
    j["decoder_sparse_step"] = 1;
    j["mlp_only_layers"] = json::array();
  } else if (is_moe()) {
    j["num_local_experts"] = num_experts;
    j["num_experts_per_tok"] = experts_per_token;
  }
  if (gemma()) {
    j["query_pre_attn_scalar"] = query_pre_attn_scalar;
    if (rope_local_theta > 0) j["rope_local_base_freq"] = rope_local_theta;
    j["attn_logit_softcapping"] = attn_softcap > 0 ? json(attn_softcap) : json(nullptr);
    j["final_logit_softcapping"] = final_softcap > 0 ? json(final_softcap) : json(nullptr);
    j["sliding_window"] = sliding_window > 0 ? json(sliding_window) : json(nullptr);
    json types = json::array();
    for (int l = 0; l < num_layers; ++l)
      types.push_back(!sliding_layers.empty() && sliding_layers[l] ? "sliding_attention"
                                                                   : "full_attention");
    j["layer_types"] = types;
    if (rope_linear_factor != 1.0)
      j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", rope_linear_factor}};
  } else if (IsQwen(architecture)) {
    j["use_sliding_window"] = false;
    j["sliding_window"] = nullptr;
    if (qk_norm()) j["attention_bias"] = false;
  } else if (architecture != Architecture::kLlama) {
    j["sliding_window"] = sliding_window > 0 ? json(sliding_window) : json(nullptr);
  }
  return j.dump(2) + "\n";
}

}  // namespace failsafe
