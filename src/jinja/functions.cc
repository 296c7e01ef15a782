// Global functions (range, dict, namespace) and the methods of str, dict and
// list values, as Python has them.
#include <utf8proc.h>

#include <algorithm>
#include <functional>
#include <set>

#include "common/utf8.h"
#include "jinja/lexer.h"

#include "jinja/builtins.h"
#include "jinja/interpreter.h"
#include "jinja/strings.h"

namespace failsafe::jinja {

namespace {

// A C++ function as a template function.
class Native : public Function {
 public:
  using Fn = std::function<Result<Value>(Interpreter&, ValueList, KwArgs)>;
  Native(std::string name, Fn fn) : name_(std::move(name)), fn_(std::move(fn)) {}
  Result<Value> Call(Interpreter& in, ValueList args, KwArgs kwargs) const override {
    auto r = fn_(in, std::move(args), std::move(kwargs));
    if (!r.ok() && r.status().message().find(name_) == std::string::npos)
      return Status(r.status().code(), fmt::format("{}(): {}", name_, r.status().message()));
    return r;
  }
  std::string name() const override { return name_; }

 private:
  std::string name_;
  Fn fn_;
};

Value MakeFunction(std::string name, Native::Fn fn) {
  return Value(std::make_shared<Native>(std::move(name), std::move(fn)));
}

Status NoKwargs(const KwArgs& kw) {
  if (!kw.empty()) return InvalidArgument("takes no keyword arguments");
  return Status::Ok();
}

Result<std::string> StringArg(const ValueList& a, size_t i, const char* what) {
  if (i >= a.size() || !a[i].is_string()) return InvalidArgument("{} must be a string", what);
  return a[i].as_string();
}

// Python's str.format with "{}", "{0}" and "{name}" fields (no format specs).
Result<std::string> Format(const std::string& fmt_str, const ValueList& args, const KwArgs& kw) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < fmt_str.size(); ++i) {
    const char c = fmt_str[i];
    if (c == '{' && i + 1 < fmt_str.size() && fmt_str[i + 1] == '{') {
      out.push_back('{');
      ++i;
    } else if (c == '}' && i + 1 < fmt_str.size() && fmt_str[i + 1] == '}') {
      out.push_back('}');
      ++i;
    } else if (c == '{') {
      const size_t end = fmt_str.find('}', i);
      if (end == std::string::npos) return InvalidArgument("single '{{' in format string");
      const std::string field = fmt_str.substr(i + 1, end - i - 1);
      if (field.find_first_of(":!") != std::string::npos)
        return InvalidArgument("unsupported construct: format specifications in str.format");
      const Value* v = nullptr;
      if (field.empty()) {
        if (auto_index >= args.size()) return InvalidArgument("not enough arguments for format");
        v = &args[auto_index++];
      } else if (std::all_of(field.begin(), field.end(), ::isdigit)) {
        if (field.size() > 9 || std::stoul(field) >= args.size())
          return InvalidArgument("format index {} out of range", field);
        v = &args[std::stoul(field)];
      } else {
        for (const auto& [name, x] : kw) {
          if (name == field) v = &x;
        }
        if (!v) return InvalidArgument("format: no argument named '{}'", field);
      }
      out += v->Str();
      i = end;
    } else if (c == '}') {
      return InvalidArgument("single '}}' in format string");
    } else {
      out.push_back(c);
    }
  }
  return out;
}

