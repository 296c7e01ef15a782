#include "server/json_schema_grammar.h"

#include <map>
#include <set>

namespace failsafe {

// Properties keep the schema's order.
using json = nlohmann::ordered_json;

namespace {

constexpr int kMaxIndent = 20;        // spaces or tabs after a newline
constexpr int kMaxDigits = 20;        // digits of a number's integer, fraction or exponent
constexpr int kMaxBoundedCount = 64;  // minItems / maxItems / maxLength spelled out up to this

using Item = Grammar::Item;
using CharSet = Grammar::CharSet;

CharSet Range(unsigned char lo, unsigned char hi) {
  CharSet s;
  for (int c = lo; c <= hi; ++c) s.set(c);
  return s;
}

CharSet Of(std::string_view chars) {
  CharSet s;
  for (char c : chars) s.set(static_cast<unsigned char>(c));
  return s;
}

class Builder {
 public:
  explicit Builder(const json& root) : root_(root) {}

  Grammar Take(int start) {
    g_.set_root(start);
    g_.Finish();
    return std::move(g_);
  }

  Result<int> Schema(const json& s, int depth) {
    if (depth > 64) return InvalidArgument("the schema nests deeper than 64 levels");
    if (s.is_boolean()) {
      if (s.get<bool>()) return Value();
      return InvalidArgument("a schema of false accepts nothing");
    }
    if (!s.is_object()) return InvalidArgument("a schema must be an object or a boolean");
    static const std::set<std::string> kIgnored = {
        "title",      "description", "default",          "examples",
        "$schema",    "$id",         "$comment",         "format",
        "minimum",    "maximum",     "exclusiveMinimum", "exclusiveMaximum",
        "multipleOf", "$defs",       "definitions",      "readOnly",
        "writeOnly",  "deprecated",  "strict",           "discriminator"};
    static const std::set<std::string> kKnown = {
        "type",  "properties", "required",  "additionalProperties",
        "items", "minItems",   "maxItems",  "enum",
        "const", "anyOf",      "oneOf",     "allOf",
        "$ref",  "minLength",  "maxLength", "nullable"};
    for (auto& [k, v] : s.items()) {
      if (!kKnown.count(k) && !kIgnored.count(k))
        return InvalidArgument("the schema keyword '{}' is not supported", k);
    }
    if (s.contains("$ref")) return Ref(s["$ref"], depth);
    if (s.contains("const")) return LiteralRule(s["const"]);
    if (s.contains("enum")) {
      if (!s["enum"].is_array() || s["enum"].empty())
        return InvalidArgument("enum must be a non-empty list");
      const int r = g_.NewRule();
      for (const json& v : s["enum"]) g_.Alt(r, {Grammar::Ref(LiteralRule(v))});
      return r;
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      if (!s.contains(key)) continue;
      if (!s[key].is_array() || s[key].empty())
        return InvalidArgument("{} must be a non-empty list", key);
      const int r = g_.NewRule();
      for (const json& alt : s[key]) {
        auto sub = Schema(alt, depth + 1);
        if (!sub.ok()) return sub.status();
        g_.Alt(r, {Grammar::Ref(*sub)});
      }
      return r;
    }
    if (s.contains("allOf")) {
      if (!s["allOf"].is_array() || s["allOf"].size() != 1)
        return InvalidArgument("allOf is supported with one schema only");
      return Schema(s["allOf"][0], depth + 1);
    }
    std::vector<std::string> types;
    if (s.contains("type")) {
      if (s["type"].is_string()) {
        types.push_back(s["type"]);
      } else if (s["type"].is_array()) {
        for (const json& t : s["type"]) {
          if (!t.is_string()) return InvalidArgument("type must name types");
          types.push_back(t);
        }
      } else {
        return InvalidArgument("type must be a string or a list of strings");
      }
    } else if (s.contains("properties") || s.contains("additionalProperties")) {
      types.push_back("object");
    } else if (s.contains("items")) {
      types.push_back("array");
    } else {
      return Value();
    }
    if (s.value("nullable", false)) types.push_back("null");
    const int r = g_.NewRule();
    for (const std::string& t : types) {
      Result<int> sub = Type(t, s, depth);
      if (!sub.ok()) return sub.status();
      g_.Alt(r, {Grammar::Ref(*sub)});
    }
    return r;
  }

