// The filters of the template language (Jinja2's, with Hugging Face's tojson).
#include "jinja/builtins.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <set>

#include "jinja/interpreter.h"
#include "jinja/lexer.h"
#include "jinja/strings.h"

namespace failsafe::jinja {

namespace {

// Arguments by position or keyword, with defaults.
class Args {
 public:
  Args(const char* fn, ValueList args, KwArgs kwargs, std::vector<const char*> names)
      : fn_(fn), args_(std::move(args)), kwargs_(std::move(kwargs)), names_(std::move(names)) {}
  Status Check() const {
    if (args_.size() > names_.size())
      return InvalidArgument("{}() takes at most {} argument(s)", fn_, names_.size());
    for (const auto& kv : kwargs_) {
      const std::string& k = kv.first;
      if (std::find_if(names_.begin(), names_.end(), [&](const char* n) { return k == n; }) ==
          names_.end())
        return InvalidArgument("{}() got an unexpected keyword argument '{}'", fn_, k);
    }
    return Status::Ok();
  }
  // The argument `i` (also named names_[i]), or `fallback`.
  Value Get(size_t i, Value fallback = Value()) const {
    if (i < args_.size()) return args_[i];
    for (const auto& [k, v] : kwargs_) {
      if (k == names_[i]) return v;
    }
    return fallback;
  }
  bool Has(size_t i) const { return !Get(i).is_undefined(); }
  const ValueList& positional() const { return args_; }

 private:
  const char* fn_;
  ValueList args_;
  KwArgs kwargs_;
  std::vector<const char*> names_;
};

// Sort key: case-insensitive strings unless asked otherwise.
Value SortKey(const Value& v, bool case_sensitive) {
  if (v.is_string() && !case_sensitive) return Value(Lower(v.as_string()));
  return v;
}

Result<Value> Attribute(const Value& item, const Value& attribute) {
  if (!attribute.is_string()) return GetItem(item, attribute);
  // Dotted paths: "a.b" and "list.0".
  Value cur = item;
  std::string path = attribute.as_string();
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    std::string part =
        path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    char* end = nullptr;
    const long long idx = std::strtoll(part.c_str(), &end, 10);
    FS_ASSIGN_OR_RETURN(cur, !part.empty() && *end == '\0' ? GetItem(cur, Value(int64_t{idx}))
                                                           : GetItem(cur, Value(part)));
    if (dot == std::string::npos) return cur;
    start = dot + 1;
  }
}

Result<Value> SortValues(const Value& value, bool reverse, bool case_sensitive,
                         const Value& attribute) {
  FS_ASSIGN_OR_RETURN(ValueList items, value.Iterate());
  std::vector<std::pair<Value, Value>> keyed;
  for (const Value& v : items) {
    Value k = v;
    if (!attribute.is_undefined()) {
      FS_ASSIGN_OR_RETURN(k, Attribute(v, attribute));
    }
    keyed.emplace_back(SortKey(k, case_sensitive), v);
  }
  Status error;
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
    auto less = reverse ? Value::Less(b.first, a.first) : Value::Less(a.first, b.first);
    if (!less.ok()) {
      error = less.status();
      return false;
    }
    return *less;
  });
  FS_RETURN_IF_ERROR(error);
  ValueList out;
  for (auto& kv : keyed) out.push_back(std::move(kv.second));
  return Value(std::move(out));
}

// select/reject/selectattr/rejectattr.
Result<Value> SelectOrReject(Interpreter& in, const Value& value, const ValueList& args,
                             bool by_attr, bool select) {
  FS_ASSIGN_OR_RETURN(ValueList items, value.Iterate());
  size_t next = 0;
  Value attr;
  if (by_attr) {
    if (args.empty()) return InvalidArgument("missing attribute for selectattr/rejectattr");
    attr = args[next++];
  }
  std::string test;
  if (next < args.size()) {
    if (!args[next].is_string()) return InvalidArgument("the test name must be a string");
    test = args[next++].as_string();
    if (!IsKnownTest(test)) return InvalidArgument("unsupported test '{}'", test);
  }
  const ValueList test_args(args.begin() + static_cast<ptrdiff_t>(next), args.end());
  ValueList out;
  for (const Value& item : items) {
    Value v = item;
    if (by_attr) {
      FS_ASSIGN_OR_RETURN(v, Attribute(item, attr));
    }
    bool ok = v.Truthy();
    if (!test.empty()) {
      FS_ASSIGN_OR_RETURN(ok, ApplyTest(in, test, v, test_args));
    }
    if (ok == select) out.push_back(item);
  }
  return Value(std::move(out));
}

