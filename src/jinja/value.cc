#include "jinja/value.h"

#include <utf8proc.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace failsafe::jinja {

namespace {

// The key under which a dict finds a value: equal keys (1, 1.0, True) agree.
std::string CanonicalKey(const Value& k) {
  switch (k.kind()) {
    case Value::Kind::kString:
      return "s" + k.as_string();
    case Value::Kind::kBool:
    case Value::Kind::kInt:
      return "n" + std::to_string(k.as_int());
    case Value::Kind::kFloat:
      if (std::floor(k.as_double()) == k.as_double() && std::abs(k.as_double()) < 9e18)
        return "n" + std::to_string(static_cast<int64_t>(k.as_double()));
      return "f" + FloatRepr(k.as_double());
    case Value::Kind::kNone:
      return "0";
    default:
      return "?" + k.Repr();
  }
}

// Python's str.isprintable() for one code point.
bool Printable(int32_t cp) {
  if (cp == ' ') return true;
  switch (utf8proc_category(cp)) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS:
      return false;
    default:
      return true;
  }
}

std::string StringRepr(const std::string& s) {
  const bool dq = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char quote = dq ? '"' : '\'';
  std::string out(1, quote);
  for (std::string_view c : CodePoints(s)) {
    utf8proc_int32_t cp = 0;
    utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(c.data()),
                     static_cast<utf8proc_ssize_t>(c.size()), &cp);
    if (cp == quote || cp == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(cp));
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp < 0 || !Printable(cp)) {
      char buf[16];
      if (cp >= 0 && cp < 0x100)
        std::snprintf(buf, sizeof(buf), "\\x%02x", static_cast<unsigned>(cp));
      else if (cp >= 0 && cp < 0x10000)
        std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(cp));
      else
        std::snprintf(buf, sizeof(buf), "\\U%08x", static_cast<unsigned>(cp));
      out += buf;
    } else {
      out.append(c);
    }
  }
  out.push_back(quote);
  return out;
}

void JsonString(const std::string& s, std::string* out) {
  out->push_back('"');
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        *out += "\\\"";
        break;
      case '\\':
        *out += "\\\\";
        break;
      case '\n':
        *out += "\\n";
        break;
      case '\r':
        *out += "\\r";
        break;
      case '\t':
        *out += "\\t";
        break;
      case '\b':
        *out += "\\b";
        break;
      case '\f':
        *out += "\\f";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          *out += buf;
        } else {
          out->push_back(static_cast<char>(c));
        }
    }
  }
  out->push_back('"');
}

Status Json(const Value& v, int indent, bool sort_keys, int depth, std::string* out) {
  if (depth > 256) return InvalidArgument("a value nests too deeply (or contains itself) for JSON");
  auto newline = [&](int d) {
    if (indent < 0) return;
    out->push_back('\n');
    out->append(static_cast<size_t>(indent * d), ' ');
  };
  const char* item_sep = indent < 0 ? ", " : ",";
  switch (v.kind()) {
    case Value::Kind::kNone:
      *out += "null";
      return Status::Ok();
    case Value::Kind::kBool:
      *out += v.as_bool() ? "true" : "false";
      return Status::Ok();
    case Value::Kind::kInt:
      *out += std::to_string(v.as_int());
      return Status::Ok();
    case Value::Kind::kFloat: {
      const double d = v.as_double();
      *out += std::isnan(d)   ? "NaN"
              : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity")
                              : FloatRepr(d);
      return Status::Ok();
    }
    case Value::Kind::kString:
      JsonString(v.as_string(), out);
      return Status::Ok();
    case Value::Kind::kList: {
      if (v.as_list().empty()) {
        *out += "[]";
        return Status::Ok();
      }
      out->push_back('[');
      bool first = true;
      for (const Value& x : v.as_list()) {
        if (!first) *out += item_sep;
        first = false;
        newline(depth + 1);
        FS_RETURN_IF_ERROR(Json(x, indent, sort_keys, depth + 1, out));
      }
      newline(depth);
      out->push_back(']');
      return Status::Ok();
    }
    case Value::Kind::kDict:
    case Value::Kind::kNamespace: {
      const Dict& d = v.is_dict() ? v.as_dict() : v.as_namespace().attrs;
      if (d.size() == 0) {
        *out += "{}";
        return Status::Ok();
      }
      std::vector<const std::pair<Value, Value>*> items;
      for (const auto& kv : d.items()) items.push_back(&kv);
      if (sort_keys) {
        std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) {
          auto less = Value::Less(a->first, b->first);
          return less.ok() && *less;
        });
      }
      out->push_back('{');
      bool first = true;
      for (const auto* kv : items) {
        if (!first) *out += item_sep;
        first = false;
        newline(depth + 1);
        const Value& k = kv->first;
        if (k.is_string()) {
          JsonString(k.as_string(), out);
        } else if (k.is_none()) {
          *out += "\"null\"";
        } else if (k.is_bool()) {
          *out += k.as_bool() ? "\"true\"" : "\"false\"";
        } else {
          JsonString(k.Str(), out);
        }
        *out += ": ";
        FS_RETURN_IF_ERROR(Json(kv->second, indent, sort_keys, depth + 1, out));
      }
      newline(depth);
      out->push_back('}');
      return Status::Ok();
    }
    case Value::Kind::kUndefined:
      return InvalidArgument("Object of type Undefined is not JSON serializable");
    case Value::Kind::kFunction:
      return InvalidArgument("Object of type function is not JSON serializable");
  }
  return Status::Ok();
}

}  // namespace

