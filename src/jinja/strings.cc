#include "jinja/strings.h"

#include <utf8proc.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "common/utf8.h"
#include "jinja/lexer.h"
#include "jinja/value.h"

namespace failsafe::jinja {

namespace {

std::vector<int> Decode(const std::string& s) {
  std::vector<int> cps;
  for (size_t i = 0; i < s.size();) {
    const int cp = DecodeUtf8(s, &i);
    cps.push_back(cp < 0 ? kReplacementChar : cp);
  }
  return cps;
}

std::string Encode(const std::vector<int>& cps) {
  std::string out;
  for (int cp : cps) AppendUtf8(cp, &out);
  return out;
}

bool IsCased(int cp) {
  const auto c = utf8proc_category(cp);
  return c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LL || c == UTF8PROC_CATEGORY_LT;
}

void AppendUpper(int cp, std::vector<int>* out) {
  if (cp == 0xDF) {  // ß has no one-character upper case
    out->push_back('S');
    out->push_back('S');
    return;
  }
  out->push_back(utf8proc_toupper(cp));
}

}  // namespace

std::string Lower(const std::string& s) {
  std::vector<int> cps = Decode(s);
  for (int& cp : cps) cp = utf8proc_tolower(cp);
  return Encode(cps);
}

std::string Upper(const std::string& s) {
  std::vector<int> out;
  for (int cp : Decode(s)) AppendUpper(cp, &out);
  return Encode(out);
}

std::string Capitalize(const std::string& s) {
  std::vector<int> cps = Decode(s);
  for (size_t i = 0; i < cps.size(); ++i)
    cps[i] = i == 0 ? utf8proc_totitle(cps[i]) : utf8proc_tolower(cps[i]);
  return Encode(cps);
}

std::string PythonTitle(const std::string& s) {
  std::vector<int> cps = Decode(s);
  bool previous_cased = false;
  for (int& cp : cps) {
    const bool cased = IsCased(cp);
    if (cased) cp = previous_cased ? utf8proc_tolower(cp) : utf8proc_totitle(cp);
    previous_cased = cased;
  }
  return Encode(cps);
}

// Jinja: words begin after runs of "-", whitespace, "(", "{", "[", "<";
// each word is its first character upper-cased and the rest lower-cased.
std::string JinjaTitle(const std::string& s) {
  std::vector<int> cps = Decode(s), out;
  bool start = true;
  for (int cp : cps) {
    const bool sep =
        cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || IsPythonSpace(cp);
    if (sep) {
      out.push_back(cp);
      start = true;
    } else if (start) {
      AppendUpper(cp, &out);
      start = false;
    } else {
      out.push_back(utf8proc_tolower(cp));
    }
  }
  return Encode(out);
}

std::string Strip(const std::string& s, const std::string* chars, bool left, bool right) {
  std::vector<int> cps = Decode(s);
  std::vector<int> set = chars ? Decode(*chars) : std::vector<int>();
  auto strip = [&](int cp) {
    return chars ? std::find(set.begin(), set.end(), cp) != set.end() : IsPythonSpace(cp);
  };
  size_t b = 0, e = cps.size();
  if (left)
    while (b < e && strip(cps[b])) ++b;
  if (right)
    while (e > b && strip(cps[e - 1])) --e;
  return Encode(std::vector<int>(cps.begin() + static_cast<ptrdiff_t>(b),
                                 cps.begin() + static_cast<ptrdiff_t>(e)));
}

std::vector<std::string> Split(const std::string& s, const std::string* sep, int64_t maxsplit,
                               bool right) {
  std::vector<std::string> out;
  if (maxsplit < 0) maxsplit = INT64_MAX;
  if (sep) {
    if (!right) {
      size_t start = 0;
      for (int64_t k = 0; k < maxsplit; ++k) {
        const size_t at = s.find(*sep, start);
        if (at == std::string::npos) break;
        out.push_back(s.substr(start, at - start));
        start = at + sep->size();
      }
      out.push_back(s.substr(start));
      return out;
    }
    size_t end = s.size();
    for (int64_t k = 0; k < maxsplit && end >= sep->size(); ++k) {
      const size_t at = s.rfind(*sep, end - sep->size());
      if (at == std::string::npos) break;
      out.push_back(s.substr(at + sep->size(), end - at - sep->size()));
      end = at;
    }
    out.push_back(s.substr(0, end));
    std::reverse(out.begin(), out.end());
    return out;
  }
  // Runs of whitespace; no empty strings.
  std::vector<int> cps = Decode(s);
  std::vector<std::pair<size_t, size_t>> words;
  for (size_t i = 0; i < cps.size();) {
    while (i < cps.size() && IsPythonSpace(cps[i])) ++i;
    if (i >= cps.size()) break;
    size_t j = i;
    while (j < cps.size() && !IsPythonSpace(cps[j])) ++j;
    words.emplace_back(i, j);
    i = j;
  }
  auto piece = [&](size_t b, size_t e) {
    return Encode(std::vector<int>(cps.begin() + static_cast<ptrdiff_t>(b),
                                   cps.begin() + static_cast<ptrdiff_t>(e)));
  };
  // (maxsplit may be INT64_MAX: compare without adding to it.)
  if (words.empty() || static_cast<int64_t>(words.size()) - 1 <= maxsplit) {
    for (auto [b, e] : words) out.push_back(piece(b, e));
    return out;
  }
  if (!right) {
    for (int64_t k = 0; k < maxsplit; ++k) out.push_back(piece(words[k].first, words[k].second));
    size_t rest = words[maxsplit].first;
    size_t end = cps.size();
    out.push_back(piece(rest, end));
    // Trailing whitespace of the remainder is kept, as Python does.
    return out;
  }
  const size_t n = words.size();
  std::vector<std::string> tail;
  for (int64_t k = 0; k < maxsplit; ++k)
    tail.push_back(piece(words[n - 1 - k].first, words[n - 1 - k].second));
  out.push_back(piece(0, words[n - 1 - maxsplit].second));
  out.insert(out.end(), tail.rbegin(), tail.rend());
  return out;
}

std::vector<std::string> SplitLines(const std::string& s, bool keepends) {
  std::vector<int> cps = Decode(s);
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t i = 0; i < cps.size(); ++i) {
    const int c = cps[i];
    const bool brk = c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D ||
                     c == 0x1E || c == 0x85 || c == 0x2028 || c == 0x2029;
    if (!brk) continue;
    size_t end = i + 1;
    if (c == '\r' && i + 1 < cps.size() && cps[i + 1] == '\n') end = i + 2;
    out.push_back(
        Encode(std::vector<int>(cps.begin() + static_cast<ptrdiff_t>(start),
                                cps.begin() + static_cast<ptrdiff_t>(keepends ? end : i))));
    start = end;
    i = end - 1;
  }
  if (start < cps.size())
    out.push_back(Encode(std::vector<int>(cps.begin() + static_cast<ptrdiff_t>(start), cps.end())));
  return out;
}

