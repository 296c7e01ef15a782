#include "model/hf_decoder.h"

#include "common/utf8.h"
#include "model/hf_json.h"
#include "model/hf_pre_tokenizer.h"
#include "model/hf_regex.h"

namespace failsafe {

using nlohmann::json;

namespace {

using AddedSet = std::set<std::string, std::less<>>;

// Runs of byte-level tokens become bytes, read as UTF-8 (invalid parts
// become U+FFFD); added tokens stay as they are.
class ByteLevelDecoder : public HfDecoder {
 public:
  void Decode(std::vector<std::string>* tokens, const AddedSet& added) const override {
    std::vector<std::string> out;
    std::string bytes;
    bool have_bytes = false;
    auto flush = [&] {
      if (have_bytes) out.push_back(ToValidUtf8(bytes));
      bytes.clear();
      have_bytes = false;
    };
    for (std::string& t : *tokens) {
      if (added.count(t)) {
        flush();
        out.push_back(std::move(t));
        continue;
      }
      have_bytes = true;
      for (size_t i = 0; i < t.size();) {
        const int b = CodePointToByte(DecodeUtf8(t, &i));
        if (b >= 0) bytes.push_back(static_cast<char>(b));
      }
    }
    flush();
    tokens->swap(out);
  }
};

class ReplaceDecoder : public HfDecoder {
 public:
  std::unique_ptr<HfRegex> pattern;
  std::string content;
  void Decode(std::vector<std::string>* tokens, const AddedSet&) const override {
    for (std::string& t : *tokens) t = pattern->ReplaceAll(t, content);
  }
};

// Tokens "<0xAB>" are bytes; each run of them is read as UTF-8.
class ByteFallbackDecoder : public HfDecoder {
 public:
  void Decode(std::vector<std::string>* tokens, const AddedSet&) const override {
    std::vector<std::string> out;
    std::string run;
    bool in_run = false;
    for (std::string& t : *tokens) {
      int byte = -1;
      if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>') {
        auto hex = [](char c) {
          return c >= '0' && c <= '9'   ? c - '0'
                 : c >= 'A' && c <= 'F' ? c - 'A' + 10
                 : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                        : -1;
        };
        const int hi = hex(t[3]), lo = hex(t[4]);
        if (hi >= 0 && lo >= 0) byte = hi * 16 + lo;
      }
      if (byte >= 0) {
        run.push_back(static_cast<char>(byte));
        in_run = true;
        continue;
      }
      if (in_run) out.push_back(ToValidUtf8(run));
      run.clear();
      in_run = false;
      out.push_back(std::move(t));
    }
    if (in_run) out.push_back(ToValidUtf8(run));
    tokens->swap(out);
  }
};

class FuseDecoder : public HfDecoder {
 public:
  void Decode(std::vector<std::string>* tokens, const AddedSet&) const override {
    std::string all;
    for (const std::string& t : *tokens) all += t;
    tokens->assign(1, std::move(all));
  }
};

// Removes up to `start` leading and `stop` trailing copies of one character
// from every token.
class StripDecoder : public HfDecoder {
 public:
  std::string content;
  int start = 0, stop = 0;
  void Decode(std::vector<std::string>* tokens, const AddedSet&) const override {
    for (std::string& t : *tokens) {
      size_t b = 0, e = t.size();
      for (int k = 0; k < start && t.compare(b, content.size(), content) == 0; ++k)
        b += content.size();
      for (int k = 0; k < stop && e >= b + content.size() &&
                      t.compare(e - content.size(), content.size(), content) == 0;
           ++k) {
        e -= content.size();
      }
      t = t.substr(b, e - b);
    }
  }
};

class MetaspaceDecoder : public HfDecoder {
 public:
  std::string replacement = "\u2581";
  bool strip_first = true;  // prepend_scheme other than "never"
  void Decode(std::vector<std::string>* tokens, const AddedSet&) const override {
    for (size_t i = 0; i < tokens->size(); ++i) {
      std::string& t = (*tokens)[i];
      std::string r;
      for (size_t at = 0;;) {
        size_t next = t.find(replacement, at);
        r.append(t, at, next == std::string::npos ? std::string::npos : next - at);
        if (next == std::string::npos) break;
        r.push_back(' ');
        at = next + replacement.size();
      }
      if (i == 0 && strip_first && !r.empty() && r[0] == ' ') r.erase(0, 1);
      t = std::move(r);
    }
  }
};

class SequenceDecoder : public HfDecoder {
 public:
  std::vector<std::unique_ptr<HfDecoder>> parts;
  void Decode(std::vector<std::string>* tokens, const AddedSet& added) const override {
    for (const auto& p : parts) p->Decode(tokens, added);
  }
};

}  // namespace

Result<std::unique_ptr<HfDecoder>> HfDecoder::Parse(const json& j, const std::string& field) {
  FS_ASSIGN_OR_RETURN(const std::string type, ComponentType(j, field));
  if (type == "Sequence") {
    auto s = std::make_unique<SequenceDecoder>();
    FS_ASSIGN_OR_RETURN(s->parts, ParseParts<HfDecoder>(j, "decoders", field, Parse));
    return std::unique_ptr<HfDecoder>(std::move(s));
  }
  if (type == "ByteLevel") return std::unique_ptr<HfDecoder>(std::make_unique<ByteLevelDecoder>());
  if (type == "ByteFallback")
    return std::unique_ptr<HfDecoder>(std::make_unique<ByteFallbackDecoder>());
  if (type == "Fuse") return std::unique_ptr<HfDecoder>(std::make_unique<FuseDecoder>());
  if (type == "Replace") {
    auto r = std::make_unique<ReplaceDecoder>();
    FS_ASSIGN_OR_RETURN(r->pattern, ParseHfPattern(j.contains("pattern") ? j["pattern"] : json(),
                                                   field + ".pattern"));
    FS_ASSIGN_OR_RETURN(r->content, OptString(j, "content", "", field));
    return std::unique_ptr<HfDecoder>(std::move(r));
  }
  if (type == "Strip") {
    auto s = std::make_unique<StripDecoder>();
    FS_ASSIGN_OR_RETURN(s->content, OptString(j, "content", " ", field));
    if (s->content.empty()) return InvalidArgument("field '{}.content' must not be empty", field);
    FS_ASSIGN_OR_RETURN(int64_t start, OptInt(j, "start", 0, field));
    FS_ASSIGN_OR_RETURN(int64_t stop, OptInt(j, "stop", 0, field));
    if (start < 0 || stop < 0 || start > 1024 || stop > 1024)
      return InvalidArgument("field '{}': start and stop must be in [0, 1024]", field);
    s->start = static_cast<int>(start);
    s->stop = static_cast<int>(stop);
    return std::unique_ptr<HfDecoder>(std::move(s));
  }
  if (type == "Metaspace") {
    auto m = std::make_unique<MetaspaceDecoder>();
    FS_ASSIGN_OR_RETURN(MetaspaceSettings settings, ParseMetaspace(j, field));
    m->replacement = settings.replacement;
    m->strip_first = settings.scheme != MetaspaceSettings::Scheme::kNever;
    return std::unique_ptr<HfDecoder>(std::move(m));
  }
  return InvalidArgument("field '{}': unsupported decoder type '{}'", field, type);
}

}  // namespace failsafe
