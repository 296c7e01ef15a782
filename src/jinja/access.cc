// Attribute and item access and slicing, as Jinja2's getattr/getitem do them.
#include <optional>

#include "jinja/builtins.h"

namespace failsafe::jinja {

Result<Value> GetAttribute(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) {
    return InvalidArgument("'{}' is undefined (looking up attribute '{}')", obj.undefined_hint(),
                           name);
  }
  if (obj.is_namespace()) {
    const Value* v = obj.as_namespace().attrs.Find(Value(name));
    return v ? *v : Value::Undefined(name);
  }
  Value method = BoundMethod(obj, name);
  if (!method.is_undefined()) return method;
  if (obj.is_dict()) {
    const Value* v = obj.as_dict().Find(Value(name));
    if (v) return *v;
  }
  return Value::Undefined(fmt::format("'{}' object has no attribute '{}'", obj.TypeName(), name));
}

Result<Value> GetItem(const Value& obj, const Value& key) {
  if (obj.is_undefined()) {
    return InvalidArgument("'{}' is undefined (looking up item {})", obj.undefined_hint(),
                           key.Repr());
  }
  if (obj.is_dict()) {
    const Value* v = obj.as_dict().Find(key);
    if (v) return *v;
  } else if ((obj.is_list() || obj.is_string()) && (key.is_int() || key.is_bool())) {
    int64_t i = key.as_int();
    if (obj.is_list()) {
      const int64_t n = static_cast<int64_t>(obj.as_list().size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return obj.as_list()[static_cast<size_t>(i)];
    } else {
      auto cps = CodePoints(obj.as_string());
      const int64_t n = static_cast<int64_t>(cps.size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) {
        std::string c(cps[static_cast<size_t>(i)]);
        return obj.is_markup() ? Value::Markup(std::move(c)) : Value(std::move(c));
      }
    }
  } else if (obj.is_namespace()) {
    const Value* v = obj.as_namespace().attrs.Find(key);
    if (v) return *v;
  }
  if (key.is_string()) {
    Value method = BoundMethod(obj, key.as_string());
    if (!method.is_undefined()) return method;
  }
  return Value::Undefined(fmt::format("'{}' object has no item {}", obj.TypeName(), key.Repr()));
}

Result<Value> Slice(const Value& obj, const Value& start, const Value& stop, const Value& step) {
  auto index = [](const Value& v, const char* what) -> Result<std::optional<int64_t>> {
    if (v.is_undefined() || v.is_none()) return std::optional<int64_t>();
    if (!v.is_int() && !v.is_bool())
      return InvalidArgument("slice {} must be an integer or None", what);
    return std::optional<int64_t>(v.as_int());
  };
  FS_ASSIGN_OR_RETURN(auto b, index(start, "start"));
  FS_ASSIGN_OR_RETURN(auto e, index(stop, "stop"));
  FS_ASSIGN_OR_RETURN(auto s, index(step, "step"));
  const int64_t st = s.value_or(1);
  if (st == 0) return InvalidArgument("slice step cannot be zero");
  std::vector<Value> items;
  std::vector<std::string_view> cps;
  int64_t n = 0;
  if (obj.is_list()) {
    n = static_cast<int64_t>(obj.as_list().size());
  } else if (obj.is_string()) {
    cps = CodePoints(obj.as_string());
    n = static_cast<int64_t>(cps.size());
  } else if (obj.is_undefined()) {
    return InvalidArgument("'{}' is undefined (slicing)", obj.undefined_hint());
  } else {
    return InvalidArgument("'{}' object is not subscriptable", obj.TypeName());
  }
  // Python's slice.indices().
  auto clamp = [&](std::optional<int64_t> v, int64_t dflt) {
    if (!v) return dflt;
    int64_t x = *v;
    if (x < 0) x += n;
    if (st > 0) return std::clamp<int64_t>(x, 0, n);
    return std::clamp<int64_t>(x, -1, n - 1);
  };
  const int64_t lo = clamp(b, st > 0 ? 0 : n - 1), hi = clamp(e, st > 0 ? n : -1);
  std::vector<int64_t> picks;
  for (int64_t i = lo; st > 0 ? i < hi : i > hi; i += st) picks.push_back(i);
  if (obj.is_list()) {
    ValueList out;
    for (int64_t i : picks) out.push_back(obj.as_list()[static_cast<size_t>(i)]);
    return obj.is_tuple() ? Value::Tuple(std::move(out)) : Value(std::move(out));
  }
  std::string out;
  for (int64_t i : picks) out.append(cps[static_cast<size_t>(i)]);
  return obj.is_markup() ? Value::Markup(std::move(out)) : Value(std::move(out));
}

}  // namespace failsafe::jinja