  // Any JSON object.
  int AnyObject() {
    if (any_object_ >= 0) return any_object_;
    any_object_ = g_.NewRule();
    const int member = g_.NewRule();
    g_.Alt(member, {Grammar::Ref(String(0, -1)), Grammar::Ref(Ws()), Grammar::Char(':'),
                    Grammar::Ref(Ws()), Grammar::Ref(Value())});
    g_.Alt(any_object_, Bracketed('{', List(member, 0, -1), '}'));
    return any_object_;
  }

 private:
  Result<int> Type(const std::string& t, const json& s, int depth) {
    if (t == "string") {
      const int lo = s.value("minLength", 0);
      const int hi = s.contains("maxLength") ? s["maxLength"].get<int>() : -1;
      if (lo < 0 || (hi >= 0 && hi < lo)) return InvalidArgument("bad minLength / maxLength");
      return String(std::min(lo, kMaxBoundedCount), hi > kMaxBoundedCount ? -1 : hi);
    }
    if (t == "integer") return Integer();
    if (t == "number") return Number();
    if (t == "boolean") {
      const int r = g_.NewRule();
      g_.Alt(r, Grammar::Literal("true"));
      g_.Alt(r, Grammar::Literal("false"));
      return r;
    }
    if (t == "null") return LiteralRule(nullptr);
    if (t == "array") {
      int item = Value();
      if (s.contains("items")) {
        auto sub = Schema(s["items"], depth + 1);
        if (!sub.ok()) return sub.status();
        item = *sub;
      }
      const int lo = s.value("minItems", 0);
      const int hi = s.contains("maxItems") ? s["maxItems"].get<int>() : -1;
      if (lo < 0 || (hi >= 0 && hi < lo) || lo > kMaxBoundedCount)
        return InvalidArgument("minItems / maxItems must be in order and at most {}",
                               kMaxBoundedCount);
      const int r = g_.NewRule();
      g_.Alt(r, Bracketed('[', List(item, lo, hi > kMaxBoundedCount ? -1 : hi), ']'));
      return r;
    }
    if (t == "object") return Object(s, depth);
    return InvalidArgument("unknown type '{}'", t);
  }

  Result<int> Object(const json& s, int depth) {
    if (!s.contains("properties")) {
      // Any keys; values per additionalProperties.
      const json extra = s.value("additionalProperties", json(true));
      if (extra.is_boolean() && extra.get<bool>()) return AnyObject();
      if (extra.is_boolean()) {
        const int r = g_.NewRule();
        g_.Alt(r, Bracketed('{', -1, '}'));
        return r;
      }
      auto value = Schema(extra, depth + 1);
      if (!value.ok()) return value.status();
      const int member = g_.NewRule();
      g_.Alt(member, {Grammar::Ref(String(0, -1)), Grammar::Ref(Ws()), Grammar::Char(':'),
                      Grammar::Ref(Ws()), Grammar::Ref(*value)});
      const int r = g_.NewRule();
      g_.Alt(r, Bracketed('{', List(member, 0, -1), '}'));
      return r;
    }
    const json& props = s["properties"];
    if (!props.is_object()) return InvalidArgument("properties must be an object");
    std::set<std::string> required;
    if (s.contains("required")) {
      if (!s["required"].is_array()) return InvalidArgument("required must be a list");
      for (const json& r : s["required"]) {
        if (!r.is_string() || !props.contains(r.get<std::string>()))
          return InvalidArgument("required names a property the schema does not have");
        required.insert(r.get<std::string>());
      }
    }
    // The members in order; start[i]: from property i with none written yet,
    // after[i]: from property i after one was.
    std::vector<int> member;
    std::vector<bool> needed;
    for (auto& [name, sub] : props.items()) {
      auto value = Schema(sub, depth + 1);
      if (!value.ok()) return value.status();
      const int m = g_.NewRule();
      std::vector<Item> items = Grammar::Literal(json(name).dump());
      items.push_back(Grammar::Ref(Ws()));
      items.push_back(Grammar::Char(':'));
      items.push_back(Grammar::Ref(Ws()));
      items.push_back(Grammar::Ref(*value));
      g_.Alt(m, std::move(items));
      member.push_back(m);
      needed.push_back(required.count(name) > 0);
    }
    const int n = static_cast<int>(member.size());
    std::vector<int> start(n + 1), after(n + 1);
    for (int i = 0; i <= n; ++i) {
      start[i] = g_.NewRule();
      after[i] = g_.NewRule();
    }
    g_.Alt(start[n], {});
    g_.Alt(after[n], {});
    for (int i = n - 1; i >= 0; --i) {
      g_.Alt(start[i], {Grammar::Ref(member[i]), Grammar::Ref(after[i + 1])});
      if (!needed[i]) g_.Alt(start[i], {Grammar::Ref(start[i + 1])});
      g_.Alt(after[i], {Grammar::Ref(Ws()), Grammar::Char(','), Grammar::Ref(Ws()),
                        Grammar::Ref(member[i]), Grammar::Ref(after[i + 1])});
      if (!needed[i]) g_.Alt(after[i], {Grammar::Ref(after[i + 1])});
    }
    const int r = g_.NewRule();
    g_.Alt(r, Bracketed('{', start[0], '}'));
    return r;
  }