std::vector<std::string_view> CodePoints(std::string_view s) {
  std::vector<std::string_view> out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    size_t n = 1;
    while (i + n < s.size() && (static_cast<unsigned char>(s[i + n]) & 0xC0) == 0x80) ++n;
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

std::string FloatRepr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  // Shortest digits that round-trip, then Python's layout: fixed notation for
  // exponents in [-4, 16), scientific otherwise.
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string sci(buf, r.ptr);
  const bool neg = sci[0] == '-';
  if (neg) sci.erase(0, 1);
  const size_t e = sci.find('e');
  std::string digits = sci.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int exp = std::stoi(sci.substr(e + 1));
  std::string out;
  if (exp >= -4 && exp < 16) {
    if (exp < 0) {
      out = "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
    } else if (static_cast<int>(digits.size()) <= exp + 1) {
      out = digits + std::string(static_cast<size_t>(exp + 1 - digits.size()), '0') + ".0";
    } else {
      out = digits.substr(0, exp + 1) + "." + digits.substr(exp + 1);
    }
  }
  if (out.empty()) {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof(eb), "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    out += eb;
  }
  return neg ? "-" + out : out;
}

void Dict::Set(const Value& key, Value value) {
  const std::string k = CanonicalKey(key);
  auto it = index_.find(k);
  if (it != index_.end()) {
    items_[it->second].second = std::move(value);
    return;
  }
  index_.emplace(k, items_.size());
  items_.emplace_back(key, std::move(value));
}

const Value* Dict::Find(const Value& key) const {
  auto it = index_.find(CanonicalKey(key));
  return it == index_.end() ? nullptr : &items_[it->second].second;
}

Value Value::None() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}
Value::Value(bool b) : kind_(Kind::kBool), b_(b) {}
Value::Value(int64_t v) : kind_(Kind::kInt), i_(v) {}
Value::Value(double v) : kind_(Kind::kFloat), d_(v) {}
Value::Value(std::string s)
    : kind_(Kind::kString), s_(std::make_shared<const std::string>(std::move(s))) {}
Value::Value(ValueList list)
    : kind_(Kind::kList), list_(std::make_shared<const ValueList>(std::move(list))) {}
Value Value::Markup(std::string s) {
  Value v(std::move(s));
  v.b_ = true;
  return v;
}

Value Value::Tuple(ValueList items) {
  Value v(std::move(items));
  v.b_ = true;
  return v;
}
Value::Value(Dict dict)
    : kind_(Kind::kDict), dict_(std::make_shared<const Dict>(std::move(dict))) {}
Value::Value(std::shared_ptr<const Function> f) : kind_(Kind::kFunction), fn_(std::move(f)) {}
Value::Value(std::shared_ptr<Namespace> ns) : kind_(Kind::kNamespace), ns_(std::move(ns)) {}

Value Value::Undefined(std::string hint) {
  Value v;
  v.s_ = std::make_shared<const std::string>(std::move(hint));
  return v;
}

Value Value::FromJson(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return None();
    case nlohmann::ordered_json::value_t::boolean:
      return Value(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned:
      return Value(static_cast<int64_t>(j.get<uint64_t>()));
    case nlohmann::ordered_json::value_t::number_float:
      return Value(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      ValueList l;
      l.reserve(j.size());
      for (const auto& x : j) l.push_back(FromJson(x));
      return Value(std::move(l));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict d;
      for (const auto& [k, x] : j.items()) d.Set(Value(k), FromJson(x));
      return Value(std::move(d));
    }
    default:
      return None();
  }
}

bool Value::Truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return b_;
    case Kind::kInt:
      return i_ != 0;
    case Kind::kFloat:
      return d_ != 0;
    case Kind::kString:
      return !s_->empty();
    case Kind::kList:
      return !list_->empty();
    case Kind::kDict:
      return dict_->size() > 0;
    default:
      return true;
  }
}

