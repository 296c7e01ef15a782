// The tests of the template language (`x is defined`, `n is odd`, ...).
#include <set>

#include "jinja/builtins.h"
#include "jinja/interpreter.h"
#include "jinja/strings.h"

namespace failsafe::jinja {

namespace {

const std::set<std::string>& Tests() {
  static const std::set<std::string> k = {
      "boolean", "callable", "defined",  "divisibleby", "eq",       "equalto",     "escaped",
      "even",    "false",    "filter",   "float",       "ge",       "greaterthan", "gt",
      "in",      "integer",  "iterable", "le",          "lessthan", "lower",       "lt",
      "mapping", "ne",       "none",     "number",      "odd",      "sameas",      "sequence",
      "string",  "test",     "true",     "undefined",   "upper",    "==",          "!=",
      "<",       "<=",       ">",        ">="};
  return k;
}

}  // namespace

bool IsKnownTest(const std::string& name) { return Tests().count(name) > 0; }

Result<bool> ApplyTest(Interpreter& in, const std::string& name, const Value& v,
                       const ValueList& args) {
  auto arg = [&](size_t i) -> Result<Value> {
    if (i >= args.size()) return InvalidArgument("test '{}' needs an argument", name);
    return args[i];
  };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.is_bool();
  if (name == "true") return v.is_bool() && v.as_bool();
  if (name == "false") return v.is_bool() && !v.as_bool();
  if (name == "integer") return v.is_int();
  if (name == "float") return v.is_float();
  if (name == "number") return v.is_number();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_dict();
  if (name == "iterable") return v.is_list() || v.is_dict() || v.is_string() || v.is_undefined();
  if (name == "sequence") return v.is_list() || v.is_dict() || v.is_string();
  if (name == "callable") return v.is_function();
  if (name == "escaped") return false;
  if (name == "lower") return v.is_string() && Lower(v.as_string()) == v.as_string();
  if (name == "upper") return v.is_string() && Upper(v.as_string()) == v.as_string();
  if (name == "odd" || name == "even") {
    if (!v.is_int() && !v.is_bool()) return ExpectedType("an integer", v);
    return (v.as_int() % 2 != 0) == (name == "odd");
  }
  if (name == "divisibleby") {
    FS_ASSIGN_OR_RETURN(Value d, arg(0));
    if (!v.is_number() || !d.is_number()) return ExpectedType("numbers", v);
    FS_ASSIGN_OR_RETURN(Value m, BinaryOp("%", v, d));
    return m.as_double() == 0;
  }
  if (name == "sameas") {
    FS_ASSIGN_OR_RETURN(Value o, arg(0));
    if (v.kind() != o.kind()) return false;
    if (v.is_none() || v.is_undefined()) return true;
    if (v.is_bool()) return v.as_bool() == o.as_bool();
    return v.Equals(o) && (v.is_int() || v.is_string());
  }
  if (name == "eq" || name == "equalto" || name == "==") {
    FS_ASSIGN_OR_RETURN(Value o, arg(0));
    return v.Equals(o);
  }
  if (name == "ne" || name == "!=") {
    FS_ASSIGN_OR_RETURN(Value o, arg(0));
    return !v.Equals(o);
  }
  if (name == "lt" || name == "lessthan" || name == "<" || name == "ge" || name == ">=") {
    FS_ASSIGN_OR_RETURN(Value o, arg(0));
    FS_ASSIGN_OR_RETURN(bool less, Value::Less(v, o));
    return (name == "lt" || name == "lessthan" || name == "<") ? less : !less;
  }
  if (name == "gt" || name == "greaterthan" || name == ">" || name == "le" || name == "<=") {
    FS_ASSIGN_OR_RETURN(Value o, arg(0));
    FS_ASSIGN_OR_RETURN(bool greater, Value::Less(o, v));
    return (name == "gt" || name == "greaterthan" || name == ">") ? greater : !greater;
  }
  if (name == "in") {
    FS_ASSIGN_OR_RETURN(Value c, arg(0));
    if (c.is_string()) {
      if (!v.is_string())
        return InvalidArgument("'in <string>' requires string as left operand, not {}",
                               v.TypeName());
      return c.as_string().find(v.as_string()) != std::string::npos;
    }
    if (c.is_dict()) return c.as_dict().Find(v) != nullptr;
    if (c.is_list()) {
      for (const Value& x : c.as_list()) {
        if (x.Equals(v)) return true;
      }
      return false;
    }
    if (c.is_undefined()) return false;
    return InvalidArgument("argument of type '{}' is not iterable", c.TypeName());
  }
  if (name == "filter") return v.is_string() && IsKnownFilter(v.as_string());
  if (name == "test") return v.is_string() && IsKnownTest(v.as_string());
  (void)in;
  return InvalidArgument("unsupported test '{}'", name);
}
}  // namespace failsafe::jinja
