#include "model/hf_tokenizer.h"

#include <algorithm>
#include <functional>
#include <nlohmann/json.hpp>

#include "model/hf_json.h"
#include "model/tokenizer_config.h"

namespace failsafe {

using nlohmann::json;

Result<std::unique_ptr<HfTokenizer>> HfTokenizer::Parse(std::string_view text,
                                                        const std::string& source) {
  json j = json::parse(text.begin(), text.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) return InvalidArgument("{}: not a JSON object", source);
  auto t = std::unique_ptr<HfTokenizer>(new HfTokenizer());

  auto model = j.find("model");
  if (model == j.end() || !model->is_object())
    return InvalidArgument("{}: field 'model' is missing", source);
  if (model->contains("type") && (*model)["type"] != "BPE") {
    return InvalidArgument("{}: field 'model.type': only \"BPE\" is supported (got {})", source,
                           (*model)["type"].dump());
  }
  FS_ASSIGN_OR_RETURN(t->model_, BpeModel::Parse(*model, source));

  // Normalizer, pre-tokenizer and decoder: null means none.
  auto component = [&](const char* key, auto parse, auto* dst) -> Status {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return Status::Ok();
    auto r = parse(*it, key);
    if (!r.ok()) return InvalidArgument("{}: {}", source, r.status().message());
    *dst = std::move(r).value();
    return Status::Ok();
  };
  FS_RETURN_IF_ERROR(component("normalizer", HfNormalizer::Parse, &t->normalizer_));
  FS_RETURN_IF_ERROR(component("pre_tokenizer", HfPreTokenizer::Parse, &t->pre_tokenizer_));
  FS_RETURN_IF_ERROR(component("decoder", HfDecoder::Parse, &t->decoder_));

  // The id space: the model's vocabulary and the added tokens.
  int max_id = t->model_->max_id();
  auto added = j.find("added_tokens");
  if (added != j.end() && !added->is_null()) {
    if (!added->is_array())
      return InvalidArgument("{}: field 'added_tokens' must be a list", source);
    for (const json& a : *added) {
      if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() ||
          !a.contains("content") || !a["content"].is_string() || a["id"].get<int64_t>() < 0 ||
          a["id"].get<int64_t>() > (1 << 24)) {
        return InvalidArgument(
            "{}: field 'added_tokens': each entry needs an integer 'id' and a string 'content'",
            source);
      }
      if (a["content"].get<std::string>().empty())
        return InvalidArgument("{}: field 'added_tokens': empty content", source);
      max_id = std::max(max_id, a["id"].get<int>());
    }
  }
  t->id_to_token_.assign(static_cast<size_t>(max_id + 1), std::string());
  t->added_by_id_.assign(static_cast<size_t>(max_id + 1), -1);
  t->special_by_id_.assign(static_cast<size_t>(max_id + 1), false);
  for (const auto& [tok, id] : t->model_->vocab()) {
    t->id_to_token_[id] = tok;
    t->token_to_id_[tok] = id;
  }
  if (added != j.end() && added->is_array()) {
    int i = 0;
    for (const json& a : *added) {
      const std::string field = fmt::format("added_tokens[{}]", i++);
      AddedToken at;
      at.id = a["id"].get<int>();
      at.content = a["content"].get<std::string>();
      FS_ASSIGN_OR_RETURN(at.special, OptBool(a, "special", false, field));
      FS_ASSIGN_OR_RETURN(at.normalized, OptBool(a, "normalized", !at.special, field));
      FS_ASSIGN_OR_RETURN(at.lstrip, OptBool(a, "lstrip", false, field));
      FS_ASSIGN_OR_RETURN(at.rstrip, OptBool(a, "rstrip", false, field));
      FS_ASSIGN_OR_RETURN(bool single_word, OptBool(a, "single_word", false, field));
      if (single_word) {
        return InvalidArgument(
            "{}: field '{}.single_word': single-word added tokens are not "
            "supported",
            source, field);
      }
      // An added token may repeat a vocabulary token (same id, same text), nothing else.
      const std::string& existing = t->id_to_token_[at.id];
      if (t->added_by_id_[at.id] >= 0 || (!existing.empty() && existing != at.content)) {
        return InvalidArgument("{}: field 'added_tokens': id {} is already used", source, at.id);
      }
      auto same = t->token_to_id_.find(at.content);
      if (same != t->token_to_id_.end() && same->second != at.id) {
        return InvalidArgument("{}: field 'added_tokens': '{}' already has id {}", source,
                               at.content, same->second);
      }
      t->id_to_token_[at.id] = at.content;
      t->token_to_id_[at.content] = at.id;
      t->added_by_id_[at.id] = static_cast<int>(t->added_.size());
      t->special_by_id_[at.id] = at.special;
      t->added_contents_.insert(at.content);
      t->added_.push_back(at);
    }
  }
  for (size_t i = 0; i < t->added_.size(); ++i) {
    const AddedToken& a = t->added_[i];
    t->added_lookup_.emplace(a.content, a.id);
    if (a.normalized && t->normalizer_) {
      const std::string n = t->normalizer_->Normalize(a.content);
      if (!n.empty()) t->normalized_matcher_.Add(n, static_cast<int>(i));
      if (!n.empty()) t->added_lookup_.emplace(n, a.id);
    } else {
      t->raw_matcher_.Add(a.content, static_cast<int>(i));
    }
  }

