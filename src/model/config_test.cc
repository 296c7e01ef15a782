#include <gtest/gtest.h>

#include <cmath>

#include "model/config.h"
#include "model/synthetic.h"

namespace failsafe {
namespace {

const char kLlama31[] = R"({
  "architectures": ["LlamaForCausalLM"], "hidden_size": 8192, "intermediate_size": 28672,
  "num_attention_heads": 64, "num_hidden_layers": 80, "num_key_value_heads": 8,
  "max_position_embeddings": 131072, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
  "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "tie_word_embeddings": false, "vocab_size": 128256, "bos_token_id": 128000,
  "eos_token_id": [128001, 128008, 128009]})";

TEST(Config, ParsesLlama31) {
  auto c = ModelConfig::Parse(kLlama31, "config.json");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->architecture, Architecture::kLlama);
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->group_size(), 8);
  EXPECT_TRUE(c->rope_scaling.enabled);
  EXPECT_EQ(c->rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_EQ(c->eos_token_id, 128001);
  EXPECT_NEAR(c->NumParameters() / 1e9, 70.55, 0.05);
}

TEST(Config, ParsesMixtral) {
  const char* text = R"({"architectures": ["MixtralForCausalLM"], "hidden_size": 6144,
    "intermediate_size": 16384, "num_attention_heads": 48, "num_hidden_layers": 56,
    "num_key_value_heads": 8, "num_local_experts": 8, "num_experts_per_tok": 2,
    "vocab_size": 32768, "rope_theta": 1000000.0, "sliding_window": null, "rms_norm_eps": 1e-05})";
  auto c = ModelConfig::Parse(text, "config.json");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(c->is_moe());
  EXPECT_EQ(c->experts_per_token, 2);
  EXPECT_EQ(c->sliding_window, 0);
  EXPECT_NEAR(c->NumParameters() / 1e9, 140.6, 0.2);
}

// Published config.json files: Qwen2.5-7B-Instruct and Qwen3-8B.
TEST(Config, ParsesQwen) {
  const char* qwen25 = R"({"architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "hidden_act": "silu", "hidden_size": 3584,
    "initializer_range": 0.02, "intermediate_size": 18944, "max_position_embeddings": 32768,
    "max_window_layers": 28, "model_type": "qwen2", "num_attention_heads": 28,
    "num_hidden_layers": 28, "num_key_value_heads": 4, "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0, "sliding_window": 131072, "tie_word_embeddings": false,
    "torch_dtype": "bfloat16", "transformers_version": "4.43.1", "use_cache": true,
    "use_sliding_window": false, "vocab_size": 152064})";
  auto c = ModelConfig::Parse(qwen25, "config.json");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->architecture, Architecture::kQwen2);
  EXPECT_TRUE(c->qkv_bias());
  EXPECT_FALSE(c->qk_norm());
  EXPECT_EQ(c->sliding_window, 0);  // named, but use_sliding_window is false
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_NEAR(c->NumParameters() / 1e9, 7.62, 0.01);
  const char* qwen3 = R"({"architectures": ["Qwen3ForCausalLM"], "attention_bias": false,
    "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128,
    "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
    "intermediate_size": 12288, "max_position_embeddings": 40960, "max_window_layers": 36,
    "model_type": "qwen3", "num_attention_heads": 32, "num_hidden_layers": 36,
    "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000,
    "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0", "use_cache": true, "use_sliding_window": false,
    "vocab_size": 151936})";
  c = ModelConfig::Parse(qwen3, "config.json");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->architecture, Architecture::kQwen3);
  EXPECT_TRUE(c->qk_norm());
  EXPECT_FALSE(c->qkv_bias());
  EXPECT_EQ(c->q_dim(), 4096);
  EXPECT_NEAR(c->NumParameters() / 1e9, 8.19, 0.01);
  // A window turned on is refused by name.
  std::string windowed = qwen3;
  windowed.replace(windowed.find("\"use_sliding_window\": false"), 27,
                   "\"use_sliding_window\": true");
  c = ModelConfig::Parse(windowed, "config.json");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("use_sliding_window"), std::string::npos);
  // Qwen3-30B-A3B's.
  const char* moe = R"({"architectures": ["Qwen3MoeForCausalLM"], "attention_bias": false,
    "attention_dropout": 0.0, "bos_token_id": 151643, "decoder_sparse_step": 1,
    "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 2048,
    "initializer_range": 0.02, "intermediate_size": 6144, "max_position_embeddings": 40960,
    "max_window_layers": 48, "mlp_only_layers": [], "model_type": "qwen3_moe",
    "moe_intermediate_size": 768, "norm_topk_prob": true, "num_attention_heads": 32,
    "num_experts": 128, "num_experts_per_tok": 8, "num_hidden_layers": 48,
    "num_key_value_heads": 4, "output_router_logits": false, "rms_norm_eps": 1e-06,
    "rope_scaling": null, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001,
    "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0", "use_cache": true, "use_sliding_window": false,
    "vocab_size": 151936})";
  c = ModelConfig::Parse(moe, "config.json");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->architecture, Architecture::kQwen3Moe);
  EXPECT_TRUE(c->qk_norm());
  EXPECT_EQ(c->num_experts, 128);
  EXPECT_EQ(c->experts_per_token, 8);
  EXPECT_EQ(c->intermediate_size, 768);  // each expert's
  EXPECT_NEAR(c->NumParameters() / 1e9, 30.53, 0.02);
  // Both write themselves back as they were read.
  for (const char* preset : {"tiny-qwen2", "tiny-qwen3", "tiny-qwen3-moe", "tiny-qwen2-moe",
                             "tiny-phi3", "tiny-gemma2", "tiny-gemma3"}) {
    auto p = SyntheticPresetConfig(preset);
    ASSERT_TRUE(p.ok());
    auto back = ModelConfig::Parse(p->ToJson(), preset);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(back->ToJson(), p->ToJson());
    EXPECT_EQ(back->architecture, p->architecture);
  }
}

