// The parsed form of a template: expressions and statements.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "jinja/value.h"

namespace failsafe::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,    // value
    kName,       // name
    kList,       // items
    kTuple,      // items
    kDict,       // items (key, value, key, value, ...)
    kGetAttr,    // a . name
    kGetItem,    // a [ b ]
    kSlice,      // a [ b : c : d ] (null parts absent)
    kCall,       // a ( items, kwargs )
    kFilter,     // a | name ( items, kwargs )
    kTest,       // a is [not] name ( items )
    kNot,        // not a
    kNeg,        // - a
    kPos,        // + a
    kBinary,     // a op b: or and + - * / // % ** ~
    kCompare,    // a op1 b op2 c ...: == != < > <= >= in notin
    kCondition,  // b if a else c
  };
  Kind kind;
  int line = 0;
  Value value;
  std::string name;  // name, attribute, filter, test or operator
  bool negated = false;
  ExprPtr a, b, c, d;
  std::vector<ExprPtr> items;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;  // kCompare: one per comparison
};

struct Stmt;
using Body = std::vector<std::unique_ptr<Stmt>>;

struct Stmt {
  enum class Kind {
    kText,         // text
    kOutput,       // {{ expr }}
    kIf,           // conds[i] -> bodies[i]; else_body
    kFor,          // targets in expr [if cond]: body; else_body
    kSet,          // targets (or attr target) = expr
    kSetBlock,     // targets = rendered body (filtered by filters)
    kMacro,        // name(params = defaults): body
    kFilterBlock,  // body piped through filters
    kWith,         // targets[i] = values[i]: body
    kBreak,
    kContinue,
    kGeneration,  // Hugging Face's {% generation %}: renders its body
  };
  Kind kind;
  int line = 0;
  std::string text;
  ExprPtr expr, cond;
  std::vector<std::string> targets;  // names; a namespace target is "ns.attr"
  std::vector<ExprPtr> conds, values;
  std::vector<Body> bodies;
  Body body, else_body;
  std::vector<std::pair<std::string, ExprPtr>> params;  // macro parameters and defaults
  std::vector<ExprPtr> filters;                         // kFilter expressions whose `a` is null
};

}  // namespace failsafe::jinja
