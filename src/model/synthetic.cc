#include "model/synthetic.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "common/rng.h"
#include "common/utf8.h"
#include "model/file_util.h"
#include "model/hf_pre_tokenizer.h"
#include "model/tokenizer.h"
#include "model/weights.h"

namespace failsafe {

using nlohmann::json;

std::vector<std::string> SyntheticPresetNames() {
  return {"tiny-llama",      "tiny-mixtral",    "tiny-qwen2",    "tiny-qwen3",   "tiny-qwen3-moe",
          "tiny-qwen2-moe",  "tiny-phi3",       "tiny-gemma2",   "tiny-gemma3",  "small-llama",
          "1b-llama",        "micro-llama",     "micro-mixtral", "micro-qwen2",  "micro-qwen3",
          "micro-qwen3-moe", "micro-qwen2-moe", "micro-phi3",    "micro-gemma2", "micro-gemma3",
          "stories-260k"};
}

namespace {

// The fields every preset sets, in this order: architecture, hidden size,
// layers, query heads, KV heads, head_dim, FFN width (each expert's),
// vocabulary, positions, RoPE base.
void SetShape(ModelConfig* c, Architecture arch, int hidden, int layers, int heads, int kv_heads,
              int head_dim, int intermediate, int vocab, int max_positions, double rope_theta) {
  c->architecture = arch;
  c->hidden_size = hidden;
  c->num_layers = layers;
  c->num_heads = heads;
  c->num_kv_heads = kv_heads;
  c->head_dim = head_dim;
  c->intermediate_size = intermediate;
  c->vocab_size = vocab;
  c->max_position_embeddings = max_positions;
  c->rope_theta = rope_theta;
}

// Phi-3's LongRoPE factors, growing from 1 with the wavelength as the
// published ones do (long ones more), trained at `original` positions.
void SetLongRope(ModelConfig* c, int original) {
  const int half = c->head_dim / 2;
  LongRope& lr = c->longrope;
  for (int i = 0; i < half; ++i) {
    const double x = static_cast<double>(i) / (half - 1);
    lr.short_factor.push_back(1.0 + 0.5 * x * x);
    lr.long_factor.push_back(1.0 + 15.0 * x * x);
  }
  lr.original_max_position_embeddings = original;
  lr.SetContext(c->max_position_embeddings);
}

}  // namespace

Result<ModelConfig> SyntheticPresetConfig(const std::string& preset) {
  ModelConfig c;
  // 8 KV heads unless a preset says otherwise, like Llama-3.1-70B and
  // Mixtral-8x22B: 3, 5, 6, 7 devices are irregular.
  c.rms_norm_eps = 1e-5;
  if (preset == "tiny-llama") {
    SetShape(&c, Architecture::kLlama, 256, 4, 16, 8, 16, 512, 512, 8192, 500000.0);
    c.rope_scaling = {true, 8.0, 1.0, 4.0, 256};
  } else if (preset == "tiny-mixtral") {
    SetShape(&c, Architecture::kMixtral, 256, 4, 16, 8, 16, 256, 512, 8192, 1000000.0);
    c.num_experts = 8;
    c.experts_per_token = 2;
    c.tie_word_embeddings = true;
    c.sliding_window = 96;
  } else if (preset == "tiny-qwen2") {
    // Qwen2.5-0.5B's proportions: 14 query heads over 2 KV heads, q/k/v
    // biases, tied embeddings.
    SetShape(&c, Architecture::kQwen2, 224, 4, 14, 2, 16, 608, 512, 8192, 1000000.0);
    c.rms_norm_eps = 1e-6;
    c.tie_word_embeddings = true;
  } else if (preset == "tiny-qwen3") {
    // Qwen3's: query and key norms, head_dim set apart from the hidden size
    // (16 x 32 = 512 query columns over a hidden size of 256).
    SetShape(&c, Architecture::kQwen3, 256, 4, 16, 8, 32, 384, 512, 8192, 1000000.0);
    c.rms_norm_eps = 1e-6;
  } else if (preset == "tiny-qwen3-moe") {
    // Qwen3-30B-A3B's routing: many narrow experts, top 8 renormalised.
    SetShape(&c, Architecture::kQwen3Moe, 256, 3, 16, 4, 32, 64, 512, 8192, 1000000.0);
    c.num_experts = 32;
    c.experts_per_token = 8;
    c.rms_norm_eps = 1e-6;
  } else if (preset == "tiny-qwen2-moe") {
    // Qwen1.5-MoE-A2.7B's: as many KV heads as query heads, q/k/v biases,
    // top 4 of the routed experts with the softmax's weights (not
    // renormalised), a shared expert four experts wide behind its gate.
    SetShape(&c, Architecture::kQwen2Moe, 256, 3, 8, 8, 32, 64, 512, 8192, 1000000.0);
    c.num_experts = 16;
    c.experts_per_token = 4;
    c.renormalize_topk = false;
    c.shared_expert_size = 256;
    c.rms_norm_eps = 1e-6;
  } else if (preset == "tiny-phi3") {
    // Phi-3's layout: q, k, v in one qkv_proj, gate and up in one
    // gate_up_proj; a sliding window shorter than the tests' prompts;
    // Phi-3-mini-128k's LongRoPE, trained at 64 positions and served at
    // 4096: the long factors, cos and sin times sqrt(1 + ln 64 / ln 64).
    SetShape(&c, Architecture::kPhi3, 192, 3, 12, 4, 16, 320, 512, 4096, 10000.0);
    c.sliding_window = 48;
    SetLongRope(&c, 64);
  } else if (preset == "tiny-gemma2") {
    // Gemma 2's: every other layer sliding (the first), score and final
    // logit soft-capping (caps low enough to bend these weights' logits),
    // (1 + w) and sandwich norms, GeGLU, scaled embeddings.
    SetShape(&c, Architecture::kGemma2, 160, 4, 8, 4, 32, 320, 512, 8192, 10000.0);
    c.rms_norm_eps = 1e-6;
    c.query_pre_attn_scalar = 40;
    c.sliding_window = 24;
    c.sliding_layers = {true, false, true, false};
    c.attn_softcap = 5.0;
    c.final_softcap = 3.0;
    c.tie_word_embeddings = true;
  } else if (preset == "tiny-gemma3") {
    // Gemma 3's: one KV head, sliding layers (window 32, their own RoPE base)
    // with a global one every third, (1 + w) and sandwich norms, GeGLU,
    // scaled embeddings, a query scale apart from head_dim, linear RoPE
    // scaling on the global layers (as Gemma 3 4B and up).
    SetShape(&c, Architecture::kGemma3, 192, 6, 4, 1, 64, 384, 512, 8192, 1000000.0);
    c.rms_norm_eps = 1e-6;
    c.rope_local_theta = 10000.0;
    c.rope_linear_factor = 8.0;
    c.query_pre_attn_scalar = 48;
    c.sliding_window = 32;
    c.sliding_layers = {true, true, false, true, true, false};
    c.tie_word_embeddings = true;
  } else if (preset == "small-llama") {
    SetShape(&c, Architecture::kLlama, 1024, 12, 16, 8, 64, 2816, 16384, 8192, 500000.0);
  } else if (preset == "1b-llama") {
    SetShape(&c, Architecture::kLlama, 2048, 16, 32, 8, 64, 5632, 32000, 4096, 10000.0);
  } else if (preset == "micro-llama") {
    SetShape(&c, Architecture::kLlama, 64, 2, 8, 4, 8, 96, 384, 2048, 10000.0);
  } else if (preset == "micro-mixtral") {
    SetShape(&c, Architecture::kMixtral, 64, 2, 8, 4, 8, 48, 384, 2048, 1000000.0);
    c.num_experts = 4;
    c.experts_per_token = 2;
    c.tie_word_embeddings = true;
    c.sliding_window = 24;
  } else if (preset == "micro-qwen2") {
    SetShape(&c, Architecture::kQwen2, 64, 2, 8, 4, 8, 96, 384, 2048, 1000000.0);
    c.tie_word_embeddings = true;
  } else if (preset == "micro-qwen3") {
    SetShape(&c, Architecture::kQwen3, 64, 2, 8, 4, 16, 96, 384, 2048, 1000000.0);
  } else if (preset == "micro-qwen3-moe") {
    SetShape(&c, Architecture::kQwen3Moe, 64, 2, 8, 4, 16, 24, 384, 2048, 1000000.0);
    c.num_experts = 8;
    c.experts_per_token = 3;
  } else if (preset == "micro-qwen2-moe") {
    SetShape(&c, Architecture::kQwen2Moe, 64, 2, 8, 4, 8, 24, 384, 2048, 1000000.0);
    c.num_experts = 6;
    c.experts_per_token = 2;
    c.renormalize_topk = false;
    c.shared_expert_size = 48;
  } else if (preset == "micro-phi3") {
    SetShape(&c, Architecture::kPhi3, 64, 2, 8, 4, 8, 96, 384, 2048, 10000.0);
    c.sliding_window = 20;
    SetLongRope(&c, 2048);  // served at the trained context: the short factors
  } else if (preset == "micro-gemma2") {
    SetShape(&c, Architecture::kGemma2, 64, 2, 8, 4, 16, 96, 384, 2048, 10000.0);
    c.rms_norm_eps = 1e-6;
    c.query_pre_attn_scalar = 16;
    c.sliding_window = 12;
    c.sliding_layers = {true, false};
    c.attn_softcap = 4.0;
    c.final_softcap = 2.0;
    c.tie_word_embeddings = true;
  } else if (preset == "micro-gemma3") {
    SetShape(&c, Architecture::kGemma3, 64, 3, 8, 4, 16, 96, 384, 2048, 1000000.0);
    c.rms_norm_eps = 1e-6;
    c.rope_local_theta = 10000.0;
    c.query_pre_attn_scalar = 16;
    c.sliding_window = 12;
    c.sliding_layers = {true, true, false};
    c.tie_word_embeddings = true;
  } else if (preset == "stories-260k") {
    // The shape of Karpathy's llama2.c stories260K.
    SetShape(&c, Architecture::kLlama, 64, 5, 8, 4, 8, 172, 512, 512, 10000.0);
    c.tie_word_embeddings = true;
  } else {
    std::string names;
    for (auto& n : SyntheticPresetNames()) names += (names.empty() ? "" : ", ") + n;
    return InvalidArgument("unknown preset '{}' (known: {})", preset, names);
  }
  return c;
}

namespace {

// Original text used to train the synthetic tokenizer's first merges.
const char kCorpus[] =
    "The engine keeps serving when a device fails. Every request that was running keeps its place, "
    "and the tokens it has produced are never lost. When one of the eight accelerators drops out, "
    "the "
    "others take over its share of the attention heads and of the feed forward layers, and the "
    "work is "
    "spread so that no device waits for another. The cache of keys and values is copied to host "
    "memory "
    "in the background, so after a failure it can be restored instead of computed again. Weights "
    "are "
    "loaded only where they are missing, and each device fetches a different piece, so nothing "
    "crosses "
    "the bus twice. When the device comes back, it is taken in again and the speed returns.\n"
    "A scheduler decides which requests run in each step. It mixes the first chunks of new prompts "
    "with "
    "the next token of every running sequence, within a budget of tokens. It counts the memory of "
    "every "
    "device, because a device that holds more heads also holds more of the cache. It routes each "
    "new "
    "request to the device with the least pending work, and it packs several prompts into one "
    "batch when "
    "that makes the slowest device finish sooner.\n"
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 16 32 64 128 256 512 1024 2048 4096 8192. Punctuation, quotes "
    "(\"like this\"), brackets [a, b] {c: d}, and symbols + - * / = < > % & | ! ? ; : # @ $ ^ ~ "
    "`.\n"
    "Questions and answers: what is a plan? It says which head groups and which shards each device "
    "holds. What is a rank? It is the device that owns the extra heads of a request. How fast is "
    "it? "
    "Measure it, and compare the figures side by side in one run.\n";

const char kLlama3Pattern[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

const char* kSpecials[] = {"<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                           "<|end_header_id|>", "<|eot_id|>"};

std::string ByteLevel(std::string_view s) {
  std::string out;
  for (unsigned char c : s) AppendUtf8(ByteToCodePoint(c), &out);
  return out;
}

// Splits the corpus into words the way the Llama-3 pattern roughly does:
// a leading space or punctuation attaches to the following letters.
std::vector<std::string> CorpusWords() {
  std::vector<std::string> words;
  std::string cur;
  auto flush = [&] {
    if (!cur.empty()) words.push_back(cur);
    cur.clear();
  };
  for (const char* p = kCorpus; *p; ++p) {
    char c = *p;
    bool alpha = std::isalpha(static_cast<unsigned char>(c));
    if (alpha) {
      if (!cur.empty() && !std::isalpha(static_cast<unsigned char>(cur.back())) && cur != " ")
        flush();
      cur.push_back(c);
    } else {
      flush();
      cur.push_back(c);
      if (c != ' ') flush();
    }
  }
  flush();
  return words;
}

}  // namespace

SyntheticTokenizer BuildSyntheticTokenizer(int vocab_size, uint64_t seed) {
  const int num_special = static_cast<int>(std::size(kSpecials));
  const int target_merges = vocab_size - 256 - num_special;
  std::vector<std::string> id_to_tok;
  std::map<std::string, int> vocab;
  for (int b = 0; b < 256; ++b) {
    std::string s;
    AppendUtf8(ByteToCodePoint(static_cast<unsigned char>(b)), &s);
    vocab[s] = b;
    id_to_tok.push_back(s);
  }
  std::vector<std::pair<std::string, std::string>> merges;

  // 1) Classic BPE training on the corpus words.
  std::map<std::vector<std::string>, int> word_counts;
  for (auto& w : CorpusWords()) {
    std::vector<std::string> syms;
    for (unsigned char c : w) syms.push_back(ByteLevel(std::string(1, static_cast<char>(c))));
    word_counts[syms]++;
  }
  while (static_cast<int>(merges.size()) < target_merges) {
    std::map<std::pair<std::string, std::string>, int> pairs;
    for (auto& [syms, n] : word_counts) {
      for (size_t i = 0; i + 1 < syms.size(); ++i) pairs[{syms[i], syms[i + 1]}] += n;
    }
    const std::pair<std::string, std::string>* best = nullptr;
    int best_n = 1;  // stop when no pair occurs twice
    for (auto& [p, n] : pairs) {
      if (n > best_n && !vocab.count(p.first + p.second)) {
        best_n = n;
        best = &p;
      }
    }
    if (!best) break;
    auto merge = *best;
    std::string joined = merge.first + merge.second;
    vocab[joined] = static_cast<int>(id_to_tok.size());
    id_to_tok.push_back(joined);
    merges.push_back(merge);
    std::map<std::vector<std::string>, int> next;
    for (auto& [syms, n] : word_counts) {
      std::vector<std::string> out;
      for (size_t i = 0; i < syms.size(); ++i) {
        if (i + 1 < syms.size() && syms[i] == merge.first && syms[i + 1] == merge.second) {
          out.push_back(joined);
          ++i;
        } else {
          out.push_back(syms[i]);
        }
      }
      next[out] += n;
    }
    word_counts.swap(next);
  }

  // 2) Pad with seeded merges of letter tokens, so that large vocabularies are
  // full of plausible word pieces.
  std::vector<std::string> letterish;  // tokens of letters, optionally with a leading space
  const std::string space = ByteLevel(" ");
  auto is_letters = [&](const std::string& t, bool allow_space) {
    std::string_view v = t;
    if (allow_space && v.substr(0, space.size()) == space) v.remove_prefix(space.size());
    if (v.empty()) return false;
    return std::all_of(v.begin(), v.end(), [](char c) { return c >= 'a' && c <= 'z'; });
  };
  for (auto& t : id_to_tok) {
    if (is_letters(t, true)) letterish.push_back(t);
  }
  Rng rng(HashCombine(seed, 0x70c));
  int attempts = 0;
  while (static_cast<int>(merges.size()) < target_merges && attempts < 50 * target_merges) {
    ++attempts;
    const std::string& a = letterish[rng.Below(letterish.size())];
    const std::string& b = letterish[rng.Below(letterish.size())];
    if (!is_letters(b, false) || a.size() + b.size() > 24) continue;
    std::string joined = a + b;
    if (vocab.count(joined)) continue;
    vocab[joined] = static_cast<int>(id_to_tok.size());
    id_to_tok.push_back(joined);
    merges.emplace_back(a, b);
    letterish.push_back(joined);
  }
  // Whatever is still missing becomes reserved special tokens (tiny corpora only).
  SyntheticTokenizer out;
  json added = json::array();
  int next_id = static_cast<int>(id_to_tok.size());
  int reserved = 0;
  while (next_id < vocab_size - num_special) {
    std::string name = "<|reserved_special_token_" + std::to_string(reserved++) + "|>";
    added.push_back({{"id", next_id++},
                     {"content", name},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  }
  for (int i = 0; i < num_special; ++i) {
    int id = next_id++;
    added.push_back({{"id", id},
                     {"content", kSpecials[i]},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
    if (std::string(kSpecials[i]) == "<|begin_of_text|>") out.bos_id = id;
    if (std::string(kSpecials[i]) == "<|eot_id|>") out.eos_id = id;
    if (std::string(kSpecials[i]) == "<|end_of_text|>") out.end_of_text_id = id;
  }
  json vocab_json = json::object();
  for (size_t i = 0; i < id_to_tok.size(); ++i) vocab_json[id_to_tok[i]] = i;
  json merges_json = json::array();
  for (auto& [a, b] : merges) merges_json.push_back(json::array({a, b}));
  json j = {{"version", "1.0"},
            {"truncation", nullptr},
            {"padding", nullptr},
            {"added_tokens", added},
            {"normalizer", nullptr},
            {"pre_tokenizer",
             {{"type", "Sequence"},
              {"pretokenizers",
               {{{"type", "Split"},
                 {"pattern", {{"Regex", kLlama3Pattern}}},
                 {"behavior", "Isolated"},
                 {"invert", false}},
                {{"type", "ByteLevel"},
                 {"add_prefix_space", false},
                 {"trim_offsets", true},
                 {"use_regex", false}}}}}},
            {"post_processor",
             {{"type", "TemplateProcessing"},
              {"single",
               {{{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}},
                {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
              {"pair", json::array()},
              {"special_tokens",
               {{"<|begin_of_text|>",
                 {{"id", "<|begin_of_text|>"},
                  {"ids", {out.bos_id}},
                  {"tokens", {"<|begin_of_text|>"}}}}}}}},
            {"decoder",
             {{"type", "ByteLevel"},
              {"add_prefix_space", true},
              {"trim_offsets", true},
              {"use_regex", true}}},
            {"model",
             {{"type", "BPE"},
              {"dropout", nullptr},
              {"unk_token", nullptr},
              {"continuing_subword_prefix", nullptr},
              {"end_of_word_suffix", nullptr},
              {"fuse_unk", false},
              {"byte_fallback", false},
              {"ignore_merges", true},
              {"vocab", vocab_json},
              {"merges", merges_json}}}};
  out.json = j.dump(1) + "\n";
  return out;
}

namespace {

struct FillContext {
  const ModelConfig* config;
  std::vector<SafetensorsWriter::Entry> entries;
  // The name each entry's values derive from (the text model's name of a
  // vision-language layout's tensor); empty: the entries' own.
  std::vector<std::string> value_names;
  uint64_t seed;
};

// Per-tensor scale, chosen so that: the residual stream has unit-scale
// entries; attention scores have a spread of about 1.5 (attention mixes
// context); each layer moves the residual by a fraction of its size; and the
// logits have a standard deviation of about 4 (clear greedy margins).
double InitStd(const ModelConfig& c, const std::string& name) {
  const double h = c.hidden_size;
  auto ends = [&](const char* suffix) {
    std::string s(suffix);
    return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
  };
  if (name == tensor_names::Embedding()) return 1.0;
  if (name == "lm_head.weight") return 4.0 / std::sqrt(h);
  if (ends("q_proj.weight") || ends("k_proj.weight")) return std::sqrt(std::sqrt(1.5) / h);
  if (ends("v_proj.weight")) return 1.0 / std::sqrt(h);
  if (ends("o_proj.weight")) return 0.8 / std::sqrt(static_cast<double>(c.q_dim()));
  if (ends("gate_proj.weight") || ends("up_proj.weight") || ends("w1.weight") ||
      ends("w3.weight")) {
    return 1.0 / std::sqrt(h);
  }
  if (ends("shared_expert.down_proj.weight"))
    return 0.8 / std::sqrt(static_cast<double>(c.shared_expert_size));
  if (ends("down_proj.weight") || ends("w2.weight"))
    return 0.8 / std::sqrt(static_cast<double>(c.intermediate_size));
  if (ends("gate.weight")) return 1.5 / std::sqrt(h);  // MoE router
  return 0.0;                                          // norms: handled separately
}

void Fill(void* ctx_ptr, size_t index, float* dst) {
  auto* ctx = static_cast<FillContext*>(ctx_ptr);
  const auto& e = ctx->entries[index];
  const std::string& name = ctx->value_names.empty() ? e.name : ctx->value_names[index];
  int64_t n = 1;
  for (auto d : e.shape) n *= d;
  uint64_t h = 1469598103934665603ULL;
  for (char c : name) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ULL;
  Rng rng(HashCombine(ctx->seed, h));
  if (name.size() > 5 && name.compare(name.size() - 5, 5, ".bias") == 0) {
    for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(0.5 * rng.Normal());
    return;
  }
  bool is_norm = e.shape.size() == 1;
  if (is_norm) {
    // Gemma's norms scale by (1 + w): the same scales around 1.
    const double one = ctx->config->gemma() ? 0.0 : 1.0;
    for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(one + 0.1 * rng.Normal());
    return;
  }
  // With tied embeddings the embedding doubles as the LM head: use the LM
  // head's scale and rescale the residual stream through the norms instead.
  double sd = InitStd(*ctx->config, name);
  for (const char* vision : {"vision_tower.", "multi_modal_projector.", "model.vision_tower.",
                             "model.multi_modal_projector."}) {
    if (name.rfind(vision, 0) == 0) sd = 0.02;
  }
  if (ctx->config->tie_word_embeddings && name == tensor_names::Embedding()) {
    sd = 4.0 / std::sqrt(static_cast<double>(ctx->config->hidden_size));
  }
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(sd * rng.Normal());
}

// A small SigLIP vision tower and Gemma 3's projector, as
// Gemma3ForConditionalGeneration stores them (under `prefix`: "" or "model.").
constexpr int kVisionHidden = 32, kVisionInter = 64, kVisionImage = 28, kVisionPatch = 14;

std::vector<SafetensorsWriter::Entry> VisionTensors(const ModelConfig& c, const std::string& prefix,
                                                    DType dtype) {
  const int64_t h = kVisionHidden,
                patches = (kVisionImage / kVisionPatch) * (kVisionImage / kVisionPatch);
  const std::string v = prefix + "vision_tower.vision_model.";
  const std::string l = v + "encoder.layers.0.";
  std::vector<SafetensorsWriter::Entry> out = {
      {v + "embeddings.patch_embedding.weight", {h, 3, kVisionPatch, kVisionPatch}, dtype},
      {v + "embeddings.patch_embedding.bias", {h}, dtype},
      {v + "embeddings.position_embedding.weight", {patches, h}, dtype}};
  for (const char* p : {"q_proj", "k_proj", "v_proj", "out_proj"}) {
    out.push_back({l + "self_attn." + p + ".weight", {h, h}, dtype});
    out.push_back({l + "self_attn." + p + ".bias", {h}, dtype});
  }
  for (const char* n : {"layer_norm1", "layer_norm2"}) {
    out.push_back({l + n + ".weight", {h}, dtype});
    out.push_back({l + n + ".bias", {h}, dtype});
  }
  out.push_back({l + "mlp.fc1.weight", {kVisionInter, h}, dtype});
  out.push_back({l + "mlp.fc1.bias", {kVisionInter}, dtype});
  out.push_back({l + "mlp.fc2.weight", {h, kVisionInter}, dtype});
  out.push_back({l + "mlp.fc2.bias", {h}, dtype});
  out.push_back({v + "post_layernorm.weight", {h}, dtype});
  out.push_back({v + "post_layernorm.bias", {h}, dtype});
  const std::string m = prefix + "multi_modal_projector.";
  out.push_back({m + "mm_input_projection_weight", {h, c.hidden_size}, dtype});
  out.push_back({m + "mm_soft_emb_norm.weight", {h}, dtype});
  return out;
}

// config.json of Gemma3ForConditionalGeneration around the text model's:
// the token ids at the top level, and text_config leaving out what equals
// transformers' defaults, as the published configs do.
std::string VisionLanguageConfigJson(const ModelConfig& c, DType dtype) {
  json text = json::parse(c.ToJson());
  json top = {{"architectures", {"Gemma3ForConditionalGeneration"}},
              {"model_type", "gemma3"},
              {"mm_tokens_per_image", 1},
              {"torch_dtype", dtype == DType::kF32   ? "float32"
                              : dtype == DType::kF16 ? "float16"
                                                     : "bfloat16"}};
  for (const char* f : {"bos_token_id", "eos_token_id", "tie_word_embeddings"}) {
    if (text.contains(f)) top[f] = text[f];
  }
  for (const char* f :
       {"architectures", "torch_dtype", "bos_token_id", "eos_token_id", "tie_word_embeddings"}) {
    text.erase(f);
  }
  const json defaults = json::parse(Gemma3TextDefaultsJson());
  for (const auto& [f, d] : defaults.items()) {
    if (text.contains(f) && text[f] == d) text.erase(f);
  }
  top["text_config"] = text;
  top["vision_config"] = {{"model_type", "siglip_vision_model"},
                          {"hidden_size", kVisionHidden},
                          {"intermediate_size", kVisionInter},
                          {"num_attention_heads", 2},
                          {"num_hidden_layers", 1},
                          {"image_size", kVisionImage},
                          {"patch_size", kVisionPatch},
                          {"vision_use_head", false}};
  return top.dump(2) + "\n";
}

}  // namespace

Result<ModelConfig> SyntheticConfig(const SyntheticModelOptions& options) {
  FS_ASSIGN_OR_RETURN(ModelConfig c, SyntheticPresetConfig(options.preset));
  if (options.num_heads < 0 || options.num_kv_heads < 0)
    return InvalidArgument("head counts must be positive");
  if (options.num_heads > 0) c.num_heads = options.num_heads;
  if (options.num_kv_heads > 0) c.num_kv_heads = options.num_kv_heads;
  if (c.num_heads % c.num_kv_heads != 0) {
    return InvalidArgument("{} query heads cannot be grouped over {} KV heads", c.num_heads,
                           c.num_kv_heads);
  }
  if (options.vocab_size != 0) {
    if (options.vocab_size < 512 || options.vocab_size > (1 << 20))
      return InvalidArgument("vocab_size must be in [512, 1048576] (got {})", options.vocab_size);
    c.vocab_size = options.vocab_size;
  }
  return c;
}

Status WriteSyntheticModel(const std::string& dir, const SyntheticModelOptions& options) {
  FS_ASSIGN_OR_RETURN(ModelConfig config, SyntheticConfig(options));
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Internal("{}: cannot create directory: {}", dir, ec.message());
  if (options.num_shards < 1) return InvalidArgument("num_shards must be at least 1");

  SyntheticTokenizer tok = BuildSyntheticTokenizer(config.vocab_size, options.seed);
  config.bos_token_id = tok.bos_id;
  config.eos_token_id = tok.eos_id;
  FS_RETURN_IF_ERROR(WriteStringToFile(dir + "/tokenizer.json", tok.json));
  // Generation stops at the end of a turn or of the text, as Llama-3's does.
  FS_RETURN_IF_ERROR(WriteStringToFile(
      dir + "/generation_config.json",
      json{{"bos_token_id", tok.bos_id}, {"eos_token_id", {tok.eos_id, tok.end_of_text_id}}}.dump(
          2) +
          "\n"));

  FillContext ctx;
  ctx.config = &config;
  ctx.seed = options.seed;
  for (auto& t : ExpectedTensors(config)) ctx.entries.push_back({t.name, t.shape, options.dtype});
  const std::string& vl = options.vision_language_prefix;
  if (!vl.empty()) {
    if (config.architecture != Architecture::kGemma3)
      return InvalidArgument("a vision-language layout is Gemma 3's (preset {} is {})",
                             options.preset, ArchitectureName(config.architecture));
    if (vl != "language_model.model." && vl != "model.language_model.")
      return InvalidArgument(
          "vision-language prefix '{}': use language_model.model. or model.language_model.", vl);
    for (auto& e : ctx.entries) {
      ctx.value_names.push_back(e.name);
      if (e.name.rfind("model.", 0) == 0)
        e.name = vl + e.name.substr(std::strlen("model."));
      else if (vl == "language_model.model.")  // an untied lm_head
        e.name = "language_model." + e.name;
    }
    for (auto& e :
         VisionTensors(config, vl == "model.language_model." ? "model." : "", options.dtype)) {
      ctx.value_names.push_back(e.name);
      ctx.entries.push_back(e);
    }
  }

  // Remove stale shards/index of an earlier model in the same directory.
  std::filesystem::remove(dir + "/model.safetensors.index.json", ec);
  std::filesystem::remove(dir + "/model.safetensors", ec);
  if (options.num_shards == 1) {
    FS_RETURN_IF_ERROR(
        SafetensorsWriter::Write(dir + "/model.safetensors", ctx.entries, Fill, &ctx));
  } else {
    const size_t per = (ctx.entries.size() + options.num_shards - 1) / options.num_shards;
    json weight_map = json::object();
    for (int s = 0; s < options.num_shards; ++s) {
      std::string file =
          fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, options.num_shards);
      FillContext part = ctx;
      part.entries.clear();
      part.value_names.clear();
      for (size_t i = s * per; i < std::min(ctx.entries.size(), (s + 1) * per); ++i) {
        part.entries.push_back(ctx.entries[i]);
        if (!ctx.value_names.empty()) part.value_names.push_back(ctx.value_names[i]);
        weight_map[ctx.entries[i].name] = file;
      }
      FS_RETURN_IF_ERROR(SafetensorsWriter::Write(dir + "/" + file, part.entries, Fill, &part));
    }
    json index = {{"metadata", {{"total_size", config.NumParameters() * DTypeSize(options.dtype)}}},
                  {"weight_map", weight_map}};
    FS_RETURN_IF_ERROR(
        WriteStringToFile(dir + "/model.safetensors.index.json", index.dump(2) + "\n"));
  }
  // config.json last: its presence marks a complete model.
  return WriteStringToFile(
      dir + "/config.json",
      vl.empty() ? config.ToJson() : VisionLanguageConfigJson(config, options.dtype));
}

}  // namespace failsafe
