// Model configuration parsed from a Hugging Face config.json.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace failsafe {

enum class Architecture {
  kLlama,
  kMistral,
  kMixtral,
  kQwen2,
  kQwen3,
  kQwen3Moe,
  kQwen2Moe,
  kPhi3,
  kGemma2,
  kGemma3
};
const char* ArchitectureName(Architecture arch);

// Llama-3 style frequency-dependent RoPE scaling ("rope_type": "llama3").
struct RopeScaling {
  bool enabled = false;
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

// Phi-3's LongRoPE ("rope_type": "longrope"): frequency i divided by factor
// i, cos and sin times attention_factor. The long factors are used when the
// model's context (max_position_embeddings) exceeds the one it was trained
// at, the short ones otherwise: one choice for every sequence and position,
// so that keys cached at any length stay valid.
struct LongRope {
  std::vector<double> short_factor, long_factor;  // head_dim / 2 each; empty: off
  int64_t original_max_position_embeddings = 0;
  double attention_factor = 1.0;
  bool use_long = false;
  bool enabled() const { return !short_factor.empty(); }
  const std::vector<double>& factors() const { return use_long ? long_factor : short_factor; }
  // Chooses the factors for a model served at `max_positions` and sets the
  // attention factor: `attention` if positive, else Hugging Face's default,
  // sqrt(1 + ln(s) / ln(original)) for s = max_positions / original > 1.
  void SetContext(int64_t max_positions, double attention = 0);
};

// Validated once at load; never mutated afterwards.
struct ModelConfig {
  Architecture architecture = Architecture::kLlama;
  int hidden_size = 0;
  int num_layers = 0;
  int num_heads = 0;     // query heads
  int num_kv_heads = 0;  // KV heads = head groups (GQA)
  int head_dim = 0;
  int intermediate_size = 0;  // dense FFN, or each expert's FFN
  int vocab_size = 0;
  int max_position_embeddings = 0;
  double rms_norm_eps = 1e-5;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  LongRope longrope;
  bool tie_word_embeddings = false;
  int num_experts = 0;  // 0: dense FFN
  int experts_per_token = 0;
  // Routed experts' top-k weights divided by their sum (Mixtral, Qwen3-MoE)
  // or the softmax's own (Qwen2-MoE's norm_topk_prob false).
  bool renormalize_topk = true;
  // Qwen2-MoE: a shared expert every token takes, this wide (a multiple of
  // intermediate_size), scaled by sigmoid(shared_expert_gate . x); 0: none.
  int shared_expert_size = 0;
  int sliding_window = 0;  // 0: full attention
  // Gemma (gemma()): the query scale, which layers slide, their RoPE base
  // (Gemma 3), the global layers' linear RoPE scaling.
  double query_pre_attn_scalar = 0;  // 0: head_dim
  std::vector<bool> sliding_layers;  // empty: every layer takes sliding_window
  double rope_local_theta = 0;       // sliding layers' RoPE base; 0: rope_theta
  double rope_linear_factor = 1.0;   // global layers' positions divided by it
  // Gemma 2: scores and final logits x become cap * tanh(x / cap) (0: off).
  double attn_softcap = 0, final_softcap = 0;

  // The window of layer l (0: full attention) and whether it is a sliding
  // layer with its own RoPE base.
  int LayerWindow(int l) const {
    return sliding_layers.empty() || sliding_layers[l] ? sliding_window : 0;
  }
  bool LocalRope(int l) const {
    return rope_local_theta > 0 && !sliding_layers.empty() && sliding_layers[l];
  }
  float AttentionScale() const;
  int bos_token_id = -1;
  int eos_token_id = -1;
  // The language model of a vision-language checkpoint
  // (Gemma3ForConditionalGeneration): config.json's text_config, tensors
  // under `language_model.model.` (or `model.language_model.`), served as
  // text. The vision tower and projector are never loaded; the API refuses
  // image inputs.
  bool vision_language = false;

  bool is_moe() const { return num_experts > 0; }
  // The shared expert cut into experts of intermediate_size, after the
  // routed ones: expert slots num_experts .. num_experts + this - 1.
  int shared_expert_slots() const {
    return shared_expert_size > 0 ? shared_expert_size / intermediate_size : 0;
  }
  int expert_slots() const { return is_moe() ? num_experts + shared_expert_slots() : 1; }
  // The share of tokens an expert slot (or the dense FFN) computes, on
  // average: k / experts for a routed one, every token for the rest.
  double ExpertShare(int slot) const {
    return is_moe() && slot < num_experts ? static_cast<double>(experts_per_token) / num_experts
                                          : 1.0;
  }
  // What the architecture computes beyond Llama's:
  // biases on the q, k and v projections (Qwen2, Qwen2-MoE);
  bool qkv_bias() const {
    return architecture == Architecture::kQwen2 || architecture == Architecture::kQwen2Moe;
  }
  // an RMS norm of each query and key head before RoPE (Qwen3, Gemma 3);
  bool qk_norm() const {
    return architecture == Architecture::kQwen3 || architecture == Architecture::kQwen3Moe ||
           architecture == Architecture::kGemma3;
  }
  // q, k, v in one qkv_proj and gate, up in one gate_up_proj (Phi-3);
  bool fused_projections() const { return architecture == Architecture::kPhi3; }
  // Gemma 2 and 3: every RMS norm scales by (1 + w), attention and FFN
  // outputs are normalised too before the residual takes them (sandwich
  // norms), GeGLU (gelu_pytorch_tanh) instead of SwiGLU, embeddings times
  // sqrt(hidden), scores times query_pre_attn_scalar^-1/2, and sliding
  // layers between global ones (the fields below).
  bool gemma() const {
    return architecture == Architecture::kGemma2 || architecture == Architecture::kGemma3;
  }
  int group_size() const { return num_heads / num_kv_heads; }  // query heads per KV head
  int q_dim() const { return num_heads * head_dim; }
  int kv_dim() const { return num_kv_heads * head_dim; }

  // Parameter and byte counts of the whole model in fp32.
  int64_t NumParameters() const;
  // Bytes of K and V for one token over all layers in fp32.
  int64_t KvBytesPerToken() const { return 2LL * num_layers * kv_dim() * 4; }

  // Parses config.json text; `source` names the file in error messages.
  static Result<ModelConfig> Parse(const std::string& json_text, const std::string& source);
  static Result<ModelConfig> Load(const std::string& model_dir);
  // Serialises back to Hugging Face config.json form.
  std::string ToJson() const;
};

// transformers' Gemma3TextConfig defaults (JSON), which a Gemma 3 config's
// missing fields take (published Gemma3ForConditionalGeneration configs name
// only what differs from them).
std::string Gemma3TextDefaultsJson();

}  // namespace failsafe
