// Checked readers for optional tokenizer.json fields: a field of the wrong
// type is an error naming it, never an exception or a silent default.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/status.h"

namespace failsafe {

// `j[key]` if present and not null, else `fallback`.
inline Result<bool> OptBool(const nlohmann::json& j, const char* key, bool fallback,
                            const std::string& field) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) return InvalidArgument("field '{}.{}' must be true or false", field, key);
  return it->get<bool>();
}

inline Result<std::string> OptString(const nlohmann::json& j, const char* key,
                                     const std::string& fallback, const std::string& field) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_string()) return InvalidArgument("field '{}.{}' must be a string", field, key);
  return it->get<std::string>();
}

inline Result<int64_t> OptInt(const nlohmann::json& j, const char* key, int64_t fallback,
                              const std::string& field) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_number_integer())
    return InvalidArgument("field '{}.{}' must be an integer", field, key);
  return it->get<int64_t>();
}

// The "type" of a component object (a normalizer, pre-tokenizer, decoder).
inline Result<std::string> ComponentType(const nlohmann::json& j, const std::string& field) {
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string())
    return InvalidArgument("field '{}' is malformed", field);
  return j["type"].get<std::string>();
}

// The parts of a "Sequence" component: j[key] parsed item by item with
// parse(item, "field.key[i]").
template <typename T, typename ParseFn>
Result<std::vector<std::unique_ptr<T>>> ParseParts(const nlohmann::json& j, const char* key,
                                                   const std::string& field, ParseFn parse) {
  if (!j.contains(key) || !j[key].is_array())
    return InvalidArgument("field '{}.{}' is missing", field, key);
  std::vector<std::unique_ptr<T>> parts;
  int i = 0;
  for (const nlohmann::json& p : j[key]) {
    FS_ASSIGN_OR_RETURN(auto part, parse(p, fmt::format("{}.{}[{}]", field, key, i++)));
    parts.push_back(std::move(part));
  }
  return parts;
}

}  // namespace failsafe
