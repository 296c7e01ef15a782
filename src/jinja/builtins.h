// The filters, tests, global functions and methods templates may use, with
// Jinja2's (and Python's) behaviour. The parser checks names against these
// sets, so an unknown one fails at load.
#pragma once

#include <string>

#include "common/status.h"
#include "jinja/value.h"

namespace failsafe::jinja {

bool IsKnownFilter(const std::string& name);
bool IsKnownTest(const std::string& name);
bool IsKnownMethod(const std::string& name);  // str.strip(), dict.items(), ...
bool IsKnownGlobal(const std::string& name);  // range, namespace, dict, ...

// `value | name(args, kwargs)`.
Result<Value> ApplyFilter(Interpreter& in, const std::string& name, const Value& value,
                          ValueList args, KwArgs kwargs);
// `value is name(args)`.
Result<bool> ApplyTest(Interpreter& in, const std::string& name, const Value& value,
                       const ValueList& args);
// The global function `name` (range, namespace, dict, cycler, joiner), or
// undefined if there is none.
Value GlobalFunction(const std::string& name);
// `receiver.name`, bound: a method of str, dict or list, or undefined.
Value BoundMethod(const Value& receiver, const std::string& name);

// "<what> expected, got '<type>'".
inline Status ExpectedType(const char* what, const Value& v) {
  return InvalidArgument("{} expected, got '{}'", what, v.TypeName());
}

// Shared helpers.
Result<Value> GetAttribute(const Value& obj, const std::string& name);  // Jinja getattr
Result<Value> GetItem(const Value& obj, const Value& key);              // Jinja getitem
// Python a[start:stop:step] on a list or string (missing parts undefined).
Result<Value> Slice(const Value& obj, const Value& start, const Value& stop, const Value& step);

}  // namespace failsafe::jinja