Value StringMethod(const std::string& s, const std::string& name) {
  auto m = [&](Native::Fn fn) { return MakeFunction("str." + name, std::move(fn)); };
  auto no_args = [&](std::function<Value(const std::string&)> f) {
    return m([s, f](Interpreter&, ValueList a, KwArgs kw) -> Result<Value> {
      FS_RETURN_IF_ERROR(NoKwargs(kw));
      if (!a.empty()) return InvalidArgument("takes no arguments");
      return f(s);
    });
  };
  if (name == "upper") return no_args([](const std::string& x) { return Value(Upper(x)); });
  if (name == "lower") return no_args([](const std::string& x) { return Value(Lower(x)); });
  if (name == "title") return no_args([](const std::string& x) { return Value(PythonTitle(x)); });
  if (name == "capitalize")
    return no_args([](const std::string& x) { return Value(Capitalize(x)); });
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    return m([s, name](Interpreter&, ValueList a, KwArgs kw) -> Result<Value> {
      FS_RETURN_IF_ERROR(NoKwargs(kw));
      if (a.size() > 1) return InvalidArgument("takes at most 1 argument");
      const std::string* chars = nullptr;
      if (!a.empty() && !a[0].is_none()) {
        if (!a[0].is_string()) return InvalidArgument("arg must be None or str");
        chars = &a[0].as_string();
      }
      return Value(Strip(s, chars, name != "rstrip", name != "lstrip"));
    });
  }
  if (name == "split" || name == "rsplit") {
    return m([s, name](Interpreter&, ValueList a, KwArgs kw) -> Result<Value> {
      Value sep = a.size() > 0 ? a[0] : Value::None(), maxsplit = a.size() > 1 ? a[1] : Value(-1);
      for (const auto& [k, v] : kw) {
        if (k == "sep")
          sep = v;
        else if (k == "maxsplit")
          maxsplit = v;
        else
          return InvalidArgument("unexpected keyword argument '{}'", k);
      }
      if (!sep.is_none() && !sep.is_string()) return InvalidArgument("must be str or None");
      if (sep.is_string() && sep.as_string().empty()) return InvalidArgument("empty separator");
      ValueList out;
      for (auto& p : Split(s, sep.is_string() ? &sep.as_string() : nullptr, maxsplit.as_int(),
                           name == "rsplit"))
        out.emplace_back(std::move(p));
      return Value(std::move(out));
    });
  }
  if (name == "splitlines") {
    return m([s](Interpreter&, ValueList a, KwArgs kw) -> Result<Value> {
      bool keep = !a.empty() && a[0].Truthy();
      for (const auto& [k, v] : kw) keep = k == "keepends" ? v.Truthy() : keep;
      ValueList out;
      for (auto& p : SplitLines(s, keep)) out.emplace_back(std::move(p));
      return Value(std::move(out));
    });
  }
  if (name == "startswith" || name == "endswith") {
    return m([s, name](Interpreter&, ValueList a, KwArgs kw) -> Result<Value> {
      FS_RETURN_IF_ERROR(NoKwargs(kw));
      if (a.size() != 1) return InvalidArgument("takes exactly one argument");
      ValueList options = a[0].is_list() ? a[0].as_list() : ValueList{a[0]};
      for (const Value& o : options) {
        if (!o.is_string()) return InvalidArgument("arguments must be str or a tuple of str");
        const std::string& p = o.as_string();
        const bool hit =
            name == "startswith"
                ? s.compare(0, p.size(), p) == 0
                : s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
        if (hit) return Value(true);
      }
      return Value(false);
    });
  }
  if (name == "replace") {
    return m([s](Interpreter&, ValueList a, KwArgs kw) -> Result<Value> {
      FS_RETURN_IF_ERROR(NoKwargs(kw));
      FS_ASSIGN_OR_RETURN(std::string old, StringArg(a, 0, "old"));
      FS_ASSIGN_OR_RETURN(std::string with, StringArg(a, 1, "new"));
      return Value(Replace(s, old, with, a.size() > 2 ? a[2].as_int() : -1));
    });
  }
  if (name == "find" || name == "rfind" || name == "count" || name == "index") {
    return m([s, name](Interpreter&, ValueList a, KwArgs kw) -> Result<Value> {
      FS_RETURN_IF_ERROR(NoKwargs(kw));
      FS_ASSIGN_OR_RETURN(std::string sub, StringArg(a, 0, "sub"));
      if (a.size() > 1) return InvalidArgument("start/end arguments are not supported");
      if (name == "count") {
        if (sub.empty()) return Value(static_cast<int64_t>(CodePoints(s).size()) + 1);
        int64_t n = 0;
        for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size()))
          ++n;
        return Value(n);
      }
      const size_t at = name == "rfind" ? s.rfind(sub) : s.find(sub);
      if (at == std::string::npos) {
        if (name == "index") return InvalidArgument("substring not found");
        return Value(int64_t{-1});
      }
      return Value(CodePointIndex(s, at));
    });
  }
  if (name == "join") {
    return m([s](Interpreter&, ValueList a, KwArgs kw) -> Result<Value> {
      FS_RETURN_IF_ERROR(NoKwargs(kw));
      if (a.size() != 1) return InvalidArgument("takes exactly one argument");
      FS_ASSIGN_OR_RETURN(ValueList items, a[0].Iterate());
      std::string out;
      for (size_t i = 0; i < items.size(); ++i) {
        if (!items[i].is_string())
          return InvalidArgument("sequence item {}: expected str instance, {} found", i,
                                 items[i].TypeName());
        if (i) out += s;
        out += items[i].as_string();
      }
      return Value(std::move(out));
    });
  }
  if (name == "format") {
    return m([s](Interpreter&, ValueList a, KwArgs kw) -> Result<Value> {
      FS_ASSIGN_OR_RETURN(std::string r, Format(s, a, kw));
      return Value(std::move(r));
    });
  }
  auto predicate = [&](std::function<bool(int)> ok) {
    return no_args([ok](const std::string& x) {
      if (x.empty()) return Value(false);
      for (std::string_view c : CodePoints(x)) {
        size_t i = 0;
        if (!ok(DecodeUtf8(c, &i))) return Value(false);
      }
      return Value(true);
    });
  };
  if (name == "isdigit" || name == "isdecimal" || name == "isnumeric")
    return predicate([](int cp) { return utf8proc_category(cp) == UTF8PROC_CATEGORY_ND; });
  if (name == "isalpha")
    return predicate([](int cp) {
      const auto c = utf8proc_category(cp);
      return c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO;
    });
  if (name == "isalnum")
    return predicate([](int cp) {
      const auto c = utf8proc_category(cp);
      return (c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO) ||
             (c >= UTF8PROC_CATEGORY_ND && c <= UTF8PROC_CATEGORY_NO);
    });
  if (name == "isspace") return predicate([](int cp) { return IsPythonSpace(cp); });
  if (name == "islower" || name == "isupper") {
    const bool lower = name == "islower";
    return no_args([lower](const std::string& x) {
      bool cased = false;
      for (std::string_view c : CodePoints(x)) {
        size_t i = 0;
        const int cp = DecodeUtf8(c, &i);
        const auto cat = utf8proc_category(cp);
        if (cat == UTF8PROC_CATEGORY_LT ||
            cat == (lower ? UTF8PROC_CATEGORY_LU : UTF8PROC_CATEGORY_LL))
          return Value(false);
        cased = cased || cat == (lower ? UTF8PROC_CATEGORY_LL : UTF8PROC_CATEGORY_LU);
      }
      return Value(cased);
    });
  }
  return Value();
}

