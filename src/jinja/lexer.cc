#include "jinja/lexer.h"

#include <cctype>
#include <cerrno>
#include <cstring>

#include "common/utf8.h"

namespace failsafe::jinja {

bool IsPythonSpace(int cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
         cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

namespace {

using Type = Token::Type;

// Python's str.rstrip() with no argument.
std::string_view RStripSpace(std::string_view s) { return TrimEndIf(s, IsPythonSpace); }

// Length of the run of Python whitespace at s[pos...].
size_t SpaceRun(std::string_view s, size_t pos) {
  return s.size() - pos - TrimStartIf(s.substr(pos), IsPythonSpace).size();
}

bool AllSpace(std::string_view s) { return !s.empty() && SpaceRun(s, 0) == s.size(); }

// A string literal's body, decoded as Python's "unicode-escape" codec does
// after Jinja has protected non-ASCII characters.
std::string DecodeString(std::string_view body) {
  std::string out;
  for (size_t i = 0; i < body.size(); ++i) {
    const char c = body[i];
    if (c != '\\' || i + 1 >= body.size()) {
      out.push_back(c);
      continue;
    }
    const char e = body[++i];
    auto hex = [&](int digits) -> int {
      int v = 0;
      for (int k = 1; k <= digits; ++k) {
        if (i + k >= body.size() || !std::isxdigit(static_cast<unsigned char>(body[i + k])))
          return -1;
        const char h = body[i + k];
        v = v * 16 + (h <= '9' ? h - '0' : (h | 0x20) - 'a' + 10);
      }
      i += digits;
      return v;
    };
    switch (e) {
      case '\n':
        break;  // line continuation
      case '\\':
        out.push_back('\\');
        break;
      case '\'':
        out.push_back('\'');
        break;
      case '"':
        out.push_back('"');
        break;
      case 'a':
        out.push_back('\a');
        break;
      case 'b':
        out.push_back('\b');
        break;
      case 'f':
        out.push_back('\f');
        break;
      case 'n':
        out.push_back('\n');
        break;
      case 'r':
        out.push_back('\r');
        break;
      case 't':
        out.push_back('\t');
        break;
      case 'v':
        out.push_back('\v');
        break;
      case 'x':
      case 'u':
      case 'U': {
        const int v = hex(e == 'x' ? 2 : e == 'u' ? 4 : 8);
        if (v < 0 || v > 0x10FFFF) {
          out.push_back('\\');
          out.push_back(e);
        } else {
          AppendUtf8(v, &out);
        }
        break;
      }
      default:
        if (e >= '0' && e <= '7') {
          int v = e - '0';
          for (int k = 0; k < 2 && i + 1 < body.size() && body[i + 1] >= '0' && body[i + 1] <= '7';
               ++k)
            v = v * 8 + (body[++i] - '0');
          AppendUtf8(v, &out);
        } else {
          out.push_back('\\');  // unknown escapes stay as written
          out.push_back(e);
        }
    }
  }
  return out;
}

bool IsNameStart(unsigned char c) { return std::isalpha(c) || c == '_' || c >= 0x80; }
bool IsNameChar(unsigned char c) { return std::isalnum(c) || c == '_' || c >= 0x80; }

class Lexer {
 public:
  explicit Lexer(std::string source) : s_(std::move(source)) {}

  Result<std::vector<Token>> Run() {
    bool line_starting = true;
    size_t pos = 0;
    while (pos < s_.size()) {
      const size_t start = FindOpener(pos);
      if (start == std::string::npos) {
        Emit(Type::kData, s_.substr(pos));
        break;
      }
      const char kind = s_[start + 1];  // '{', '%' or '#'
      char sign = s_[start + 2];
      if (sign != '-' && sign != '+') sign = 0;
      size_t p = start + 2 + (sign ? 1 : 0);
      const bool raw = kind == '%' && MatchRaw(p, "raw") != std::string::npos;
      std::string text = s_.substr(pos, start - pos);
      StripBefore(&text, sign, kind != '{', line_starting);
      Emit(Type::kData, text);
      line_ += Lines(s_.substr(pos, start - pos));
      if (kind == '#') {
        FS_ASSIGN_OR_RETURN(pos, EndComment(p, &line_starting));
      } else if (raw) {
        const size_t body = MatchRaw(p, "raw");
        line_starting = s_[body - 1] == '\n';
        FS_ASSIGN_OR_RETURN(pos, Raw(body, &line_starting));
      } else {
        FS_ASSIGN_OR_RETURN(pos, Tag(kind, p, &line_starting));
      }
    }
    tokens_.push_back({Type::kEof, "", line_});
    return std::move(tokens_);
  }

 private:
  size_t FindOpener(size_t pos) const {
    for (size_t i = s_.find('{', pos); i != std::string::npos; i = s_.find('{', i + 1)) {
      if (i + 1 < s_.size() && (s_[i + 1] == '{' || s_[i + 1] == '%' || s_[i + 1] == '#')) return i;
    }
    return std::string::npos;
  }

  static int Lines(std::string_view t) {
    int n = 0;
    for (char c : t) n += c == '\n';
    return n;
  }

  void Emit(Type type, std::string text) {
    if (type == Type::kData && text.empty()) return;
    tokens_.push_back({type, std::move(text), line_});
  }

  // "-" strips all whitespace before the tag; lstrip_blocks strips the
  // indentation of a block or comment tag alone at the start of its line.
  static void StripBefore(std::string* text, char sign, bool block_or_comment, bool line_starting) {
    if (sign == '-') {
      *text = std::string(RStripSpace(*text));
    } else if (sign != '+' && block_or_comment) {
      const size_t l_pos = text->rfind('\n') + 1;  // npos + 1 == 0
      if ((l_pos > 0 || line_starting) && AllSpace(std::string_view(*text).substr(l_pos)))
        text->resize(l_pos);
    }
  }

  // After "{%" and its sign: `\s* word \s* (-%}|+%}|%})`; returns the end
  // of the tag (after trim_blocks' newline or "-"'s whitespace), or npos.
  size_t MatchRaw(size_t p, const char* word) const {
    p += SpaceRun(s_, p);
    const std::string w = word;
    if (s_.compare(p, w.size(), w) != 0) return std::string::npos;
    p += w.size();
    if (p < s_.size() && IsNameChar(static_cast<unsigned char>(s_[p]))) return std::string::npos;
    p += SpaceRun(s_, p);
    return BlockEnd(p, '%');
  }

  // A tag end at p: "+X}", "-X}" + whitespace, or "X}" (+ "\n" for blocks
  // and comments: trim_blocks). Returns the position after it, or npos.
  size_t BlockEnd(size_t p, char x) const {
    const std::string end = std::string(1, x) + "}";
    if (x != '}' && s_.compare(p, 3, "+" + end) == 0) return p + 3;
    if (s_.compare(p, 3, "-" + end) == 0) return p + 3 + SpaceRun(s_, p + 3);
    if (s_.compare(p, 2, end) == 0) {
      p += 2;
      if (x != '}' && p < s_.size() && s_[p] == '\n') ++p;
      return p;
    }
    return std::string::npos;
  }

  Result<size_t> EndComment(size_t p, bool* line_starting) {
    for (size_t i = p; i < s_.size(); ++i) {
      const size_t end = BlockEnd(i, '#');
      if (end == std::string::npos) continue;
      line_ += Lines(s_.substr(p, end - p));
      *line_starting = s_[end - 1] == '\n';
      return end;
    }
    return InvalidArgument("line {}: missing end of comment tag", line_);
  }

  // Text up to {% endraw %}, with the same whitespace control as any tag.
  Result<size_t> Raw(size_t p, bool* line_starting) {
    for (size_t i = s_.find("{%", p); i != std::string::npos; i = s_.find("{%", i + 1)) {
      char sign = s_[i + 2];
      if (sign != '-' && sign != '+') sign = 0;
      const size_t end = MatchRaw(i + 2 + (sign ? 1 : 0), "endraw");
      if (end == std::string::npos) continue;
      std::string text = s_.substr(p, i - p);
      StripBefore(&text, sign, true, *line_starting);
      Emit(Type::kData, text);
      line_ += Lines(s_.substr(p, end - p));
      *line_starting = s_[end - 1] == '\n';
      return end;
    }
    return InvalidArgument("line {}: missing end of raw directive", line_);
  }

  Result<size_t> Tag(char kind, size_t p, bool* line_starting) {
    Emit(kind == '{' ? Type::kVarBegin : Type::kBlockBegin, "");
    std::vector<char> balance;
    while (true) {
      const size_t ws = SpaceRun(s_, p);
      line_ += Lines(s_.substr(p, ws));
      p += ws;
      if (p >= s_.size()) return InvalidArgument("line {}: unexpected end of template", line_);
      if (balance.empty()) {
        const size_t end = BlockEnd(p, kind == '{' ? '}' : '%');
        if (end != std::string::npos) {
          line_ += Lines(s_.substr(p, end - p));
          Emit(kind == '{' ? Type::kVarEnd : Type::kBlockEnd, "");
          *line_starting = s_[end - 1] == '\n';
          return end;
        }
      }
      FS_ASSIGN_OR_RETURN(p, Lex(p, &balance));
    }
  }

  // One token inside a tag.
  Result<size_t> Lex(size_t p, std::vector<char>* balance) {
    const unsigned char c = static_cast<unsigned char>(s_[p]);
    if (std::isdigit(c)) return Number(p);
    if (IsNameStart(c)) {
      size_t e = p;
      while (e < s_.size() && IsNameChar(static_cast<unsigned char>(s_[e]))) ++e;
      Emit(Type::kName, s_.substr(p, e - p));
      return e;
    }
    if (c == '\'' || c == '"') {
      size_t e = p + 1;
      while (e < s_.size() && s_[e] != static_cast<char>(c)) e += s_[e] == '\\' ? 2 : 1;
      if (e >= s_.size()) return InvalidArgument("line {}: unterminated string", line_);
      Emit(Type::kString, DecodeString(std::string_view(s_).substr(p + 1, e - p - 1)));
      line_ += Lines(s_.substr(p, e - p));
      return e + 1;
    }
    static const char* kOps[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/",
                                 "*",  "%",  "~",  "[",  "]",  "(",  ")", "{", "}",
                                 ">",  "<",  "=",  ".",  ":",  "|",  ",", ";"};
    for (const char* op : kOps) {
      const std::string o = op;
      if (s_.compare(p, o.size(), o) != 0) continue;
      if (o == "(" || o == "[" || o == "{")
        balance->push_back(o == "(" ? ')' : o == "[" ? ']' : '}');
      if (o == ")" || o == "]" || o == "}") {
        if (balance->empty()) return InvalidArgument("line {}: unexpected '{}'", line_, o);
        if (balance->back() != o[0]) {
          return InvalidArgument("line {}: unexpected '{}', expected '{}'", line_, o,
                                 balance->back());
        }
        balance->pop_back();
      }
      Emit(Type::kOp, o);
      return p + o.size();
    }
    return InvalidArgument("line {}: unexpected character '{}'", line_, s_[p]);
  }

  // Integers (with "_" separators, 0x/0o/0b) and floats (1.5, 1e3, 1.5e-3).
  Result<size_t> Number(size_t p) {
    size_t e = p;
    auto digits = [&](auto ok) {
      while (e < s_.size() &&
             (ok(static_cast<unsigned char>(s_[e])) ||
              (s_[e] == '_' && e + 1 < s_.size() && ok(static_cast<unsigned char>(s_[e + 1]))))) {
        ++e;
      }
    };
    auto dec = [](unsigned char c) { return std::isdigit(c) != 0; };
    if (s_[p] == '0' && p + 1 < s_.size() && s_[p + 1] != '\0' &&
        std::strchr("xXoObB", s_[p + 1])) {
      const char base = static_cast<char>(std::tolower(s_[p + 1]));
      e = p + 2;
      digits([&](unsigned char c) {
        return base == 'x'   ? std::isxdigit(c) != 0
               : base == 'o' ? (c >= '0' && c <= '7')
                             : (c == '0' || c == '1');
      });
      std::string d;
      for (size_t i = p + 2; i < e; ++i) {
        if (s_[i] != '_') d.push_back(s_[i]);
      }
      if (!d.empty()) {
        const int radix = base == 'x' ? 16 : base == 'o' ? 8 : 2;
        errno = 0;
        const long long v = std::strtoll(d.c_str(), nullptr, radix);
        if (errno == ERANGE) return InvalidArgument("line {}: integer literal out of range", line_);
        Emit(Type::kInt, std::to_string(v));
        return e;
      }
      e = p;  // "0x" without digits: the integer 0, then a name
    }
    digits(dec);
    bool is_float = false;
    if (e + 1 < s_.size() && s_[e] == '.' && std::isdigit(static_cast<unsigned char>(s_[e + 1]))) {
      is_float = true;
      ++e;
      digits(dec);
    }
    if (e < s_.size() && (s_[e] == 'e' || s_[e] == 'E')) {
      size_t x = e + 1;
      if (x < s_.size() && (s_[x] == '+' || s_[x] == '-')) ++x;
      if (x < s_.size() && std::isdigit(static_cast<unsigned char>(s_[x]))) {
        is_float = true;
        e = x;
        digits(dec);
      }
    }
    std::string text;
    for (size_t i = p; i < e; ++i) {
      if (s_[i] != '_') text.push_back(s_[i]);
    }
    Emit(is_float ? Type::kFloat : Type::kInt, text);
    return e;
  }

  std::string s_;
  std::vector<Token> tokens_;
  int line_ = 1;
};

}  // namespace

Result<std::vector<Token>> Tokenize(std::string_view source) {
  // Newlines become "\n"; one trailing newline goes (keep_trailing_newline off).
  std::string s;
  s.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      s.push_back('\n');
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      s.push_back(source[i]);
    }
  }
  if (!s.empty() && s.back() == '\n') s.pop_back();
  return Lexer(std::move(s)).Run();
}

}  // namespace failsafe::jinja