  // Byte-level BPE needs a symbol for every byte, or text would be lost.
  std::function<bool(const json&)> has_byte_level = [&](const json& x) -> bool {
    if (x.is_object()) {
      if (x.contains("type") && x["type"] == "ByteLevel") return true;
      for (const auto& [k, v] : x.items()) {
        if (has_byte_level(v)) return true;
      }
    } else if (x.is_array()) {
      for (const json& v : x) {
        if (has_byte_level(v)) return true;
      }
    }
    return false;
  };
  if (j.contains("pre_tokenizer") && has_byte_level(j["pre_tokenizer"])) {
    for (int b = 0; b < 256; ++b) {
      std::string sym;
      AppendUtf8(ByteToCodePoint(static_cast<unsigned char>(b)), &sym);
      if (!t->model_->vocab().count(sym)) {
        return InvalidArgument(
            "{}: field 'model.vocab': byte-level symbol for byte 0x{:02x} is missing", source, b);
      }
    }
  }

  // Post-processor: TemplateProcessing's special tokens around sequence A.
  auto post = j.find("post_processor");
  if (post != j.end() && !post->is_null()) {
    std::vector<const json*> parts;
    if (post->is_object() && post->contains("type") && (*post)["type"] == "Sequence" &&
        post->contains("processors") && (*post)["processors"].is_array()) {
      for (const json& p : (*post)["processors"]) parts.push_back(&p);
    } else {
      parts.push_back(&*post);
    }
    for (const json* p : parts) {
      const std::string type =
          p->is_object() && p->contains("type") && (*p)["type"].is_string() ? (*p)["type"] : "";
      if (type == "ByteLevel") continue;  // offsets only
      if (type != "TemplateProcessing") {
        return InvalidArgument("{}: field 'post_processor': unsupported type '{}'", source, type);
      }
      if (!p->contains("single") || !(*p)["single"].is_array())
        return InvalidArgument("{}: field 'post_processor.single' is missing", source);
      t->prefix_ids_.clear();
      t->suffix_ids_.clear();
      bool after = false;
      for (const json& piece : (*p)["single"]) {
        if (piece.contains("Sequence")) {
          after = true;
          continue;
        }
        if (!piece.contains("SpecialToken") || !piece["SpecialToken"].contains("id") ||
            !piece["SpecialToken"]["id"].is_string()) {
          return InvalidArgument("{}: field 'post_processor.single' has a malformed entry", source);
        }
        const std::string name = piece["SpecialToken"]["id"];
        std::vector<int> ids;
        const json* st = p->contains("special_tokens") && (*p)["special_tokens"].is_object() &&
                                 (*p)["special_tokens"].contains(name)
                             ? &(*p)["special_tokens"][name]
                             : nullptr;
        if (st && st->contains("ids") && (*st)["ids"].is_array()) {
          for (const json& id : (*st)["ids"]) {
            if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > max_id)
              return InvalidArgument("{}: field 'post_processor': bad id for '{}'", source, name);
            ids.push_back(id.get<int>());
          }
        } else if (t->TokenId(name) >= 0) {
          ids.push_back(t->TokenId(name));
        } else {
          return InvalidArgument("{}: field 'post_processor': unknown special token '{}'", source,
                                 name);
        }
        auto& dst = after ? t->suffix_ids_ : t->prefix_ids_;
        dst.insert(dst.end(), ids.begin(), ids.end());
      }
    }
  }
  if (!t->prefix_ids_.empty()) t->bos_id_ = t->prefix_ids_.front();
  return t;
}

Status HfTokenizer::Configure(const TokenizerConfig& config) {
  clean_up_spaces_ = config.clean_up_tokenization_spaces.value_or(false);
  for (const std::string& s : config.additional_special_tokens) {
    const int id = TokenId(s);
    if (id >= 0) special_by_id_[id] = true;
  }
  if (bos_id_ < 0 && config.bos_token) bos_id_ = TokenId(*config.bos_token);
  return Status::Ok();
}

int HfTokenizer::TokenId(std::string_view token) const {
  auto it = token_to_id_.find(std::string(token));
  return it == token_to_id_.end() ? -1 : it->second;
}

bool HfTokenizer::IsSpecial(int id) const {
  return id >= 0 && id < vocab_size() && special_by_id_[id];
}

