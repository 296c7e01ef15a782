#include "model/tokenizer_config.h"

#include <nlohmann/json.hpp>

namespace failsafe {

using nlohmann::json;

namespace {

// A special token: a string, or an AddedToken object {"content": ...}.
Result<std::optional<std::string>> TokenString(const json& j, const char* key,
                                               const std::string& source) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::optional<std::string>();
  if (it->is_string()) return std::optional<std::string>(it->get<std::string>());
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
    return std::optional<std::string>((*it)["content"].get<std::string>());
  return InvalidArgument("{}: field '{}' must be a string or {{\"content\": ...}}", source, key);
}

Result<std::optional<bool>> OptionalBool(const json& j, const char* key,
                                         const std::string& source) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::optional<bool>();
  if (!it->is_boolean())
    return InvalidArgument("{}: field '{}' must be true or false", source, key);
  return std::optional<bool>(it->get<bool>());
}

}  // namespace

Result<TokenizerConfig> TokenizerConfig::Parse(const std::string& text, const std::string& source) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return InvalidArgument("{}: not a JSON object", source);
  TokenizerConfig c;
  FS_ASSIGN_OR_RETURN(c.bos_token, TokenString(j, "bos_token", source));
  FS_ASSIGN_OR_RETURN(c.eos_token, TokenString(j, "eos_token", source));
  FS_ASSIGN_OR_RETURN(c.unk_token, TokenString(j, "unk_token", source));
  FS_ASSIGN_OR_RETURN(c.pad_token, TokenString(j, "pad_token", source));
  FS_ASSIGN_OR_RETURN(c.add_bos_token, OptionalBool(j, "add_bos_token", source));
  FS_ASSIGN_OR_RETURN(c.add_eos_token, OptionalBool(j, "add_eos_token", source));
  FS_ASSIGN_OR_RETURN(c.clean_up_tokenization_spaces,
                      OptionalBool(j, "clean_up_tokenization_spaces", source));
  if (auto it = j.find("additional_special_tokens"); it != j.end() && !it->is_null()) {
    if (!it->is_array())
      return InvalidArgument("{}: field 'additional_special_tokens' must be a list", source);
    for (const json& t : *it) {
      if (t.is_string()) {
        c.additional_special_tokens.push_back(t);
      } else if (t.is_object() && t.contains("content") && t["content"].is_string()) {
        c.additional_special_tokens.push_back(t["content"]);
      } else {
        return InvalidArgument("{}: field 'additional_special_tokens' has a malformed entry",
                               source);
      }
    }
  }
  if (auto it = j.find("chat_template"); it != j.end() && !it->is_null()) {
    if (it->is_string()) {
      c.chat_template = *it;
    } else if (it->is_array()) {
      // Named templates: [{"name": "default", "template": "..."}, ...]
      for (const json& t : *it) {
        if (!t.is_object() || !t.contains("name") || !t.contains("template") ||
            !t["name"].is_string() || !t["template"].is_string()) {
          return InvalidArgument("{}: field 'chat_template' has a malformed entry", source);
        }
        if (t["name"] == "default") c.chat_template = t["template"];
      }
      if (c.chat_template.empty())
        return InvalidArgument("{}: field 'chat_template' has no \"default\" template", source);
    } else {
      return InvalidArgument("{}: field 'chat_template' must be a string or a list", source);
    }
  }
  if (auto it = j.find("added_tokens_decoder"); it != j.end() && !it->is_null()) {
    if (!it->is_object())
      return InvalidArgument("{}: field 'added_tokens_decoder' must be an object", source);
    for (auto& [key, t] : it->items()) {
      AddedTokenSpec a;
      char* end = nullptr;
      const long id = std::strtol(key.c_str(), &end, 10);
      if (key.empty() || *end != '\0' || id < 0 || id > (1 << 24) || !t.is_object() ||
          !t.contains("content") || !t["content"].is_string() || t["content"] == "") {
        return InvalidArgument("{}: field 'added_tokens_decoder.{}' is malformed", source, key);
      }
      a.id = static_cast<int>(id);
      a.content = t["content"];
      for (auto [flag, dst] :
           {std::pair{"lstrip", &a.lstrip}, std::pair{"rstrip", &a.rstrip},
            std::pair{"normalized", &a.normalized}, std::pair{"special", &a.special}}) {
        if (t.contains(flag) && t[flag].is_boolean()) *dst = t[flag].get<bool>();
      }
      c.added_tokens_decoder.push_back(std::move(a));
    }
  }
  return c;
}

Result<std::vector<int>> ParseTokenIdList(const std::string& text, const char* key,
                                          const std::string& source) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded()) return InvalidArgument("{}: not valid JSON", source);
  if (!j.is_object()) return InvalidArgument("{}: expected a JSON object", source);
  std::vector<int> ids;
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return ids;
  auto add = [&](const json& v) -> Status {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > (1 << 24))
      return InvalidArgument("{}: field '{}' must be a token id or a list of them", source, key);
    ids.push_back(v.get<int>());
    return Status::Ok();
  };
  if (it->is_array()) {
    for (const json& v : *it) FS_RETURN_IF_ERROR(add(v));
  } else {
    FS_RETURN_IF_ERROR(add(*it));
  }
  return ids;
}

}  // namespace failsafe