std::string Replace(const std::string& s, const std::string& old, const std::string& with,
                    int64_t count) {
  if (count < 0) count = INT64_MAX;
  std::string out;
  if (old.empty()) {  // between every character, and at both ends
    auto cps = CodePoints(s);
    int64_t done = 0;
    for (std::string_view c : cps) {
      if (done++ < count) out += with;
      out.append(c);
    }
    if (done < count) out += with;
    return out;
  }
  size_t prev = 0;
  for (int64_t k = 0; k < count; ++k) {
    const size_t at = s.find(old, prev);
    if (at == std::string::npos) break;
    out.append(s, prev, at - prev);
    out += with;
    prev = at + old.size();
  }
  out.append(s, prev, std::string::npos);
  return out;
}

std::string HtmlEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

std::string Indent(const std::string& s, const std::string& pad, bool first, bool blank) {
  const std::vector<std::string> lines = SplitLines(s + "\n", false);
  std::string rv;
  if (blank) {
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i) rv += "\n" + pad;
      rv += lines[i];
    }
  } else {
    rv = lines.empty() ? "" : lines[0];
    for (size_t i = 1; i < lines.size(); ++i) rv += "\n" + (lines[i].empty() ? "" : pad) + lines[i];
  }
  return first ? pad + rv : rv;
}

std::string Center(const std::string& s, int64_t width) {
  const int64_t n = static_cast<int64_t>(CodePoints(s).size());
  if (width <= n) return s;
  const int64_t total = width - n;
  // As str.center: the odd space goes left when the width is odd.
  const int64_t left = total / 2 + (total & width & 1);
  return std::string(static_cast<size_t>(left), ' ') + s +
         std::string(static_cast<size_t>(total - left), ' ');
}

int64_t WordCount(const std::string& s) {
  // Jinja counts \w+ runs.
  int64_t n = 0;
  bool in = false;
  for (int cp : Decode(s)) {
    const auto c = utf8proc_category(cp);
    const bool word = cp == '_' || (c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO) ||
                      c == UTF8PROC_CATEGORY_ND || c == UTF8PROC_CATEGORY_NL ||
                      c == UTF8PROC_CATEGORY_NO || c == UTF8PROC_CATEGORY_MN ||
                      c == UTF8PROC_CATEGORY_MC;
    if (word && !in) ++n;
    in = word;
  }
  return n;
}

std::optional<double> ParseFloat(const std::string& s) {
  std::string t;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '_' && i > 0 && i + 1 < s.size() &&
        std::isdigit(static_cast<unsigned char>(s[i - 1])) &&
        std::isdigit(static_cast<unsigned char>(s[i + 1])))
      continue;
    t.push_back(s[i]);
  }
  if (t.empty()) return std::nullopt;
  std::string lower = Lower(t);
  const size_t sign = lower[0] == '+' || lower[0] == '-' ? 1 : 0;
  const std::string body = lower.substr(sign);
  if (body == "inf" || body == "infinity" || body == "nan") {
    const double v = body == "nan" ? NAN : INFINITY;
    return lower[0] == '-' ? -v : v;
  }
  // Only digits, one '.', an exponent: what Python accepts.
  bool digits = false, dot = false, exp = false;
  for (size_t i = sign; i < lower.size(); ++i) {
    const char c = lower[i];
    if (std::isdigit(static_cast<unsigned char>(c))) {
      digits = true;
    } else if (c == '.' && !dot && !exp) {
      dot = true;
    } else if (c == 'e' && digits && !exp) {
      exp = true;
      digits = false;
      if (i + 1 < lower.size() && (lower[i + 1] == '+' || lower[i + 1] == '-')) ++i;
    } else {
      return std::nullopt;
    }
  }
  if (!digits) return std::nullopt;
  return std::strtod(lower.c_str(), nullptr);
}

int64_t CodePointIndex(const std::string& s, size_t byte_offset) {
  return static_cast<int64_t>(CountCodePoints(std::string_view(s).substr(0, byte_offset)));
}

}  // namespace failsafe::jinja