const char* Value::TypeName() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kList:
      return "list";
    case Kind::kDict:
      return "dict";
    case Kind::kFunction:
      return "function";
    case Kind::kNamespace:
      return "Namespace";
  }
  return "?";
}

std::string Value::Str() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "";
    case Kind::kString:
      return *s_;
    default:
      return Repr();
  }
}

std::string Value::Repr() const { return ReprAt(0); }

std::string Value::ReprAt(int depth) const {
  // Deep or self-containing values print their insides as "...", as Python
  // prints a container that contains itself.
  if (depth > 256 && (is_list() || is_dict() || is_namespace())) return "...";
  switch (kind_) {
    case Kind::kUndefined:
      return "";
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return b_ ? "True" : "False";
    case Kind::kInt:
      return std::to_string(i_);
    case Kind::kFloat:
      return FloatRepr(d_);
    case Kind::kString:
      return b_ ? "Markup(" + StringRepr(*s_) + ")" : StringRepr(*s_);
    case Kind::kList: {
      std::string out = b_ ? "(" : "[";
      for (size_t i = 0; i < list_->size(); ++i) {
        if (i) out += ", ";
        out += (*list_)[i].ReprAt(depth + 1);
      }
      if (b_ && list_->size() == 1) out += ",";
      return out + (b_ ? ")" : "]");
    }
    case Kind::kDict: {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, v] : dict_->items()) {
        if (!first) out += ", ";
        first = false;
        out += k.ReprAt(depth + 1) + ": " + v.ReprAt(depth + 1);
      }
      return out + "}";
    }
    case Kind::kFunction:
      return "<function " + fn_->name() + ">";
    case Kind::kNamespace: {
      std::string out = "<Namespace {";
      bool first = true;
      for (const auto& [k, v] : ns_->attrs.items()) {
        if (!first) out += ", ";
        first = false;
        out += k.ReprAt(depth + 1) + ": " + v.ReprAt(depth + 1);
      }
      return out + "}>";
    }
  }
  return "";
}

Result<std::string> Value::ToJson(int indent, bool sort_keys) const {
  std::string out;
  FS_RETURN_IF_ERROR(Json(*this, indent, sort_keys, 0, &out));
  return out;
}

bool Value::Equals(const Value& o) const {
  if (is_number() && o.is_number()) {
    if (is_float() || o.is_float()) return as_double() == o.as_double();
    return as_int() == o.as_int();
  }
  if (kind_ != o.kind_) return false;
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return true;
    case Kind::kString:
      return *s_ == *o.s_;
    case Kind::kList:
      if (b_ != o.b_ || list_->size() != o.list_->size()) return false;
      for (size_t i = 0; i < list_->size(); ++i) {
        if (!(*list_)[i].Equals((*o.list_)[i])) return false;
      }
      return true;
    case Kind::kDict:
      if (dict_->size() != o.dict_->size()) return false;
      for (const auto& [k, v] : dict_->items()) {
        const Value* other = o.dict_->Find(k);
        if (!other || !v.Equals(*other)) return false;
      }
      return true;
    case Kind::kFunction:
      return fn_ == o.fn_;
    case Kind::kNamespace:
      return ns_ == o.ns_;
    default:
      return false;
  }
}

Result<bool> Value::Less(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() < b.as_double();
    return a.as_int() < b.as_int();
  }
  if (a.is_string() && b.is_string()) return a.as_string() < b.as_string();
  if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
    const ValueList &x = a.as_list(), &y = b.as_list();
    for (size_t i = 0; i < std::min(x.size(), y.size()); ++i) {
      if (x[i].Equals(y[i])) continue;
      return Less(x[i], y[i]);
    }
    return x.size() < y.size();
  }
  return InvalidArgument("'<' not supported between instances of '{}' and '{}'", a.TypeName(),
                         b.TypeName());
}

Result<int64_t> Value::Length() const {
  switch (kind_) {
    case Kind::kUndefined:
      return 0;
    case Kind::kString:
      return static_cast<int64_t>(CodePoints(*s_).size());
    case Kind::kList:
      return static_cast<int64_t>(list_->size());
    case Kind::kDict:
      return static_cast<int64_t>(dict_->size());
    default:
      return InvalidArgument("object of type '{}' has no len()", TypeName());
  }
}

Result<ValueList> Value::Iterate() const {
  switch (kind_) {
    case Kind::kUndefined:
      return ValueList();
    case Kind::kList:
      return *list_;
    case Kind::kDict: {
      ValueList keys;
      for (const auto& kv : dict_->items()) keys.push_back(kv.first);
      return keys;
    }
    case Kind::kString: {
      ValueList chars;
      for (std::string_view c : CodePoints(*s_)) chars.emplace_back(std::string(c));
      return chars;
    }
    default:
      return InvalidArgument("'{}' object is not iterable", TypeName());
  }
}

}  // namespace failsafe::jinja