// Qwen1.5-MoE-A2.7B's config.json: 60 routed experts, top 4 with the
// softmax's weights, a shared expert of four experts' width.
TEST(Config, ParsesQwen2Moe) {
  const std::string moe = R"({"architectures": ["Qwen2MoeForCausalLM"],
    "attention_dropout": 0.0, "bos_token_id": 151643, "decoder_sparse_step": 1,
    "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 2048,
    "initializer_range": 0.02, "intermediate_size": 5632, "max_position_embeddings": 8192,
    "max_window_layers": 21, "model_type": "qwen2_moe", "moe_intermediate_size": 1408,
    "norm_topk_prob": false, "num_attention_heads": 16, "num_experts": 60,
    "num_experts_per_tok": 4, "num_hidden_layers": 24, "num_key_value_heads": 16,
    "output_router_logits": false, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.001, "shared_expert_intermediate_size": 5632,
    "sliding_window": 32768, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "transformers_version": "4.40.0.dev0", "use_cache": true, "use_sliding_window": false,
    "vocab_size": 151936})";
  auto c = ModelConfig::Parse(moe, "config.json");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->architecture, Architecture::kQwen2Moe);
  EXPECT_TRUE(c->qkv_bias());
  EXPECT_FALSE(c->qk_norm());
  EXPECT_FALSE(c->renormalize_topk);
  EXPECT_EQ(c->intermediate_size, 1408);
  EXPECT_EQ(c->shared_expert_size, 5632);
  EXPECT_EQ(c->shared_expert_slots(), 4);
  EXPECT_EQ(c->expert_slots(), 64);
  EXPECT_DOUBLE_EQ(c->ExpertShare(59), 4.0 / 60);
  EXPECT_DOUBLE_EQ(c->ExpertShare(60), 1.0);
  // "14.3B parameters in total": 14,315,784,192 by the tensors' shapes.
  EXPECT_EQ(c->NumParameters(), 14315784192LL);
  // What it does not compute is refused, naming the field.
  auto refused = [&](const std::string& from, const std::string& to) {
    std::string text = moe;
    const size_t at = text.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    text.replace(at, from.size(), to);
    auto r = ModelConfig::Parse(text, "config.json");
    EXPECT_FALSE(r.ok()) << to;
    return r.ok() ? std::string() : r.status().ToString();
  };
  EXPECT_NE(refused(R"("shared_expert_intermediate_size": 5632)",
                    R"("shared_expert_intermediate_size": 5000)")
                .find("shared_expert_intermediate_size"),
            std::string::npos);
  EXPECT_NE(refused(R"("decoder_sparse_step": 1)", R"("decoder_sparse_step": 2)")
                .find("decoder_sparse_step"),
            std::string::npos);
  EXPECT_NE(refused(R"("use_sliding_window": false)", R"("use_sliding_window": true)")
                .find("use_sliding_window"),
            std::string::npos);
  EXPECT_NE(refused(R"("norm_topk_prob": false)", R"("norm_topk_prob": false, "qkv_bias": false)")
                .find("qkv_bias"),
            std::string::npos);
  // Renormalised top-k (norm_topk_prob true) is computed too.
  std::string renorm = moe;
  renorm.replace(renorm.find(R"("norm_topk_prob": false)"), 23, R"("norm_topk_prob": true)");
  auto r = ModelConfig::Parse(renorm, "config.json");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->renormalize_topk);
}