Value DictMethod(const Value& d, const std::string& name) {
  auto m = [&](Native::Fn fn) { return MakeFunction("dict." + name, std::move(fn)); };
  if (name == "items" || name == "keys" || name == "values") {
    return m([d, name](Interpreter&, ValueList a, KwArgs kw) -> Result<Value> {
      FS_RETURN_IF_ERROR(NoKwargs(kw));
      if (!a.empty()) return InvalidArgument("takes no arguments");
      ValueList out;
      for (const auto& [k, v] : d.as_dict().items()) {
        out.push_back(name == "items" ? Value::Tuple({k, v}) : name == "keys" ? k : v);
      }
      return Value(std::move(out));
    });
  }
  if (name == "get") {
    return m([d](Interpreter&, ValueList a, KwArgs kw) -> Result<Value> {
      FS_RETURN_IF_ERROR(NoKwargs(kw));
      if (a.empty() || a.size() > 2) return InvalidArgument("takes 1 or 2 arguments");
      const Value* v = d.as_dict().Find(a[0]);
      return v ? *v : a.size() > 1 ? a[1] : Value::None();
    });
  }
  return Value();
}

Value ListMethod(const Value& l, const std::string& name) {
  if (name != "index" && name != "count") return Value();
  return MakeFunction("list." + name,
                      [l, name](Interpreter&, ValueList a, KwArgs kw) -> Result<Value> {
                        FS_RETURN_IF_ERROR(NoKwargs(kw));
                        if (a.size() != 1) return InvalidArgument("takes exactly one argument");
                        int64_t count = 0;
                        for (size_t i = 0; i < l.as_list().size(); ++i) {
                          if (!l.as_list()[i].Equals(a[0])) continue;
                          if (name == "index") return Value(static_cast<int64_t>(i));
                          ++count;
                        }
                        if (name == "index")
                          return InvalidArgument("{} is not in list", a[0].Repr());
                        return Value(count);
                      });
}

Result<Value> Range(Interpreter&, ValueList a, KwArgs kw) {
  FS_RETURN_IF_ERROR(NoKwargs(kw));
  for (const Value& v : a) {
    if (!v.is_int() && !v.is_bool())
      return InvalidArgument("'{}' object cannot be interpreted as an integer", v.TypeName());
  }
  int64_t start = 0, stop = 0, step = 1;
  if (a.size() == 1) {
    stop = a[0].as_int();
  } else if (a.size() == 2 || a.size() == 3) {
    start = a[0].as_int();
    stop = a[1].as_int();
    if (a.size() == 3) step = a[2].as_int();
  } else {
    return InvalidArgument("expected 1 to 3 arguments");
  }
  if (step == 0) return InvalidArgument("arg 3 must not be zero");
  ValueList out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    if (out.size() >= 100000) return InvalidArgument("range too big");
    out.emplace_back(i);
  }
  return Value(std::move(out));
}

