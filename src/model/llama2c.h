// Converts a llama2.c checkpoint (run.c's format, version 0) and its
// SentencePiece tokenizer into a Hugging Face Llama directory: config.json,
// model.safetensors (f32), generation_config.json, tokenizer.json (derived
// from the .model, see sentencepiece_convert.h) and tokenizer_config.json.
//
// llama2.c's RoPE rotates adjacent pairs (2i, 2i+1) of a head; Hugging Face
// Llama rotates halves (i, i + head_dim/2). The q and k rows of every head are
// permuted so the converted model computes the same function:
// new row (a * head_dim/2 + i) = old row (2i + a), a in {0, 1}.
//
// The output is deterministic: converting the same files gives the same bytes.
#pragma once

#include <string>

#include "common/status.h"

namespace failsafe {

struct Llama2cConversion {
  std::string checkpoint;       // the .bin
  std::string tokenizer_model;  // its SentencePiece tokenizer.model
  std::string out_dir;          // created if missing
  // Generation also stops at these (llama2.c stops when the model emits BOS).
  bool stop_at_bos = true;
};

Status ConvertLlama2c(const Llama2cConversion& c);

}  // namespace failsafe