  Result<int> Ref(const json& ref, int depth) {
    if (!ref.is_string()) return InvalidArgument("$ref must be a string");
    const std::string path = ref;
    auto it = refs_.find(path);
    if (it != refs_.end()) return it->second;
    const json* target = nullptr;
    for (const char* prefix : {"#/$defs/", "#/definitions/"}) {
      const std::string p = prefix;
      if (path.compare(0, p.size(), p) != 0) continue;
      const std::string name = path.substr(p.size());
      const std::string section = p.substr(2, p.size() - 3);
      if (root_.contains(section) && root_[section].contains(name)) target = &root_[section][name];
    }
    if (path == "#") target = &root_;
    if (!target) return InvalidArgument("$ref '{}' does not name a definition of the schema", path);
    // The rule exists before its body, so a definition may refer to itself.
    const int r = g_.NewRule();
    refs_[path] = r;
    auto body = Schema(*target, depth + 1);
    if (!body.ok()) return body.status();
    g_.Alt(r, {Grammar::Ref(*body)});
    return r;
  }

  // open ws content ws close; content -1: nothing but whitespace.
  std::vector<Item> Bracketed(char open, int content, char close) {
    std::vector<Item> items = {Grammar::Char(open), Grammar::Ref(Ws())};
    if (content >= 0) {
      items.push_back(Grammar::Ref(content));
      items.push_back(Grammar::Ref(Ws()));
    }
    items.push_back(Grammar::Char(close));
    return items;
  }

  // Between lo and hi (-1: no limit) of `item`, comma-separated.
  int List(int item, int lo, int hi) {
    const int r = g_.NewRule();
    if (lo == 0) g_.Alt(r, {});
    if (hi == 0) return r;
    // rest(k): what follows the k-th item.
    const int sep_item = g_.NewRule();
    g_.Alt(sep_item,
           {Grammar::Ref(Ws()), Grammar::Char(','), Grammar::Ref(Ws()), Grammar::Ref(item)});
    int star = -1;
    if (hi < 0) {
      star = g_.NewRule();
      g_.Alt(star, {});
      g_.Alt(star, {Grammar::Ref(sep_item), Grammar::Ref(star)});
    }
    const int last = hi < 0 ? std::max(lo, 1) : hi;
    std::vector<int> rest(last + 1);
    for (int k = 1; k <= last; ++k) rest[k] = g_.NewRule();
    for (int k = last; k >= 1; --k) {
      if (k == last) {
        g_.Alt(rest[k], hi < 0 ? std::vector<Item>{Grammar::Ref(star)} : std::vector<Item>{});
        continue;
      }
      if (k >= lo) g_.Alt(rest[k], {});
      g_.Alt(rest[k], {Grammar::Ref(sep_item), Grammar::Ref(rest[k + 1])});
    }
    g_.Alt(r, {Grammar::Ref(item), Grammar::Ref(rest[1])});
    return r;
  }

  int Ws() {
    if (ws_ >= 0) return ws_;
    const int indent = Count(Grammar::Chars(Of(" \t")), 0, kMaxIndent);
    ws_ = g_.NewRule();
    g_.Alt(ws_, {});
    g_.Alt(ws_, {Grammar::Char(' ')});
    g_.Alt(ws_, {Grammar::Char('\n'), Grammar::Ref(indent)});
    return ws_;
  }

  // Between lo and hi of `unit` in a row (hi -1: at least lo).
  int Count(const Item& unit, int lo, int hi) {
    int r = g_.NewRule();
    g_.Alt(r, {});
    if (hi < 0) {
      g_.Alt(r, {unit, Grammar::Ref(r)});  // any number, after lo required ones
      hi = lo;
    }
    // Level k: up to k more, the top `lo` levels each one at least.
    for (int k = 1; k <= hi; ++k) {
      const int more = g_.NewRule();
      if (k <= hi - lo) g_.Alt(more, {});
      g_.Alt(more, {unit, Grammar::Ref(r)});
      r = more;
    }
    return r;
  }

