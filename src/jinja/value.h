// Values of the template language, with Python's semantics (Jinja2 runs on
// Python): truthiness, equality across int/float/bool, str() and repr(),
// code-point indexing of strings, insertion-ordered dicts, and json.dumps.
//
// Lists and dicts are immutable once built (templates run sandboxed, as
// Hugging Face renders them: list.append and the like are not available), so
// copies share them. A namespace() is the one mutable object.
//
// Thread-safety: a Value may be read from several threads if none mutates a
// namespace it reaches.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/status.h"

namespace failsafe::jinja {

class Value;
class Dict;
class Interpreter;
using ValueList = std::vector<Value>;
using KwArgs = std::vector<std::pair<std::string, Value>>;

// Something callable: a built-in, a macro, a bound method.
class Function {
 public:
  virtual ~Function() = default;
  virtual Result<Value> Call(Interpreter& in, ValueList args, KwArgs kwargs) const = 0;
  virtual std::string name() const = 0;
};

struct Namespace;

class Value {
 public:
  enum class Kind {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,
    kDict,
    kFunction,
    kNamespace
  };

  Value() = default;  // undefined
  static Value None();
  Value(bool b);  // NOLINT: implicit, like the literals it stands for
  Value(int v) : Value(static_cast<int64_t>(v)) {}
  Value(int64_t v);
  Value(double v);
  Value(std::string s);
  Value(const char* s) : Value(std::string(s)) {}
  Value(ValueList list);
  // A tuple: a list that prints as (a, b) and never equals a list.
  static Value Tuple(ValueList items);
  // Markup (markupsafe): a string marked safe by `|safe` or `|escape`. Plain
  // strings combined with it are HTML-escaped, as in Python.
  static Value Markup(std::string s);
  Value(Dict dict);
  Value(std::shared_ptr<const Function> f);
  Value(std::shared_ptr<Namespace> ns);
  // Undefined, remembering what was looked up (for error messages).
  static Value Undefined(std::string hint);
  // JSON as Python's json.loads gives it (objects keep their key order).
  static Value FromJson(const nlohmann::ordered_json& j);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_float() const { return kind_ == Kind::kFloat; }
  bool is_number() const { return is_int() || is_float() || is_bool(); }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_markup() const { return kind_ == Kind::kString && b_; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_tuple() const { return kind_ == Kind::kList && b_; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_function() const { return kind_ == Kind::kFunction; }
  bool is_namespace() const { return kind_ == Kind::kNamespace; }

  bool as_bool() const { return b_; }
  int64_t as_int() const { return is_bool() ? (b_ ? 1 : 0) : i_; }
  double as_double() const { return is_float() ? d_ : static_cast<double>(as_int()); }
  const std::string& as_string() const { return *s_; }
  const ValueList& as_list() const { return *list_; }
  const Dict& as_dict() const { return *dict_; }
  const Function& as_function() const { return *fn_; }
  Namespace& as_namespace() const { return *ns_; }
  const std::string& undefined_hint() const { return *s_; }

  // Python bool(x).
  bool Truthy() const;
  // Python str(x); Jinja prints undefined as "".
  std::string Str() const;
  // Python repr(x).
  std::string Repr() const;
  std::string ReprAt(int depth) const;  // Repr of a value `depth` levels inside another
  // json.dumps(x, ensure_ascii=False, indent=indent (<0: none), sort_keys).
  Result<std::string> ToJson(int indent = -1, bool sort_keys = false) const;
  // Python's type name ("str", "int", "list", "dict", "NoneType", ...).
  const char* TypeName() const;

  // Python ==.
  bool Equals(const Value& o) const;
  // Python <: numbers, strings, lists; anything else is a type error.
  static Result<bool> Less(const Value& a, const Value& b);

  // Python len() (strings in code points), or an error for what has none.
  Result<int64_t> Length() const;
  // The items of `for x in value`: a list's items, a dict's keys, a string's
  // characters; undefined iterates as empty.
  Result<ValueList> Iterate() const;

 private:
  Kind kind_ = Kind::kUndefined;
  bool b_ = false;
  int64_t i_ = 0;
  double d_ = 0;
  std::shared_ptr<const std::string> s_;  // string, or the undefined hint
  std::shared_ptr<const ValueList> list_;
  std::shared_ptr<const Dict> dict_;
  std::shared_ptr<const Function> fn_;
  std::shared_ptr<Namespace> ns_;
};

// Insertion-ordered mapping with str/int/bool/None keys.
class Dict {
 public:
  void Set(const Value& key, Value value);
  const Value* Find(const Value& key) const;
  const std::vector<std::pair<Value, Value>>& items() const { return items_; }
  size_t size() const { return items_.size(); }

 private:
  std::vector<std::pair<Value, Value>> items_;
  std::unordered_map<std::string, size_t> index_;  // canonical key -> position
};

// namespace(): attributes that assignments inside loops can change.
struct Namespace {
  Dict attrs;
};

// Python repr() of a float ("1.0", "0.1", "1e-05", "inf").
std::string FloatRepr(double d);
// Code points of a UTF-8 string, and back.
std::vector<std::string_view> CodePoints(std::string_view s);

}  // namespace failsafe::jinja
