#include "router/chunk_edit.h"

#include <cctype>
#include <cstdlib>

namespace failsafe {

namespace {

constexpr std::string_view kTokenIds = "\"token_ids\":[";

// The end of the JSON string that starts at s[i] == '"' (one past its
// closing quote), or npos.
size_t StringEnd(std::string_view s, size_t i) {
  for (size_t j = i + 1; j < s.size(); ++j) {
    if (s[j] == '\\') {
      ++j;
    } else if (s[j] == '"') {
      return j + 1;
    }
  }
  return std::string_view::npos;
}

// Where the value of top-level member `key` starts and ends ([begin, end)),
// for a string value; false when absent or not a string.
bool FindTopLevelString(std::string_view s, std::string_view key, size_t* begin, size_t* end) {
  int depth = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '"') {
      const size_t e = StringEnd(s, i);
      if (e == std::string_view::npos) return false;
      // A key of the top-level object: "key" then ':'.
      if (depth == 1 && e < s.size() && s[e] == ':' && s.substr(i + 1, e - i - 2) == key) {
        const size_t v = e + 1;
        if (v >= s.size() || s[v] != '"') return false;
        const size_t ve = StringEnd(s, v);
        if (ve == std::string_view::npos) return false;
        *begin = v;
        *end = ve;
        return true;
      }
      i = e - 1;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if (c == '}' || c == ']') {
      if (--depth <= 0) return false;  // the top-level value ended
    }
  }
  return false;
}

}  // namespace

std::optional<int> AppendChunkTokenIds(std::string_view chunk, std::vector<int32_t>* out) {
  int n = 0;
  for (size_t at = chunk.find(kTokenIds); at != std::string_view::npos;
       at = chunk.find(kTokenIds, at + 1)) {
    size_t i = at + kTokenIds.size();
    while (i < chunk.size() && chunk[i] != ']') {
      if (chunk[i] == ',' || chunk[i] == ' ') {
        ++i;
        continue;
      }
      int64_t v = 0;
      size_t digits = 0;
      for (; i < chunk.size() && chunk[i] >= '0' && chunk[i] <= '9'; ++i, ++digits) {
        v = v * 10 + (chunk[i] - '0');
        if (v > INT32_MAX) return std::nullopt;
      }
      if (digits == 0) return std::nullopt;
      out->push_back(static_cast<int32_t>(v));
      ++n;
    }
    if (i >= chunk.size()) return std::nullopt;
  }
  return n;
}

void StripTokenIds(std::string* chunk) {
  size_t from = 0;
  for (size_t at = chunk->find(kTokenIds); at != std::string::npos;
       at = chunk->find(kTokenIds, from)) {
    // Only a flat list of integers (what a node sends); anything else stays.
    size_t end = at + kTokenIds.size();
    while (end < chunk->size() && (std::isdigit(static_cast<unsigned char>((*chunk)[end])) ||
                                   (*chunk)[end] == ',' || (*chunk)[end] == ' ')) {
      ++end;
    }
    if (end >= chunk->size() || (*chunk)[end] != ']') {
      from = at + 1;
      continue;
    }
    ++end;
    if (at > 0 && (*chunk)[at - 1] == ',') {
      --at;  // ,"token_ids":[...]
    } else if (end < chunk->size() && (*chunk)[end] == ',') {
      ++end;  // {"token_ids":[...],
    }
    chunk->erase(at, end - at);
    from = at;
  }
}

std::optional<std::string> TopLevelString(std::string_view chunk, std::string_view key) {
  size_t b = 0, e = 0;
  if (!FindTopLevelString(chunk, key, &b, &e)) return std::nullopt;
  return std::string(chunk.substr(b, e - b));
}

bool ReplaceTopLevelString(std::string* chunk, std::string_view key, std::string_view literal) {
  size_t b = 0, e = 0;
  if (!FindTopLevelString(*chunk, key, &b, &e)) return false;
  chunk->replace(b, e - b, literal);
  return true;
}

}  // namespace failsafe
