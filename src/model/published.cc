#include "model/published.h"

namespace failsafe {

std::vector<std::string> PublishedModelNames() { return {"llama-3.1-70b", "mixtral-8x22b"}; }

Result<ModelConfig> PublishedModelConfig(const std::string& name) {
  ModelConfig c;
  if (name == "llama-3.1-70b") {
    // meta-llama/Llama-3.1-70B-Instruct config.json.
    c.architecture = Architecture::kLlama;
    c.hidden_size = 8192;
    c.num_layers = 80;
    c.num_heads = 64;
    c.num_kv_heads = 8;
    c.head_dim = 128;
    c.intermediate_size = 28672;
    c.vocab_size = 128256;
    c.max_position_embeddings = 131072;
    c.rms_norm_eps = 1e-5;
    c.rope_theta = 500000.0;
    c.rope_scaling = {true, 8.0, 1.0, 4.0, 8192};
    c.bos_token_id = 128000;
    c.eos_token_id = 128009;
    return c;
  }
  if (name == "mixtral-8x22b") {
    // mistralai/Mixtral-8x22B-Instruct-v0.1 config.json.
    c.architecture = Architecture::kMixtral;
    c.hidden_size = 6144;
    c.num_layers = 56;
    c.num_heads = 48;
    c.num_kv_heads = 8;
    c.head_dim = 128;
    c.intermediate_size = 16384;
    c.vocab_size = 32768;
    c.max_position_embeddings = 65536;
    c.rms_norm_eps = 1e-5;
    c.rope_theta = 1000000.0;
    c.num_experts = 8;
    c.experts_per_token = 2;
    c.bos_token_id = 1;
    c.eos_token_id = 2;
    return c;
  }
  return NotFound("no published model named '{}'", name);
}

}  // namespace failsafe