// dict(mapping?, **kwargs) and namespace(mapping?, **kwargs).
Result<Dict> MappingArgs(const ValueList& a, KwArgs kw) {
  Dict d;
  if (a.size() > 1) return InvalidArgument("expected at most 1 positional argument");
  if (a.size() == 1) {
    if (!a[0].is_dict()) return InvalidArgument("'{}' object is not a mapping", a[0].TypeName());
    for (const auto& [k, v] : a[0].as_dict().items()) d.Set(k, v);
  }
  for (auto& [k, v] : kw) d.Set(Value(k), std::move(v));
  return d;
}

}  // namespace

bool IsKnownMethod(const std::string& name) {
  static const std::set<std::string> k = {
      "upper",     "lower",   "title",      "capitalize", "strip",    "lstrip",  "rstrip",
      "split",     "rsplit",  "splitlines", "startswith", "endswith", "replace", "find",
      "rfind",     "count",   "index",      "join",       "format",   "isdigit", "isdecimal",
      "isnumeric", "isalpha", "isalnum",    "isspace",    "islower",  "isupper", "items",
      "keys",      "values",  "get"};
  return k.count(name) > 0;
}

bool IsKnownGlobal(const std::string& name) {
  return name == "range" || name == "dict" || name == "namespace";
}

Value GlobalFunction(const std::string& name) {
  if (name == "range") return MakeFunction("range", Range);
  if (name == "dict") {
    return MakeFunction("dict", [](Interpreter&, ValueList a, KwArgs kw) -> Result<Value> {
      FS_ASSIGN_OR_RETURN(Dict d, MappingArgs(a, std::move(kw)));
      return Value(std::move(d));
    });
  }
  if (name == "namespace") {
    return MakeFunction("namespace", [](Interpreter&, ValueList a, KwArgs kw) -> Result<Value> {
      auto ns = std::make_shared<Namespace>();
      FS_ASSIGN_OR_RETURN(ns->attrs, MappingArgs(a, std::move(kw)));
      return Value(std::move(ns));
    });
  }
  return Value();
}

// A str method called on Markup, as markupsafe wraps them: string arguments
// are escaped and string results are Markup again.
Value MarkupMethod(const Value& method, const std::string& name) {
  static const std::set<std::string> kEscapeArgs = {"replace", "strip", "lstrip",
                                                    "rstrip",  "join",  "format"};
  static const std::set<std::string> kMarkupResult = {
      "capitalize", "title", "lower",  "upper", "replace",    "strip", "lstrip",
      "rstrip",     "split", "rsplit", "join",  "splitlines", "format"};
  if (!kMarkupResult.count(name)) return method;
  auto mark = [](const Value& v) { return v.is_string() ? Value::Markup(v.as_string()) : v; };
  return MakeFunction(
      "Markup." + name,
      [method, name, mark](Interpreter& in, ValueList a, KwArgs kw) -> Result<Value> {
        if (kEscapeArgs.count(name)) {
          for (Value& x : a) {
            if (x.is_string() && !x.is_markup()) x = Value(HtmlEscape(x.as_string()));
            if (name == "join" && x.is_list()) {
              ValueList items;
              for (const Value& i : x.as_list()) {
                items.push_back(i.is_string() && !i.is_markup() ? Value(HtmlEscape(i.as_string()))
                                                                : i);
              }
              x = Value(std::move(items));
            }
          }
        }
        FS_ASSIGN_OR_RETURN(Value r, in.Call(method, std::move(a), std::move(kw)));
        if (!r.is_list()) return mark(r);
        ValueList items;
        for (const Value& i : r.as_list()) items.push_back(mark(i));
        return Value(std::move(items));
      });
}

Value BoundMethod(const Value& receiver, const std::string& name) {
  if (!IsKnownMethod(name)) return Value();
  if (receiver.is_markup()) return MarkupMethod(StringMethod(receiver.as_string(), name), name);
  if (receiver.is_string()) return StringMethod(receiver.as_string(), name);
  if (receiver.is_dict()) return DictMethod(receiver, name);
  if (receiver.is_list()) return ListMethod(receiver, name);
  return Value();
}

}  // namespace failsafe::jinja