std::vector<std::pair<std::string, int>> HfTokenizer::SplitAdded(
    std::string_view text, const TokenMatcher& matcher) const {
  std::vector<std::pair<std::string, int>> out;
  if (matcher.empty()) {
    out.emplace_back(std::string(text), -1);
    return out;
  }
  for (const auto& p : matcher.Split(text))
    out.emplace_back(std::string(text.substr(p.begin, p.end - p.begin)), p.value);
  // lstrip / rstrip: an added token eats the whitespace beside it.
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i].second < 0) continue;
    const AddedToken& a = added_[out[i].second];
    if (a.lstrip && i > 0 && out[i - 1].second < 0)
      out[i - 1].first = std::string(TrimEnd(out[i - 1].first));
    if (a.rstrip && i + 1 < out.size() && out[i + 1].second < 0)
      out[i + 1].first = std::string(TrimStart(out[i + 1].first));
  }
  return out;
}

namespace {
// Words encoded at once while a limited Encode pre-tokenizes a long text.
constexpr size_t kWordBatch = 64;
}  // namespace

void HfTokenizer::EncodeSection(const std::string& text, int section_index, std::vector<int>* out,
                                size_t max_tokens) const {
  if (max_tokens == SIZE_MAX || !pre_tokenizer_) {
    std::vector<std::string> words{text};
    if (pre_tokenizer_) pre_tokenizer_->Split(&words, section_index);
    model_->Encode(words, out, max_tokens);
    return;
  }
  // With a limit, words are encoded as the pre-tokenizer finds them, a batch
  // at a time, until the limit is passed: a long text is not cut whole.
  const size_t first = out->size();
  std::vector<std::string> batch;
  auto flush = [&] {
    model_->Encode(batch, out, SIZE_MAX, first);
    batch.clear();
    return out->size() <= max_tokens;
  };
  const bool whole = pre_tokenizer_->SplitEach(text, section_index, [&](std::string&& word) {
    batch.push_back(std::move(word));
    return batch.size() < kWordBatch || flush();
  });
  if (whole) flush();
}

std::vector<int> HfTokenizer::DoEncode(std::string_view raw, bool add_special,
                                       size_t max_tokens) const {
  std::vector<int> out;
  if (add_special) out = prefix_ids_;
  const std::string text = ToValidUtf8(raw);
  const auto sections = SplitAdded(text, raw_matcher_);
  for (size_t s = 0; s < sections.size(); ++s) {
    if (out.size() > max_tokens) return out;
    const auto& [piece, token] = sections[s];
    if (token >= 0) {
      out.push_back(added_[token].id);
      continue;
    }
    if (piece.empty()) continue;
    if (auto it = added_lookup_.find(piece); it != added_lookup_.end()) {
      out.push_back(it->second);  // a whole section that spells an added token
      continue;
    }
    const std::string normalized = normalizer_ ? normalizer_->Normalize(piece) : piece;
    if (normalized.empty()) continue;
    for (const auto& [sub, sub_token] : SplitAdded(normalized, normalized_matcher_)) {
      if (out.size() > max_tokens) return out;
      if (sub_token >= 0) {
        out.push_back(added_[sub_token].id);
      } else if (auto it = added_lookup_.find(sub); it != added_lookup_.end()) {
        out.push_back(it->second);
      } else if (!sub.empty()) {
        EncodeSection(sub, static_cast<int>(s), &out, max_tokens);
      }
    }
  }
  if (out.size() > max_tokens) return out;
  if (add_special) out.insert(out.end(), suffix_ids_.begin(), suffix_ids_.end());
  return out;
}

std::string HfTokenizer::Decode(const std::vector<int>& ids, bool skip_special) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int id : ids) {
    if (id < 0 || id >= vocab_size() || id_to_token_[id].empty()) continue;
    if (skip_special && special_by_id_[id]) continue;
    tokens.push_back(id_to_token_[id]);
  }
  std::string text;
  if (decoder_) {
    decoder_->Decode(&tokens, added_contents_);
    for (const std::string& t : tokens) text += t;
  } else {
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i > 0) text.push_back(' ');
      text += tokens[i];
    }
  }
  if (clean_up_spaces_) {
    static const std::pair<const char*, const char*> kCleanUp[] = {
        {" .", "."},     {" ?", "?"},   {" !", "!"},   {" ,", ","},     {" ' ", "'"},
        {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
    for (auto [from, to] : kCleanUp) {
      std::string r;
      const std::string f = from;
      size_t prev = 0;
      for (size_t at = text.find(f); at != std::string::npos; at = text.find(f, prev)) {
        r.append(text, prev, at - prev);
        r += to;
        prev = at + f.size();
      }
      r.append(text, prev, std::string::npos);
      text.swap(r);
    }
  }
  return text;
}

}  // namespace failsafe