// Phi-3-mini-4k-instruct's config.json; the 128k variants' longrope is refused.
TEST(Config, ParsesPhi3) {
  const char* phi3 = R"({"architectures": ["Phi3ForCausalLM"], "attention_bias": false,
    "attention_dropout": 0.0, "bos_token_id": 1, "embd_pdrop": 0.0, "eos_token_id": 32000,
    "hidden_act": "silu", "hidden_size": 3072, "initializer_range": 0.02,
    "intermediate_size": 8192, "max_position_embeddings": 4096, "model_type": "phi3",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
    "original_max_position_embeddings": 4096, "pad_token_id": 32000, "resid_pdrop": 0.0,
    "rms_norm_eps": 1e-05, "rope_scaling": null, "rope_theta": 10000.0, "sliding_window": 2047,
    "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.40.2",
    "use_cache": true, "vocab_size": 32064})";
  auto c = ModelConfig::Parse(phi3, "config.json");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->architecture, Architecture::kPhi3);
  EXPECT_TRUE(c->fused_projections());
  EXPECT_EQ(c->sliding_window, 2047);
  EXPECT_NEAR(c->NumParameters() / 1e9, 3.82, 0.01);
  EXPECT_FALSE(c->longrope.enabled());
  // Phi-3-mini-128k: LongRoPE, 48 short and 48 long factors, trained at 4k
  // and served at 128k: the long factors, cos and sin times
  // sqrt(1 + ln 32 / ln 4096).
  auto with_longrope = [&](int short_n, int long_n, int max_positions) {
    std::string factors[2];
    for (int k = 0; k < 2; ++k) {
      for (int i = 0; i < (k ? long_n : short_n); ++i)
        factors[k] += (i ? ", " : "") + std::to_string(1.0 + (k ? 2.0 : 0.1) * i);
    }
    std::string text = phi3;
    text.replace(text.find("\"rope_scaling\": null"), 20,
                 R"("rope_scaling": {"type": "longrope", "short_factor": [)" + factors[0] +
                     R"(], "long_factor": [)" + factors[1] + "]}");
    text.replace(text.find("\"max_position_embeddings\": 4096"), 31,
                 "\"max_position_embeddings\": " + std::to_string(max_positions));
    return ModelConfig::Parse(text, "config.json");
  };
  c = with_longrope(48, 48, 131072);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(c->longrope.enabled());
  EXPECT_TRUE(c->longrope.use_long);
  EXPECT_EQ(c->longrope.original_max_position_embeddings, 4096);
  EXPECT_NEAR(c->longrope.attention_factor, std::sqrt(1 + std::log(32.0) / std::log(4096.0)),
              1e-12);
  EXPECT_EQ(c->longrope.factors()[5], 11.0);
  auto back = ModelConfig::Parse(c->ToJson(), "back");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->ToJson(), c->ToJson());
  // Served at the trained context: the short factors and no scale.
  c = with_longrope(48, 48, 4096);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_FALSE(c->longrope.use_long);
  EXPECT_EQ(c->longrope.attention_factor, 1.0);
  EXPECT_EQ(c->longrope.factors()[5], 1.5);
  // A factor list of another length than head_dim / 2 is refused.
  c = with_longrope(48, 47, 131072);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("long_factor"), std::string::npos);
}

// Gemma-3-1b-it's config.json (sliding_window_pattern, no layer_types).
TEST(Config, ParsesGemma3) {
  const char* gemma = R"({"architectures": ["Gemma3ForCausalLM"], "attention_bias": false,
    "attention_dropout": 0.0, "attn_logit_softcapping": null, "bos_token_id": 2,
    "cache_implementation": "hybrid", "eos_token_id": [1, 106], "final_logit_softcapping": null,
    "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 1152,
    "initializer_range": 0.02, "intermediate_size": 6912, "max_position_embeddings": 32768,
    "model_type": "gemma3_text", "num_attention_heads": 4, "num_hidden_layers": 26,
    "num_key_value_heads": 1, "pad_token_id": 0, "query_pre_attn_scalar": 256,
    "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000, "rope_scaling": null,
    "rope_theta": 1000000, "sliding_window": 512, "sliding_window_pattern": 6,
    "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0", "use_cache": true,
    "vocab_size": 262144})";
  auto c = ModelConfig::Parse(gemma, "config.json");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->architecture, Architecture::kGemma3);
  EXPECT_TRUE(c->gemma() && c->qk_norm() && c->tie_word_embeddings);
  EXPECT_EQ(c->LayerWindow(0), 512);
  EXPECT_EQ(c->LayerWindow(5), 0);  // every sixth layer is global
  EXPECT_TRUE(c->LocalRope(4));
  EXPECT_FALSE(c->LocalRope(11));
  EXPECT_FLOAT_EQ(c->AttentionScale(), 1.0f / 16);
  EXPECT_EQ(c->NumParameters(), 999885952);  // Gemma-3-1B's published count
  auto back = ModelConfig::Parse(c->ToJson(), "round trip");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->ToJson(), c->ToJson());
  // Soft-capping (Gemma 2's) is computed when a config sets it.
  std::string capped = gemma;
  capped.replace(capped.find("\"attn_logit_softcapping\": null"), 30,
                 "\"attn_logit_softcapping\": 50.0");
  c = ModelConfig::Parse(capped, "config.json");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->attn_softcap, 50.0);
}

