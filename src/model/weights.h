// The host copy of a model's weights: memory-mapped safetensors files (one, or
// sharded with model.safetensors.index.json), checked against the config.
//
// Thread-safety: immutable after Open; any thread may read.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "model/config.h"
#include "model/safetensors.h"

namespace failsafe {

// Hugging Face tensor names for Llama / Mistral / Mixtral / Qwen2 / Qwen3.
namespace tensor_names {
std::string Embedding();
std::string FinalNorm();
std::string LmHead(const ModelConfig& c);  // the embedding when tied
std::string AttnNorm(int layer);
std::string FfnNorm(const ModelConfig& c, int layer);  // the FFN's input norm
std::string AttnOutNorm(int layer);                    // Gemma: the attention output's norm
std::string FfnOutNorm(int layer);                     // Gemma: the FFN output's norm
std::string Q(int layer);
std::string K(int layer);
std::string V(int layer);
std::string O(int layer);
std::string QBias(int layer);  // Qwen2: [q_dim]
std::string KBias(int layer);  // [kv_dim]
std::string VBias(int layer);  // [kv_dim]
std::string QNorm(int layer);  // Qwen3: [head_dim]
std::string KNorm(int layer);  // [head_dim]
// Dense FFN (expert < 0) or an expert slot (Mixtral's or Qwen-MoE's names;
// slots past the routed experts name Qwen2-MoE's shared expert).
std::string Gate(const ModelConfig& c, int layer, int expert);  // [intermediate, hidden]
std::string Up(const ModelConfig& c, int layer, int expert);    // [intermediate, hidden]
std::string Down(const ModelConfig& c, int layer, int expert);  // [hidden, intermediate]
std::string Router(const ModelConfig& c, int layer);            // MoE: [experts, hidden]
std::string SharedExpertGate(int layer);                        // Qwen2-MoE: [1, hidden]
std::string Qkv(int layer);     // Phi-3: q, k, v rows in one [q_dim + 2 kv_dim, hidden]
std::string GateUp(int layer);  // Phi-3: gate rows, then up rows [2 intermediate, hidden]

// Where a projection's rows lie: its own tensor from row 0, or a run of a
// fused one (Phi-3's qkv_proj and gate_up_proj) or of the shared expert
// (Qwen2-MoE's, cut into slots); for a down projection ([hidden,
// intermediate]), its columns.
struct Rows {
  std::string tensor;
  int64_t first = 0;
};
Rows QRows(const ModelConfig& c, int layer);
Rows KRows(const ModelConfig& c, int layer);
Rows VRows(const ModelConfig& c, int layer);
Rows GateRows(const ModelConfig& c, int layer, int expert);
Rows UpRows(const ModelConfig& c, int layer, int expert);
Rows DownCols(const ModelConfig& c, int layer, int expert);
}  // namespace tensor_names

// The name the engine reads a stored tensor by: the stored name, or for a
// vision-language checkpoint (ModelConfig::vision_language) its language
// model's tensor under the text model's name (`language_model.model.X` and
// `model.language_model.X` are read as `model.X`); nullopt for the vision
// tower's and projector's tensors, which are never read.
std::optional<std::string> TextModelTensorName(const ModelConfig& config,
                                               const std::string& stored);

struct ExpectedTensor {
  std::string name;
  std::vector<int64_t> shape;
};
// Every tensor the model needs, in file order.
std::vector<ExpectedTensor> ExpectedTensors(const ModelConfig& c);

class WeightStore {
 public:
  // Opens and validates: every expected tensor present with the right shape,
  // and no tensor the model as configured would not read (see
  // RefuseUnreadTensors).
  static Result<std::unique_ptr<WeightStore>> Open(const std::string& model_dir,
                                                   const ModelConfig& config);

  // The tensor, which Open has validated. Aborts on an unknown name (a bug).
  TensorRef Get(const std::string& name) const;
  // Bytes of every tensor the model reads (a vision tower's left out).
  int64_t FileBytes() const;
  // The element type devices hold the model's matrices in: bf16 or f16 when
  // every 2-D tensor has that type (a checkpoint's own type, kept 16-bit in
  // device memory), else f32.
  DType MatrixDType() const { return matrix_dtype_; }
  const std::string& model_dir() const { return model_dir_; }
  // A vision-language checkpoint's vision tower and projector, left unread.
  int skipped_tensors() const { return skipped_tensors_; }
  int64_t skipped_bytes() const { return skipped_bytes_; }

 private:
  static Status RefuseUnreadTensors(const WeightStore& store,
                                    const std::vector<ExpectedTensor>& expected,
                                    const ModelConfig& config);

  std::string model_dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, TensorRef> tensors_;
  DType matrix_dtype_ = DType::kF32;
  int skipped_tensors_ = 0;
  int64_t skipped_bytes_ = 0;
};

}  // namespace failsafe
