#include "model/tokenizer.h"

#include <algorithm>
#include <filesystem>

#include "model/chat_template.h"
#include "model/file_util.h"
#include "model/hf_tokenizer.h"
#include "model/sentencepiece_tokenizer.h"
#include "model/tokenizer_config.h"

namespace failsafe {

namespace fs = std::filesystem;

Tokenizer::~Tokenizer() = default;

Result<std::unique_ptr<Tokenizer>> Tokenizer::Parse(std::string_view json_text,
                                                    const std::string& source) {
  FS_ASSIGN_OR_RETURN(auto t, HfTokenizer::Parse(json_text, source));
  return std::unique_ptr<Tokenizer>(std::move(t));
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::Load(const std::string& path) {
  if (fs::path(path).extension() == ".model") {
    std::error_code ec;
    if (!fs::is_regular_file(path, ec)) return NotFound("{}: no such file", path);
    FS_ASSIGN_OR_RETURN(auto t, SentencePieceTokenizer::Load(path));
    return std::unique_ptr<Tokenizer>(std::move(t));
  }
  FS_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  return Parse(text, path);
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::LoadDir(const std::string& dir) {
  std::error_code ec;
  auto exists = [&](const std::string& name) { return fs::is_regular_file(dir + "/" + name, ec); };
  std::unique_ptr<Tokenizer> t;
  if (exists("tokenizer.json")) {
    FS_ASSIGN_OR_RETURN(t, Load(dir + "/tokenizer.json"));
  } else if (exists("tokenizer.model")) {
    FS_ASSIGN_OR_RETURN(t, Load(dir + "/tokenizer.model"));
  } else {
    return NotFound("{}: no tokenizer.json or tokenizer.model", dir);
  }

  TokenizerConfig config;
  if (exists("tokenizer_config.json")) {
    const std::string path = dir + "/tokenizer_config.json";
    FS_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
    FS_ASSIGN_OR_RETURN(config, TokenizerConfig::Parse(text, path));
  }
  FS_RETURN_IF_ERROR(t->Configure(config));

  // Special token strings for templates: the config's, else the vocabulary's.
  auto token_text = [&](int id) { return id >= 0 ? t->Decode({id}) : std::string(); };
  SpecialTokenStrings& s = t->special_;
  s.bos = config.bos_token.value_or(token_text(t->bos_id_));
  s.eos = config.eos_token.value_or("");
  s.unk = config.unk_token.value_or("");
  s.pad = config.pad_token.value_or("");
  s.additional = config.additional_special_tokens;

  // Stop tokens: generation_config.json, config.json, the config's eos_token.
  std::vector<int>& stop = t->stop_ids_;
  for (const char* file : {"generation_config.json", "config.json"}) {
    if (!exists(file)) continue;
    const std::string path = dir + "/" + file;
    FS_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
    FS_ASSIGN_OR_RETURN(std::vector<int> ids, ParseTokenIdList(text, "eos_token_id", path));
    stop.insert(stop.end(), ids.begin(), ids.end());
  }
  if (config.eos_token) {
    const int id = t->TokenId(*config.eos_token);
    if (id < 0) {
      return InvalidArgument("{}/tokenizer_config.json: eos_token '{}' is not in the vocabulary",
                             dir, *config.eos_token);
    }
    stop.push_back(id);
  }
  for (int id : stop) {
    if (id >= t->vocab_size())
      return InvalidArgument("{}: stop token id {} is outside the vocabulary", dir, id);
  }
  std::sort(stop.begin(), stop.end());
  stop.erase(std::unique(stop.begin(), stop.end()), stop.end());
  if (s.eos.empty() && !stop.empty()) s.eos = t->Decode({stop.front()});

  // The chat template: tokenizer_config.json's, else chat_template.jinja
  // (or the older chat_template.json) beside it.
  std::string source = config.chat_template, origin = dir + "/tokenizer_config.json";
  if (source.empty() && exists("chat_template.jinja")) {
    origin = dir + "/chat_template.jinja";
    FS_ASSIGN_OR_RETURN(source, ReadFileToString(origin));
  } else if (source.empty() && exists("chat_template.json")) {
    origin = dir + "/chat_template.json";
    FS_ASSIGN_OR_RETURN(std::string text, ReadFileToString(origin));
    FS_ASSIGN_OR_RETURN(TokenizerConfig c, TokenizerConfig::Parse(text, origin));
    source = c.chat_template;
  }
  if (!source.empty()) {
    auto chat = ChatTemplate::Parse(source, origin + ": chat template");
    if (!chat.ok()) return chat.status();
    t->chat_template_ = std::move(chat).value();
  }
  return t;
}

StreamDecoder::StreamDecoder(const Tokenizer* tokenizer, bool skip_special,
                             const std::vector<int>& context)
    : tokenizer_(tokenizer), skip_special_(skip_special) {
  // A few tokens of context are enough for every decoder's look-behind.
  const size_t keep = std::min<size_t>(context.size(), 5);
  ids_.assign(context.end() - static_cast<ptrdiff_t>(keep), context.end());
  read_ = ids_.size();
}

namespace {
bool EndsWithReplacement(const std::string& s) {
  return s.size() >= 3 && s.compare(s.size() - 3, 3, "\xEF\xBF\xBD") == 0;
}
}  // namespace

std::string StreamDecoder::Add(int id) {
  ids_.push_back(id);
  const std::vector<int> before(ids_.begin() + static_cast<ptrdiff_t>(prefix_),
                                ids_.begin() + static_cast<ptrdiff_t>(read_));
  const std::vector<int> after(ids_.begin() + static_cast<ptrdiff_t>(prefix_), ids_.end());
  const std::string prefix_text = tokenizer_->Decode(before, skip_special_);
  const std::string text = tokenizer_->Decode(after, skip_special_);
  if (text.size() <= prefix_text.size() || EndsWithReplacement(text)) return {};
  prefix_ = read_;
  read_ = ids_.size();
  return text.substr(prefix_text.size());
}

std::string StreamDecoder::Finish() {
  const std::vector<int> before(ids_.begin() + static_cast<ptrdiff_t>(prefix_),
                                ids_.begin() + static_cast<ptrdiff_t>(read_));
  const std::vector<int> after(ids_.begin() + static_cast<ptrdiff_t>(prefix_), ids_.end());
  const std::string prefix_text = tokenizer_->Decode(before, skip_special_);
  const std::string text = tokenizer_->Decode(after, skip_special_);
  prefix_ = read_ = ids_.size();
  return text.size() > prefix_text.size() ? text.substr(prefix_text.size()) : std::string();
}

TokenTexts::TokenTexts(const Tokenizer* tokenizer, const std::vector<int32_t>& context)
    : tokenizer_(tokenizer) {
  const size_t keep = std::min<size_t>(context.size(), 4);
  window_.assign(context.end() - static_cast<ptrdiff_t>(keep), context.end());
}

std::string TokenTexts::Peek(int32_t id) {
  if (!base_ready_) {
    base_ = tokenizer_->Decode(window_, /*skip_special=*/false);
    base_ready_ = true;
  }
  std::vector<int> ids = window_;
  ids.push_back(id);
  const std::string text = tokenizer_->Decode(ids, /*skip_special=*/false);
  if (text.compare(0, base_.size(), base_) == 0) return text.substr(base_.size());
  return tokenizer_->DecodeOne(id, /*skip_special=*/false);
}

std::string TokenTexts::Next(int32_t id) {
  std::string text = Peek(id);
  window_.push_back(id);
  if (window_.size() > 4) window_.erase(window_.begin());
  base_ready_ = false;
  return text;
}

}  // namespace failsafe
