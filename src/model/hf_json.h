// Checked readers for optional tokenizer.json fields: a field of the wrong
// type is an error naming it, never an exception or a silent default.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

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

}  // namespace failsafe