  int Digits(int lo, int hi) { return Count(Grammar::Chars(Range('0', '9')), lo, hi); }

  int Integer() {
    if (integer_ >= 0) return integer_;
    integer_ = g_.NewRule();
    const int sign = g_.NewRule();
    g_.Alt(sign, {});
    g_.Alt(sign, {Grammar::Char('-')});
    g_.Alt(integer_, {Grammar::Ref(sign), Grammar::Char('0')});
    g_.Alt(integer_, {Grammar::Ref(sign), Grammar::Chars(Range('1', '9')),
                      Grammar::Ref(Digits(0, kMaxDigits - 1))});
    return integer_;
  }

  int Number() {
    if (number_ >= 0) return number_;
    number_ = g_.NewRule();
    const int frac = g_.NewRule();
    g_.Alt(frac, {});
    g_.Alt(frac, {Grammar::Char('.'), Grammar::Ref(Digits(1, kMaxDigits))});
    const int exp_sign = g_.NewRule();
    g_.Alt(exp_sign, {});
    g_.Alt(exp_sign, {Grammar::Chars(Of("+-"))});
    const int exp = g_.NewRule();
    g_.Alt(exp, {});
    g_.Alt(exp, {Grammar::Chars(Of("eE")), Grammar::Ref(exp_sign), Grammar::Ref(Digits(1, 4))});
    g_.Alt(number_, {Grammar::Ref(Integer()), Grammar::Ref(frac), Grammar::Ref(exp)});
    return number_;
  }

  // A JSON string of lo to hi (-1: any number of) characters.
  int String(int lo, int hi) {
    const auto key = std::make_pair(lo, hi);
    if (auto it = strings_.find(key); it != strings_.end()) return it->second;
    if (char_ < 0) {
      char_ = g_.NewRule();
      CharSet plain;
      plain.set();
      for (int c = 0; c < 0x20; ++c) plain.reset(c);
      plain.reset('"');
      plain.reset('\\');
      g_.Alt(char_, {Grammar::Chars(plain)});
      g_.Alt(char_, {Grammar::Char('\\'), Grammar::Chars(Of("\"\\/bfnrt"))});
      CharSet hex = Range('0', '9') | Range('a', 'f') | Range('A', 'F');
      g_.Alt(char_, {Grammar::Char('\\'), Grammar::Char('u'), Grammar::Chars(hex),
                     Grammar::Chars(hex), Grammar::Chars(hex), Grammar::Chars(hex)});
    }
    const int body = Count(Grammar::Ref(char_), lo, hi);
    const int r = g_.NewRule();
    g_.Alt(r, {Grammar::Char('"'), Grammar::Ref(body), Grammar::Char('"')});
    strings_[key] = r;
    return r;
  }

  int LiteralRule(const json& v) {
    const int r = g_.NewRule();
    g_.Alt(r, Grammar::Literal(v.dump()));
    return r;
  }

  // Any JSON value.
  int Value() {
    if (value_ >= 0) return value_;
    value_ = g_.NewRule();
    const int array = g_.NewRule();
    g_.Alt(array, Bracketed('[', List(value_, 0, -1), ']'));
    g_.Alt(value_, {Grammar::Ref(AnyObject())});
    g_.Alt(value_, {Grammar::Ref(array)});
    g_.Alt(value_, {Grammar::Ref(String(0, -1))});
    g_.Alt(value_, {Grammar::Ref(Number())});
    g_.Alt(value_, Grammar::Literal("true"));
    g_.Alt(value_, Grammar::Literal("false"));
    g_.Alt(value_, Grammar::Literal("null"));
    return value_;
  }

  const json& root_;
  Grammar g_;
  std::map<std::string, int> refs_;
  std::map<std::pair<int, int>, int> strings_;
  int ws_ = -1, value_ = -1, any_object_ = -1, integer_ = -1, number_ = -1, char_ = -1;
};

}  // namespace

Result<Grammar> JsonSchemaGrammar(const json& schema) {
  try {
    Builder b(schema);
    auto root = b.Schema(schema, 0);
    if (!root.ok()) return root.status();
    return b.Take(*root);
  } catch (const json::exception& e) {
    // A keyword of the wrong type (minLength: "x").
    return InvalidArgument("the schema has a value of the wrong type: {}", e.what());
  }
}

Grammar JsonObjectGrammar() {
  const json none;
  Builder b(none);
  const int root = b.AnyObject();
  return b.Take(root);
}

}  // namespace failsafe
