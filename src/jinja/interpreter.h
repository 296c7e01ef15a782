// Runs a parsed template: scopes as Jinja2 has them (a for loop body and a
// macro body get their own; if blocks do not), the loop object, macros, and
// output. Errors (a raise_exception call, a type error, an undefined value
// used where it cannot be) end the render with a Status naming the line.
//
// Thread-compatible: one render per Interpreter.
#pragma once

#include <memory>
#include <string>
#include <unordered_map>

#include "common/status.h"
#include "jinja/ast.h"
#include "jinja/value.h"

namespace failsafe::jinja {

class Interpreter {
 public:
  // `context`: the template's variables. Unknown names fall back to the
  // global functions (range, namespace, ...).
  explicit Interpreter(const Dict& context);

  Result<std::string> Render(const Body& body);

  // Calls a function value (for filters that take callables).
  Result<Value> Call(const Value& f, ValueList args, KwArgs kwargs);

  struct Scope {
    std::unordered_map<std::string, Value> vars;
    Scope* parent = nullptr;
  };
  enum class Flow { kNormal, kBreak, kContinue };

  // Used by macros: runs `body` in a new scope under the root.
  Result<std::string> RunMacroBody(const Body& body, std::unordered_map<std::string, Value> args);

 private:
  Result<Flow> Exec(const Body& body, Scope& scope, std::string* out);
  Result<Flow> ExecFor(const Stmt& s, Scope& scope, std::string* out);
  Status Assign(const std::vector<std::string>& targets, const Value& v, Scope& scope, int line);
  Result<Value> Eval(const Expr& e, Scope& scope);
  Result<Value> EvalBinary(const Expr& e, Scope& scope);
  Result<Value> EvalCompare(const Expr& e, Scope& scope);
  Result<Value> Lookup(const std::string& name, Scope& scope) const;
  Result<std::pair<ValueList, KwArgs>> EvalArgs(const Expr& e, Scope& scope);

  const Dict& context_;
  Scope root_;
  int depth_ = 0;  // macro/call nesting, bounded
};

// Python's binary operators on values (+ - * / // % **, and ~).
Result<Value> BinaryOp(const std::string& op, const Value& a, const Value& b);

}  // namespace failsafe::jinja
