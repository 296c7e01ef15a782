#include "model/hf_regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

namespace failsafe {

struct HfRegex::Code {
  pcre2_code* code = nullptr;
  ~Code() { pcre2_code_free(code); }
};

HfRegex::~HfRegex() = default;

Result<std::unique_ptr<HfRegex>> HfRegex::Compile(const std::string& pattern,
                                                  const std::string& field) {
  int err = 0;
  PCRE2_SIZE off = 0;
  pcre2_code* code = pcre2_compile(
      reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
      PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF | PCRE2_DOLLAR_ENDONLY, &err, &off, nullptr);
  if (!code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    return InvalidArgument("field '{}': regex does not compile at offset {}: {}", field, off,
                           reinterpret_cast<char*>(msg));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter on failure
  auto r = std::unique_ptr<HfRegex>(new HfRegex());
  r->code_ = std::make_unique<Code>();
  r->code_->code = code;
  return r;
}

Result<std::unique_ptr<HfRegex>> HfRegex::Literal(const std::string& text,
                                                  const std::string& field) {
  if (text.empty()) return InvalidArgument("field '{}': empty pattern", field);
  auto r = std::unique_ptr<HfRegex>(new HfRegex());
  r->literal_ = text;
  return r;
}

std::vector<std::pair<size_t, size_t>> HfRegex::FindAll(std::string_view text) const {
  std::vector<std::pair<size_t, size_t>> out;
  ForEach(text, [&](size_t b, size_t e) {
    out.emplace_back(b, e);
    return true;
  });
  return out;
}

void HfRegex::ForEach(std::string_view text, const std::function<bool(size_t, size_t)>& fn) const {
  if (!literal_.empty()) {
    for (size_t at = text.find(literal_); at != std::string_view::npos;
         at = text.find(literal_, at + literal_.size())) {
      if (!fn(at, at + literal_.size())) return;
    }
    return;
  }
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_->code, nullptr);
  size_t pos = 0;
  while (pos <= text.size()) {
    int rc = pcre2_match(code_->code, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), pos,
                         0, md, nullptr);
    if (rc < 0) break;
    PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t b = ov[0], e = ov[1];
    if (!fn(b, e)) break;
    if (e == b) {  // empty match: step over one code point
      pos = b + 1;
      while (pos < text.size() && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80) ++pos;
    } else {
      pos = e;
    }
  }
  pcre2_match_data_free(md);
}

std::string HfRegex::ReplaceAll(std::string_view text, std::string_view with) const {
  std::string out;
  size_t prev = 0;
  for (auto [b, e] : FindAll(text)) {
    out.append(text.substr(prev, b - prev));
    out.append(with);
    prev = e;
  }
  out.append(text.substr(prev));
  return out;
}

Result<std::unique_ptr<HfRegex>> ParseHfPattern(const nlohmann::json& j, const std::string& field) {
  if (j.is_object() && j.contains("String") && j["String"].is_string())
    return HfRegex::Literal(j["String"].get<std::string>(), field);
  if (j.is_object() && j.contains("Regex") && j["Regex"].is_string())
    return HfRegex::Compile(j["Regex"].get<std::string>(), field);
  return InvalidArgument("field '{}' must be {{\"String\": ...}} or {{\"Regex\": ...}}", field);
}

}  // namespace failsafe