Result<Value> ToInt(const Value& v, const Value& fallback) {
  if (v.is_int() || v.is_bool()) return Value(v.as_int());
  if (v.is_float()) {
    if (!std::isfinite(v.as_double())) return fallback;
    return Value(static_cast<int64_t>(std::trunc(v.as_double())));
  }
  if (v.is_string()) {
    std::string s = Strip(v.as_string(), nullptr, true, true);
    std::string digits;
    size_t i = 0;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) digits.push_back(s[i++]);
    bool ok = i < s.size();
    for (; i < s.size(); ++i) {
      if (std::isdigit(static_cast<unsigned char>(s[i]))) {
        digits.push_back(s[i]);
      } else if (s[i] == '_' && i > 0 && std::isdigit(static_cast<unsigned char>(s[i - 1])) &&
                 i + 1 < s.size() && std::isdigit(static_cast<unsigned char>(s[i + 1]))) {
        continue;
      } else {
        ok = false;
        break;
      }
    }
    if (ok) {
      errno = 0;
      const long long r = std::strtoll(digits.c_str(), nullptr, 10);
      if (errno != ERANGE) return Value(static_cast<int64_t>(r));
    }
    auto f = ParseFloat(s);
    if (f && std::isfinite(*f)) return Value(static_cast<int64_t>(std::trunc(*f)));
  }
  return fallback;
}

Result<Value> ToFloat(const Value& v, const Value& fallback) {
  if (v.is_number()) return Value(v.as_double());
  if (v.is_string()) {
    auto f = ParseFloat(Strip(v.as_string(), nullptr, true, true));
    if (f) return Value(*f);
  }
  return fallback;
}

