#include "model/llama2c.h"

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "model/config.h"
#include "model/file_util.h"
#include "model/safetensors.h"
#include "model/sentencepiece_convert.h"
#include "model/sentencepiece_tokenizer.h"
#include "model/weights.h"

namespace failsafe {

namespace {

// The checkpoint: seven int32 then float32 arrays, all little-endian.
struct Header {
  int32_t dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len;
};

struct Source {
  const float* data = nullptr;  // after the header
  Header h{};
  bool shared_classifier = true;
  ModelConfig config;
  // Offsets (in floats) of each array.
  size_t embed, rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3, rms_final, wcls;
};

void Fill(void* ctx_ptr, size_t index, float* dst);

struct FillContext {
  const Source* src;
  std::vector<SafetensorsWriter::Entry> entries;
};

}  // namespace

Status ConvertLlama2c(const Llama2cConversion& c) {
  FS_ASSIGN_OR_RETURN(MappedFile file, MappedFile::Open(c.checkpoint));
  if (file.size() < sizeof(Header))
    return InvalidArgument("{}: too short for a llama2.c header", c.checkpoint);
  Source s;
  std::memcpy(&s.h, file.data(), sizeof(Header));
  const Header& h = s.h;
  if (h.dim <= 0 || h.hidden_dim <= 0 || h.n_layers <= 0 || h.n_heads <= 0 || h.n_kv_heads <= 0 ||
      h.seq_len <= 0 || h.vocab_size == 0 || h.dim % h.n_heads != 0 ||
      h.n_heads % h.n_kv_heads != 0 || (h.dim / h.n_heads) % 2 != 0 || h.dim > (1 << 16) ||
      h.n_layers > 1024 || std::abs(h.vocab_size) > (1 << 24) || h.seq_len > (1 << 24)) {
    return InvalidArgument(
        "{}: not a llama2.c checkpoint (dim {}, hidden {}, layers {}, heads {}, kv heads {}, vocab "
        "{}, seq_len {})",
        c.checkpoint, h.dim, h.hidden_dim, h.n_layers, h.n_heads, h.n_kv_heads, h.vocab_size,
        h.seq_len);
  }
  s.shared_classifier = h.vocab_size > 0;
  const size_t dim = h.dim, hid = h.hidden_dim, L = h.n_layers, vocab = std::abs(h.vocab_size);
  const size_t head = dim / h.n_heads, kv = head * h.n_kv_heads;
  size_t at = 0;
  auto take = [&](size_t n) {
    const size_t off = at;
    at += n;
    return off;
  };
  s.embed = take(vocab * dim);
  s.rms_att = take(L * dim);
  s.wq = take(L * dim * dim);
  s.wk = take(L * kv * dim);
  s.wv = take(L * kv * dim);
  s.wo = take(L * dim * dim);
  s.rms_ffn = take(L * dim);
  s.w1 = take(L * hid * dim);
  s.w2 = take(L * dim * hid);
  s.w3 = take(L * hid * dim);
  s.rms_final = take(dim);
  take(static_cast<size_t>(h.seq_len) * head);  // the two RoPE tables, unused
  s.wcls = s.shared_classifier ? s.embed : take(vocab * dim);
  const size_t want = sizeof(Header) + at * sizeof(float);
  if (file.size() != want) {
    return InvalidArgument("{}: {} bytes, but a checkpoint of this shape has {}", c.checkpoint,
                           file.size(), want);
  }
  s.data = reinterpret_cast<const float*>(file.data() + sizeof(Header));

  ModelConfig& cfg = s.config;
  cfg.architecture = Architecture::kLlama;
  cfg.hidden_size = h.dim;
  cfg.num_layers = h.n_layers;
  cfg.num_heads = h.n_heads;
  cfg.num_kv_heads = h.n_kv_heads;
  cfg.head_dim = static_cast<int>(head);
  cfg.intermediate_size = h.hidden_dim;
  cfg.vocab_size = static_cast<int>(vocab);
  cfg.max_position_embeddings = h.seq_len;
  cfg.rms_norm_eps = 1e-5;
  cfg.rope_theta = 10000.0;
  cfg.tie_word_embeddings = s.shared_classifier;

  FS_ASSIGN_OR_RETURN(auto sp, SentencePieceTokenizer::Load(c.tokenizer_model));
  if (sp->vocab_size() != static_cast<int>(vocab)) {
    return InvalidArgument("{} has {} pieces but the checkpoint's vocabulary has {}",
                           c.tokenizer_model, sp->vocab_size(), vocab);
  }
  FS_ASSIGN_OR_RETURN(std::string tokenizer_json, SentencePieceToTokenizerJson(*sp));
  cfg.bos_token_id = sp->bos_id();
  cfg.eos_token_id = sp->TokenId("</s>");

  std::error_code ec;
  std::filesystem::create_directories(c.out_dir, ec);
  if (ec) return Internal("{}: cannot create directory: {}", c.out_dir, ec.message());
  FillContext ctx{&s, {}};
  for (const auto& t : ExpectedTensors(cfg)) ctx.entries.push_back({t.name, t.shape, DType::kF32});
  FS_RETURN_IF_ERROR(
      SafetensorsWriter::Write(c.out_dir + "/model.safetensors", ctx.entries, Fill, &ctx));

  using nlohmann::ordered_json;
  ordered_json stop = ordered_json::array();
  if (cfg.eos_token_id >= 0) stop.push_back(cfg.eos_token_id);
  if (c.stop_at_bos && cfg.bos_token_id >= 0) stop.push_back(cfg.bos_token_id);
  ordered_json gen = {{"bos_token_id", cfg.bos_token_id}, {"eos_token_id", stop}};
  ordered_json tok_config = {{"add_bos_token", true},
                             {"add_eos_token", false},
                             {"bos_token", "<s>"},
                             {"eos_token", "</s>"},
                             {"unk_token", "<unk>"},
                             {"clean_up_tokenization_spaces", false},
                             {"model_max_length", h.seq_len},
                             {"tokenizer_class", "LlamaTokenizer"}};
  FS_RETURN_IF_ERROR(WriteStringToFile(c.out_dir + "/tokenizer.json", tokenizer_json));
  FS_RETURN_IF_ERROR(
      WriteStringToFile(c.out_dir + "/tokenizer_config.json", tok_config.dump(2) + "\n"));
  FS_RETURN_IF_ERROR(WriteStringToFile(c.out_dir + "/generation_config.json", gen.dump(2) + "\n"));
  // config.json last: its presence marks a complete model.
  return WriteStringToFile(c.out_dir + "/config.json", cfg.ToJson());
}

namespace {

// Copies tensor `index` of the Hugging Face layout out of the checkpoint.
void Fill(void* ctx_ptr, size_t index, float* dst) {
  const auto* ctx = static_cast<const FillContext*>(ctx_ptr);
  const Source& s = *ctx->src;
  const Header& h = s.h;
  const std::string& name = ctx->entries[index].name;
  const size_t dim = h.dim, hid = h.hidden_dim, head = dim / h.n_heads, kv = head * h.n_kv_heads;
  auto copy = [&](size_t offset, size_t n) {
    std::memcpy(dst, s.data + offset, n * sizeof(float));
  };
  // q/k: rows of each head from pairs (2i, 2i+1) to halves (i, i + head/2).
  auto permuted = [&](size_t offset, int heads) {
    for (int hd = 0; hd < heads; ++hd) {
      for (size_t a = 0; a < 2; ++a) {
        for (size_t i = 0; i < head / 2; ++i) {
          const size_t to = hd * head + a * (head / 2) + i, from = hd * head + 2 * i + a;
          std::memcpy(dst + to * dim, s.data + offset + from * dim, dim * sizeof(float));
        }
      }
    }
  };
  namespace tn = tensor_names;
  if (name == tn::Embedding()) return copy(s.embed, std::abs(h.vocab_size) * dim);
  if (name == tn::FinalNorm()) return copy(s.rms_final, dim);
  if (name == "lm_head.weight") return copy(s.wcls, std::abs(h.vocab_size) * dim);
  for (int l = 0; l < h.n_layers; ++l) {
    if (name == tn::AttnNorm(l)) return copy(s.rms_att + l * dim, dim);
    if (name == tn::FfnNorm(s.config, l)) return copy(s.rms_ffn + l * dim, dim);
    if (name == tn::Q(l)) return permuted(s.wq + l * dim * dim, h.n_heads);
    if (name == tn::K(l)) return permuted(s.wk + l * kv * dim, h.n_kv_heads);
    if (name == tn::V(l)) return copy(s.wv + l * kv * dim, kv * dim);
    if (name == tn::O(l)) return copy(s.wo + l * dim * dim, dim * dim);
    if (name == tn::Gate(s.config, l, -1)) return copy(s.w1 + l * hid * dim, hid * dim);
    if (name == tn::Down(s.config, l, -1)) return copy(s.w2 + l * dim * hid, dim * hid);
    if (name == tn::Up(s.config, l, -1)) return copy(s.w3 + l * hid * dim, hid * dim);
  }
}

}  // namespace

}  // namespace failsafe
