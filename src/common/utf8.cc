#include "common/utf8.h"

namespace failsafe {

int DecodeUtf8(std::string_view s, size_t* i) {
  const size_t n = s.size();
  const unsigned char c = static_cast<unsigned char>(s[*i]);
  if (c < 0x80) {
    ++*i;
    return c;
  }
  int need = 0, cp = 0;
  unsigned char lower = 0x80, upper = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    need = 1;
    cp = c & 0x1F;
  } else if (c >= 0xE0 && c <= 0xEF) {
    need = 2;
    cp = c & 0x0F;
    if (c == 0xE0) lower = 0xA0;  // no overlong forms
    if (c == 0xED) upper = 0x9F;  // no surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    need = 3;
    cp = c & 0x07;
    if (c == 0xF0) lower = 0x90;
    if (c == 0xF4) upper = 0x8F;  // nothing above U+10FFFF
  } else {
    ++*i;
    return -1;
  }
  size_t j = *i + 1;
  for (int k = 0; k < need; ++k, ++j) {
    if (j >= n) {
      *i = j;
      return -1;
    }
    const unsigned char d = static_cast<unsigned char>(s[j]);
    if (d < lower || d > upper) {
      *i = j;  // the offending byte starts the next sequence
      return -1;
    }
    lower = 0x80;
    upper = 0xBF;
    cp = (cp << 6) | (d & 0x3F);
  }
  *i = j;
  return cp;
}

void AppendUtf8(int cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  }
}

bool IsValidUtf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    if (DecodeUtf8(s, &i) < 0) return false;
  }
  return true;
}

std::string ToValidUtf8(std::string_view s) {
  if (IsValidUtf8(s)) return std::string(s);
  std::string out;
  out.reserve(s.size() + 8);
  for (size_t i = 0; i < s.size();) {
    const size_t start = i;
    const int cp = DecodeUtf8(s, &i);
    if (cp < 0) {
      AppendUtf8(kReplacementChar, &out);
    } else {
      out.append(s.substr(start, i - start));
    }
  }
  return out;
}

size_t IncompleteUtf8Suffix(std::string_view s) {
  const size_t n = s.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const unsigned char c = static_cast<unsigned char>(s[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte: look further back
    const size_t need = (c >= 0xC2 && c <= 0xDF)   ? 2
                        : (c >= 0xE0 && c <= 0xEF) ? 3
                        : (c >= 0xF0 && c <= 0xF4) ? 4
                                                   : 1;
    if (need <= back) return 0;
    // Only a prefix that could still become valid is held back.
    size_t i = n - back;
    if (DecodeUtf8(s, &i) < 0 && i == n) return back;
    return 0;
  }
  return 0;
}

std::string_view TrimStartIf(std::string_view s, bool (*pred)(int cp)) {
  size_t i = 0;
  while (i < s.size()) {
    size_t next = i;
    if (!pred(DecodeUtf8(s, &next))) break;
    i = next;
  }
  return s.substr(i);
}

std::string_view TrimEndIf(std::string_view s, bool (*pred)(int cp)) {
  size_t end = s.size();
  while (end > 0) {
    size_t start = end - 1;
    while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    size_t i = start;
    if (!pred(DecodeUtf8(s, &i))) break;
    end = start;
  }
  return s.substr(0, end);
}

size_t CountCodePoints(std::string_view s) {
  size_t count = 0;
  for (unsigned char c : s) count += (c & 0xC0) != 0x80;
  return count;
}

}  // namespace failsafe