Result<Value> Filter(Interpreter& in, const std::string& name, const Value& v, ValueList pos,
                     KwArgs kw) {
  auto args = [&](std::vector<const char*> names) -> Result<Args> {
    Args a(name.c_str(), pos, kw, std::move(names));
    FS_RETURN_IF_ERROR(a.Check());
    return a;
  };
  if (name == "safe") {
    FS_ASSIGN_OR_RETURN(Args a, args({}));
    return Value::Markup(v.Str());
  }
  if (name == "string") {
    FS_ASSIGN_OR_RETURN(Args a, args({}));
    return v.is_markup() ? v : Value(v.Str());
  }
  if (name == "e" || name == "escape") {
    FS_ASSIGN_OR_RETURN(Args a, args({}));
    return v.is_markup() ? v : Value::Markup(HtmlEscape(v.Str()));
  }
  if (name == "length" || name == "count") {
    FS_ASSIGN_OR_RETURN(Args a, args({}));
    FS_ASSIGN_OR_RETURN(int64_t n, v.Length());
    return Value(n);
  }
  if (name == "trim") {
    FS_ASSIGN_OR_RETURN(Args a, args({"chars"}));
    const Value chars = a.Get(0);
    if (!chars.is_undefined() && !chars.is_none() && !chars.is_string())
      return ExpectedType("a string", chars);
    std::string r = Strip(v.Str(), chars.is_string() ? &chars.as_string() : nullptr, true, true);
    return v.is_markup() ? Value::Markup(std::move(r)) : Value(std::move(r));
  }
  if (name == "upper" || name == "lower" || name == "capitalize" || name == "title") {
    FS_ASSIGN_OR_RETURN(Args a, args({}));
    const std::string s = v.Str();
    if (name == "title") return Value(JinjaTitle(s));
    std::string r = name == "upper" ? Upper(s) : name == "lower" ? Lower(s) : Capitalize(s);
    return v.is_markup() ? Value::Markup(std::move(r)) : Value(std::move(r));
  }
  if (name == "replace") {
    FS_ASSIGN_OR_RETURN(Args a, args({"old", "new", "count"}));
    if (!a.Get(0).is_string() || !a.Get(1).is_string())
      return InvalidArgument("replace() needs two strings");
    const int64_t count = a.Has(2) && !a.Get(2).is_none() ? a.Get(2).as_int() : -1;
    return Value(Replace(v.Str(), a.Get(0).as_string(), a.Get(1).as_string(), count));
  }
  if (name == "default" || name == "d") {
    FS_ASSIGN_OR_RETURN(Args a, args({"default_value", "boolean"}));
    const bool boolean = a.Get(1, Value(false)).Truthy();
    if (v.is_undefined() || (boolean && !v.Truthy())) return a.Get(0, Value(""));
    return v;
  }
  if (name == "join") {
    FS_ASSIGN_OR_RETURN(Args a, args({"d", "attribute"}));
    const Value sep = a.Get(0, Value(""));
    FS_ASSIGN_OR_RETURN(ValueList items, v.Iterate());
    std::string out;
    for (size_t i = 0; i < items.size(); ++i) {
      if (i) out += sep.Str();
      Value x = items[i];
      if (a.Has(1)) {
        FS_ASSIGN_OR_RETURN(x, Attribute(x, a.Get(1)));
      }
      out += x.Str();
    }
    return Value(std::move(out));
  }
  if (name == "tojson") {
    FS_ASSIGN_OR_RETURN(Args a, args({"ensure_ascii", "indent", "separators", "sort_keys"}));
    if (a.Get(0).Truthy()) return InvalidArgument("tojson: ensure_ascii is not supported");
    if (a.Has(2) && !a.Get(2).is_none())
      return InvalidArgument("tojson: separators are not supported");
    const Value indent = a.Get(1);
    if (indent.Truthy() && !indent.is_int()) return ExpectedType("an integer indent", indent);
    if (indent.is_int() && indent.as_int() > kMaxRepetition)
      return InvalidArgument("tojson indent {} is too large", indent.as_int());
    FS_ASSIGN_OR_RETURN(std::string j,
                        v.ToJson(indent.is_int() ? static_cast<int>(indent.as_int()) : -1,
                                 a.Get(3, Value(false)).Truthy()));
    return Value(std::move(j));
  }
  if (name == "list") {
    FS_ASSIGN_OR_RETURN(Args a, args({}));
    FS_ASSIGN_OR_RETURN(ValueList items, v.Iterate());
    return Value(std::move(items));
  }
  if (name == "items") {
    FS_ASSIGN_OR_RETURN(Args a, args({}));
    if (v.is_undefined()) return Value(ValueList());
    if (!v.is_dict()) return ExpectedType("a mapping", v);
    ValueList out;
    for (const auto& [k, x] : v.as_dict().items()) out.push_back(Value::Tuple({k, x}));
    return Value(std::move(out));
  }
  if (name == "first" || name == "last") {
    FS_ASSIGN_OR_RETURN(Args a, args({}));
    FS_ASSIGN_OR_RETURN(ValueList items, v.Iterate());
    if (items.empty()) return Value::Undefined("no " + name + " item");
    return name == "first" ? items.front() : items.back();
  }
  if (name == "reverse") {
    FS_ASSIGN_OR_RETURN(Args a, args({}));
    if (v.is_string()) {
      auto cps = CodePoints(v.as_string());
      std::string out;
      for (auto it = cps.rbegin(); it != cps.rend(); ++it) out.append(*it);
      return Value(std::move(out));
    }
    FS_ASSIGN_OR_RETURN(ValueList items, v.Iterate());
    std::reverse(items.begin(), items.end());
    return Value(std::move(items));
  }
  if (name == "sort") {
    FS_ASSIGN_OR_RETURN(Args a, args({"reverse", "case_sensitive", "attribute"}));
    return SortValues(v, a.Get(0, Value(false)).Truthy(), a.Get(1, Value(false)).Truthy(),
                      a.Get(2));
  }
  if (name == "dictsort") {
    FS_ASSIGN_OR_RETURN(Args a, args({"case_sensitive", "by", "reverse"}));
    if (!v.is_dict()) return ExpectedType("a mapping", v);
    const bool by_value = a.Get(1, Value("key")).Str() == "value";
    const bool cs = a.Get(0, Value(false)).Truthy();
    std::vector<Value> pairs;
    for (const auto& [k, x] : v.as_dict().items()) pairs.push_back(Value::Tuple({k, x}));
    Status error;
    std::stable_sort(pairs.begin(), pairs.end(), [&](const Value& p, const Value& q) {
      const Value& x = p.as_list()[by_value ? 1 : 0];
      const Value& y = q.as_list()[by_value ? 1 : 0];
      auto less = Value::Less(SortKey(x, cs), SortKey(y, cs));
      if (!less.ok()) error = less.status();
      return less.ok() && *less;
    });
    FS_RETURN_IF_ERROR(error);
    if (a.Get(2, Value(false)).Truthy()) std::reverse(pairs.begin(), pairs.end());
    return Value(std::move(pairs));
  }
  if (name == "unique") {
    FS_ASSIGN_OR_RETURN(Args a, args({"case_sensitive", "attribute"}));
    FS_ASSIGN_OR_RETURN(ValueList items, v.Iterate());
    ValueList out, seen;
    for (const Value& x : items) {
      Value k = x;
      if (a.Has(1)) {
        FS_ASSIGN_OR_RETURN(k, Attribute(x, a.Get(1)));
      }
      k = SortKey(k, a.Get(0, Value(false)).Truthy());
      if (std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return s.Equals(k); }))
        continue;
      seen.push_back(k);
      out.push_back(x);
    }
    return Value(std::move(out));
  }
  if (name == "map") {
    FS_ASSIGN_OR_RETURN(ValueList items, v.Iterate());
    ValueList out;
    for (const auto& [k, x] : kw) {
      if (k != "attribute" && k != "default")
        return InvalidArgument("map() got an unexpected keyword argument '{}'", k);
    }
    const Value* attr = nullptr;
    const Value* fallback = nullptr;
    for (const auto& [k, x] : kw) (k == "attribute" ? attr : fallback) = &x;
    if (attr) {
      for (const Value& x : items) {
        FS_ASSIGN_OR_RETURN(Value r, Attribute(x, *attr));
        out.push_back(r.is_undefined() && fallback ? *fallback : r);
      }
      return Value(std::move(out));
    }
    if (pos.empty() || !pos[0].is_string()) return InvalidArgument("map() needs a filter name");
    const std::string f = pos[0].as_string();
    if (!IsKnownFilter(f)) return InvalidArgument("unsupported filter '{}'", f);
    const ValueList rest(pos.begin() + 1, pos.end());
    for (const Value& x : items) {
      FS_ASSIGN_OR_RETURN(Value r, ApplyFilter(in, f, x, rest, {}));
      out.push_back(std::move(r));
    }
    return Value(std::move(out));
  }
  if (name == "select" || name == "reject")
    return SelectOrReject(in, v, pos, false, name == "select");
  if (name == "selectattr" || name == "rejectattr")
    return SelectOrReject(in, v, pos, true, name == "selectattr");
  if (name == "int") {
    FS_ASSIGN_OR_RETURN(Args a, args({"default", "base"}));
    if (a.Has(1) && a.Get(1).as_int() != 10) return InvalidArgument("int(): only base 10");
    return ToInt(v, a.Get(0, Value(int64_t{0})));
  }
  if (name == "float") {
    FS_ASSIGN_OR_RETURN(Args a, args({"default"}));
    return ToFloat(v, a.Get(0, Value(0.0)));
  }
  if (name == "abs") {
    FS_ASSIGN_OR_RETURN(Args a, args({}));
    if (!v.is_number()) return ExpectedType("a number", v);
    return v.is_float() ? Value(std::fabs(v.as_double()))
                        : Value(static_cast<int64_t>(std::llabs(v.as_int())));
  }
  if (name == "round") {
    FS_ASSIGN_OR_RETURN(Args a, args({"precision", "method"}));
    if (!v.is_number()) return ExpectedType("a number", v);
    const int64_t p = a.Get(0, Value(int64_t{0})).as_int();
    const std::string method = a.Get(1, Value("common")).Str();
    const double scale = std::pow(10.0, static_cast<double>(p));
    const double x = v.as_double() * scale;
    double r;
    if (method == "common" && p >= 0 && p <= 30) {
      // Python's round(): correctly rounded from the exact binary value, ties
      // to even (what printf does).
      char buf[512];
      std::snprintf(buf, sizeof(buf), "%.*f", static_cast<int>(p), v.as_double());
      return Value(std::strtod(buf, nullptr));
    }
    if (method == "common")
      r = std::nearbyint(x);
    else if (method == "floor")
      r = std::floor(x);
    else if (method == "ceil")
      r = std::ceil(x);
    else
      return InvalidArgument("round(): method must be common, ceil or floor");
    return Value(r / scale);
  }
  if (name == "sum") {
    FS_ASSIGN_OR_RETURN(Args a, args({"attribute", "start"}));
    FS_ASSIGN_OR_RETURN(ValueList items, v.Iterate());
    Value total = a.Get(1, Value(int64_t{0}));
    for (const Value& x : items) {
      Value y = x;
      if (a.Has(0)) {
        FS_ASSIGN_OR_RETURN(y, Attribute(x, a.Get(0)));
      }
      FS_ASSIGN_OR_RETURN(total, BinaryOp("+", total, y));
    }
    return total;
  }
  if (name == "min" || name == "max") {
    FS_ASSIGN_OR_RETURN(Args a, args({"case_sensitive", "attribute"}));
    FS_ASSIGN_OR_RETURN(ValueList items, v.Iterate());
    if (items.empty()) return Value::Undefined("no " + name + " item");
    Value best = items[0];
    for (const Value& x : items) {
      Value kx = x, kb = best;
      if (a.Has(1)) {
        FS_ASSIGN_OR_RETURN(kx, Attribute(x, a.Get(1)));
        FS_ASSIGN_OR_RETURN(kb, Attribute(best, a.Get(1)));
      }
      const bool cs = a.Get(0, Value(false)).Truthy();
      FS_ASSIGN_OR_RETURN(bool less, name == "min" ? Value::Less(SortKey(kx, cs), SortKey(kb, cs))
                                                   : Value::Less(SortKey(kb, cs), SortKey(kx, cs)));
      if (less) best = x;
    }
    return best;
  }
  if (name == "indent") {
    FS_ASSIGN_OR_RETURN(Args a, args({"width", "first", "blank"}));
    const Value w = a.Get(0, Value(int64_t{4}));
    if (!w.is_string() && w.as_int() > kMaxRepetition)
      return InvalidArgument("indent width {} is too large", w.as_int());
    const std::string pad =
        w.is_string() ? w.as_string() : std::string(std::max<int64_t>(0, w.as_int()), ' ');
    return Value(
        Indent(v.Str(), pad, a.Get(1, Value(false)).Truthy(), a.Get(2, Value(false)).Truthy()));
  }
  if (name == "wordcount") {
    FS_ASSIGN_OR_RETURN(Args a, args({}));
    return Value(WordCount(v.Str()));
  }
  if (name == "attr") {
    FS_ASSIGN_OR_RETURN(Args a, args({"name"}));
    return GetAttribute(v, a.Get(0).Str());
  }
  if (name == "center") {
    FS_ASSIGN_OR_RETURN(Args a, args({"width"}));
    const int64_t width = a.Get(0, Value(int64_t{80})).as_int();
    if (width > kMaxRepetition) return InvalidArgument("center width {} is too large", width);
    return Value(Center(v.Str(), width));
  }
  return InvalidArgument("unsupported filter '{}'", name);
}

const std::set<std::string>& Filters() {
  static const std::set<std::string> k = {
      "abs",      "attr",   "capitalize", "center",     "count",    "d",       "default",
      "dictsort", "e",      "escape",     "first",      "float",    "indent",  "int",
      "items",    "join",   "last",       "length",     "list",     "lower",   "map",
      "max",      "min",    "reject",     "rejectattr", "replace",  "reverse", "round",
      "safe",     "select", "selectattr", "sort",       "string",   "sum",     "title",
      "tojson",   "trim",   "unique",     "upper",      "wordcount"};
  return k;
}

}  // namespace

bool IsKnownFilter(const std::string& name) { return Filters().count(name) > 0; }

Result<Value> ApplyFilter(Interpreter& in, const std::string& name, const Value& value,
                          ValueList args, KwArgs kwargs) {
  auto r = Filter(in, name, value, std::move(args), std::move(kwargs));
  if (!r.ok() && r.status().message().find(name) == std::string::npos)
    return Status(r.status().code(), fmt::format("filter '{}': {}", name, r.status().message()));
  return r;
}

}  // namespace failsafe::jinja