// Gemma-3-4b-it's config.json as published: Gemma3ForConditionalGeneration,
// whose text_config names only what differs from transformers'
// Gemma3TextConfig defaults. Served as text: its language model.
TEST(Config, ParsesGemma3VisionLanguageAsText) {
  const std::string gemma = R"({"architectures": ["Gemma3ForConditionalGeneration"],
    "boi_token_index": 255999, "eoi_token_index": 256000, "eos_token_id": [1, 106],
    "image_token_index": 262144, "initializer_range": 0.02, "mm_tokens_per_image": 256,
    "model_type": "gemma3",
    "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
      "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
      "sliding_window": 1024},
    "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0",
    "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
      "model_type": "siglip_vision_model", "num_attention_heads": 16, "num_hidden_layers": 27,
      "patch_size": 14, "vision_use_head": false}})";
  auto c = ModelConfig::Parse(gemma, "config.json");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(c->vision_language);
  EXPECT_EQ(c->architecture, Architecture::kGemma3);
  EXPECT_TRUE(c->gemma() && c->qk_norm() && c->tie_word_embeddings);
  EXPECT_EQ(c->vocab_size, 262208);
  EXPECT_EQ(c->hidden_size, 2560);
  EXPECT_EQ(c->num_layers, 34);
  EXPECT_EQ(c->num_heads, 8);
  EXPECT_EQ(c->num_kv_heads, 4);
  EXPECT_EQ(c->head_dim, 256);
  EXPECT_EQ(c->intermediate_size, 10240);
  EXPECT_EQ(c->max_position_embeddings, 131072);
  EXPECT_DOUBLE_EQ(c->rms_norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(c->rope_theta, 1e6);
  EXPECT_DOUBLE_EQ(c->rope_local_theta, 1e4);
  EXPECT_DOUBLE_EQ(c->rope_linear_factor, 8.0);
  EXPECT_FLOAT_EQ(c->AttentionScale(), 1.0f / 16);
  EXPECT_EQ(c->attn_softcap, 0.0);
  EXPECT_EQ(c->final_softcap, 0.0);
  EXPECT_EQ(c->eos_token_id, 1);  // the top level's, first of the list
  int sliding = 0;
  for (int l = 0; l < c->num_layers; ++l) sliding += c->LayerWindow(l) == 1024;
  EXPECT_EQ(sliding, 29);  // every sixth layer is global
  EXPECT_EQ(c->LayerWindow(5), 0);

  // Gemma-3-27b-it's text_config: its own head width and query scale.
  std::string big = gemma;
  big.replace(big.find(R"("hidden_size": 2560)"), 19,
              R"("head_dim": 128, "hidden_size": 5376, "num_attention_heads": 32, )"
              R"("num_key_value_heads": 16, "query_pre_attn_scalar": 168)");
  c = ModelConfig::Parse(big, "config.json");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->num_kv_heads, 16);
  EXPECT_FLOAT_EQ(c->AttentionScale(), 1.0f / std::sqrt(168.0f));

  // What the text model does not compute is refused naming the field and
  // where it is; another language model is refused by its type.
  std::string biased = gemma;
  biased.replace(biased.find(R"("sliding_window": 1024)"), 22,
                 R"("sliding_window": 1024, "attention_bias": true)");
  c = ModelConfig::Parse(biased, "config.json");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("config.json (text_config): field 'attention_bias'"),
            std::string::npos)
      << c.status().message();
  std::string other = gemma;
  other.replace(other.find(R"("model_type": "gemma3_text")"), 27,
                R"("model_type": "gemma3n_text")");
  c = ModelConfig::Parse(other, "config.json");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("text_config.model_type"), std::string::npos);
}

