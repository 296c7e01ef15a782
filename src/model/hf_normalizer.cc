#include "model/hf_normalizer.h"

#include <utf8proc.h>

#include <vector>

#include "common/utf8.h"
#include "model/hf_json.h"
#include "model/hf_regex.h"

namespace failsafe {

using nlohmann::json;

bool IsTrimmableSpace(int cp) {
  switch (cp) {
    case 0x09:
    case 0x0A:
    case 0x0B:
    case 0x0C:
    case 0x0D:
    case 0x20:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
    case 0xFEFF:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

std::string_view TrimStart(std::string_view s) { return TrimStartIf(s, IsTrimmableSpace); }
std::string_view TrimEnd(std::string_view s) { return TrimEndIf(s, IsTrimmableSpace); }

namespace {

class SequenceNormalizer : public HfNormalizer {
 public:
  std::vector<std::unique_ptr<HfNormalizer>> parts;
  std::string Normalize(std::string text) const override {
    for (const auto& p : parts) text = p->Normalize(std::move(text));
    return text;
  }
};

// Prepends only to non-empty text (as the Rust library does).
class PrependNormalizer : public HfNormalizer {
 public:
  std::string prepend;
  std::string Normalize(std::string text) const override {
    return text.empty() ? text : prepend + text;
  }
};

class ReplaceNormalizer : public HfNormalizer {
 public:
  std::unique_ptr<HfRegex> pattern;
  std::string content;
  std::string Normalize(std::string text) const override {
    return pattern->ReplaceAll(text, content);
  }
};

class UnicodeNormalizer : public HfNormalizer {
 public:
  utf8proc_option_t options;
  std::string Normalize(std::string text) const override {
    utf8proc_uint8_t* out = nullptr;
    utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                                      static_cast<utf8proc_ssize_t>(text.size()), &out, options);
    if (n < 0) return text;  // unreachable for valid UTF-8
    std::string r(reinterpret_cast<char*>(out), static_cast<size_t>(n));
    std::free(out);
    return r;
  }
};

class StripNormalizer : public HfNormalizer {
 public:
  bool left = false, right = false;
  std::string Normalize(std::string text) const override {
    std::string_view v = text;
    if (left) v = TrimStart(v);
    if (right) v = TrimEnd(v);
    return std::string(v);
  }
};

}  // namespace

Result<std::unique_ptr<HfNormalizer>> HfNormalizer::Parse(const json& j, const std::string& field) {
  FS_ASSIGN_OR_RETURN(const std::string type, ComponentType(j, field));
  if (type == "Sequence") {
    auto n = std::make_unique<SequenceNormalizer>();
    FS_ASSIGN_OR_RETURN(n->parts, ParseParts<HfNormalizer>(j, "normalizers", field, Parse));
    return std::unique_ptr<HfNormalizer>(std::move(n));
  }
  if (type == "Prepend") {
    if (!j.contains("prepend") || !j["prepend"].is_string())
      return InvalidArgument("field '{}.prepend' is missing", field);
    auto n = std::make_unique<PrependNormalizer>();
    n->prepend = j["prepend"];
    return std::unique_ptr<HfNormalizer>(std::move(n));
  }
  if (type == "Replace") {
    auto n = std::make_unique<ReplaceNormalizer>();
    FS_ASSIGN_OR_RETURN(n->pattern, ParseHfPattern(j.contains("pattern") ? j["pattern"] : json(),
                                                   field + ".pattern"));
    if (!j.contains("content") || !j["content"].is_string())
      return InvalidArgument("field '{}.content' is missing", field);
    n->content = j["content"];
    return std::unique_ptr<HfNormalizer>(std::move(n));
  }
  if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
    auto n = std::make_unique<UnicodeNormalizer>();
    int o = UTF8PROC_STABLE |
            (type[2] == 'C' || type[3] == 'C' ? UTF8PROC_COMPOSE : UTF8PROC_DECOMPOSE);
    if (type[2] == 'K') o |= UTF8PROC_COMPAT;
    n->options = static_cast<utf8proc_option_t>(o);
    return std::unique_ptr<HfNormalizer>(std::move(n));
  }
  if (type == "Strip") {
    auto n = std::make_unique<StripNormalizer>();
    FS_ASSIGN_OR_RETURN(n->left, OptBool(j, "strip_left", false, field));
    FS_ASSIGN_OR_RETURN(n->right, OptBool(j, "strip_right", false, field));
    return std::unique_ptr<HfNormalizer>(std::move(n));
  }
  return InvalidArgument("field '{}': unsupported normalizer type '{}'", field, type);
}

}  // namespace failsafe
