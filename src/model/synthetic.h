// Synthetic models: seeded random weights in real Hugging Face layout
// (config.json, model.safetensors, tokenizer.json), scaled so that logits have
// a clear spread and attention really mixes context.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "model/config.h"
#include "model/safetensors.h"

namespace failsafe {

// Known presets: tiny-llama, tiny-mixtral, tiny-qwen2, tiny-qwen3,
// tiny-qwen3-moe, tiny-phi3, tiny-gemma2, tiny-gemma3, small-llama, 1b-llama,
// and for fast tests of any head layout micro-llama, micro-mixtral,
// micro-qwen2, micro-qwen3, micro-qwen3-moe, micro-phi3, micro-gemma2 and
// micro-gemma3; stories-260k has the shape of Karpathy's stories260K (random
// weights).
std::vector<std::string> SyntheticPresetNames();
Result<ModelConfig> SyntheticPresetConfig(const std::string& preset);

struct SyntheticModelOptions {
  std::string preset = "tiny-llama";
  uint64_t seed = 0;
  DType dtype = DType::kF32;
  // Split model.safetensors into this many files with an index (1: one file).
  int num_shards = 1;
  // Attention layout instead of the preset's (0: keep it): query heads and KV
  // heads (head groups); the head dimension stays the preset's.
  int num_heads = 0;
  int num_kv_heads = 0;
  // The preset's shape with this vocabulary size instead (0: the preset's),
  // e.g. to pair random weights with a real tokenizer.
  int vocab_size = 0;
  // Gemma 3 presets: the checkpoint as Gemma3ForConditionalGeneration is
  // published instead (config.json with text_config, vision_config and the
  // token ids at the top level; a small SigLIP vision tower and projector
  // beside the language model), the language model's tensors under this
  // prefix: "language_model.model." (as published) or
  // "model.language_model." (as newer transformers save it). The language
  // model's weights are those of the text layout with the same seed. Empty:
  // the text layout.
  std::string vision_language_prefix;
};

// The preset's config with the options' overrides; fails on a layout that is
// not grouped-query attention (query heads a multiple of the KV heads) or a
// vocabulary size out of range.
Result<ModelConfig> SyntheticConfig(const SyntheticModelOptions& options);

// Writes the model into `dir` (created if missing): config.json,
// model.safetensors, tokenizer.json and generation_config.json.
Status WriteSyntheticModel(const std::string& dir, const SyntheticModelOptions& options);

// Builds a byte-level BPE tokenizer.json with exactly `vocab_size` tokens,
// trained on a built-in text and padded with seeded merges. Also reports the
// ids of its special tokens.
struct SyntheticTokenizer {
  std::string json;
  int bos_id = -1;
  int eos_id = -1;  // <|eot_id|>
  int end_of_text_id = -1;
};
SyntheticTokenizer BuildSyntheticTokenizer(int vocab_size, uint64_t seed);

}  // namespace failsafe