// Gemma-2-2b-it's config.json: soft-capping, every other layer sliding.
TEST(Config, ParsesGemma2) {
  const char* gemma = R"({"architectures": ["Gemma2ForCausalLM"], "attention_bias": false,
    "attention_dropout": 0.0, "attn_logit_softcapping": 50.0, "bos_token_id": 2,
    "cache_implementation": "hybrid", "eos_token_id": [1, 107], "final_logit_softcapping": 30.0,
    "head_dim": 256, "hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 2304, "initializer_range": 0.02, "intermediate_size": 9216,
    "max_position_embeddings": 8192, "model_type": "gemma2", "num_attention_heads": 8,
    "num_hidden_layers": 26, "num_key_value_heads": 4, "pad_token_id": 0,
    "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_theta": 10000.0,
    "sliding_window": 4096, "torch_dtype": "float32", "transformers_version": "4.42.4",
    "use_cache": true, "vocab_size": 256000})";
  auto c = ModelConfig::Parse(gemma, "config.json");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->architecture, Architecture::kGemma2);
  EXPECT_TRUE(c->gemma() && c->tie_word_embeddings);
  EXPECT_FALSE(c->qk_norm());
  EXPECT_EQ(c->attn_softcap, 50.0);
  EXPECT_EQ(c->final_softcap, 30.0);
  EXPECT_EQ(c->LayerWindow(0), 4096);  // the first of every two slides
  EXPECT_EQ(c->LayerWindow(1), 0);
  EXPECT_FALSE(c->LocalRope(0));              // one RoPE base
  EXPECT_EQ(c->NumParameters(), 2614341888);  // Gemma-2-2B's published count
  auto back = ModelConfig::Parse(c->ToJson(), "round trip");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->ToJson(), c->ToJson());
}

TEST(Config, RoundTripsThroughJson) {
  for (auto& name : SyntheticPresetNames()) {
    auto c = SyntheticPresetConfig(name);
    ASSERT_TRUE(c.ok());
    auto back = ModelConfig::Parse(c->ToJson(), "x");
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(back->ToJson(), c->ToJson());
  }
}

TEST(Config, RejectsBadInputWithFieldNames) {
  auto err = [](const char* text) {
    return ModelConfig::Parse(text, "m/config.json").status().message();
  };
  EXPECT_EQ(err("{not json"), "m/config.json: not valid JSON");
  EXPECT_NE(err(R"({"architectures": ["GPT2LMHeadModel"]})")
                .find("unsupported architecture 'GPT2LMHeadModel'"),
            std::string::npos);
  EXPECT_NE(err(R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 64})")
                .find("'num_hidden_layers' is missing"),
            std::string::npos);
  EXPECT_NE(
      err(R"({"architectures": ["LlamaForCausalLM"], "hidden_size": "big", "num_hidden_layers": 2})")
          .find("'hidden_size' must be an integer"),
      std::string::npos);
  EXPECT_NE(
      err(R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
      "num_attention_heads": 6, "num_key_value_heads": 4, "intermediate_size": 8, "vocab_size": 9})")
          .find("does not divide"),
      std::string::npos);
}

// Fields that would change the numbers if honoured are refused, not ignored.
TEST(Config, RefusesFeaturesItDoesNotCompute) {
  const std::string base = R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 64,
      "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 8, "vocab_size": 9)";
  auto err = [&](const std::string& extra) {
    auto c = ModelConfig::Parse(base + ", " + extra + "}", "m/config.json");
    return c.ok() ? std::string("accepted") : c.status().message();
  };
  EXPECT_EQ(err(R"("attention_bias": true)"),
            "m/config.json: field 'attention_bias' = true: biases are not supported");
  EXPECT_NE(err(R"("mlp_bias": true)").find("'mlp_bias'"), std::string::npos);
  EXPECT_EQ(err(R"("hidden_act": "gelu")"),
            "m/config.json: field 'hidden_act' = \"gelu\": only silu is supported");
  EXPECT_NE(err(R"("partial_rotary_factor": 0.5)").find("'partial_rotary_factor'"),
            std::string::npos);
  EXPECT_EQ(err(R"("rope_scaling": {"factor": 2.0})"),
            "m/config.json: field 'rope_scaling' has no 'rope_type' (supported: llama3)");
  // Their neutral values load.
  EXPECT_EQ(err(R"("attention_bias": false, "mlp_bias": false, "hidden_act": "silu",
      "partial_rotary_factor": 1.0, "rope_scaling": null)"),
            "accepted");
  EXPECT_EQ(err(R"("hidden_act": "swish", "rope_scaling": {"rope_type": "default"})"), "accepted");
}

}  // namespace
}  // namespace failsafe
