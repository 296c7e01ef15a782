#include "jinja/interpreter.h"

#include <cmath>

#include "jinja/builtins.h"
#include "jinja/strings.h"

namespace failsafe::jinja {

namespace {

// A macro: parameters with defaults, and a body run in its own scope.
class Macro : public Function {
 public:
  Macro(const Stmt* def, std::vector<Value> defaults) : def_(def), defaults_(std::move(defaults)) {}
  Result<Value> Call(Interpreter& in, ValueList args, KwArgs kwargs) const override {
    const auto& params = def_->params;
    if (args.size() > params.size()) {
      return InvalidArgument("macro '{}' takes not more than {} argument(s)", def_->text,
                             params.size());
    }
    std::unordered_map<std::string, Value> vars;
    for (size_t i = 0; i < params.size(); ++i) {
      if (i < args.size()) {
        vars[params[i].first] = args[i];
      } else if (params[i].second) {
        vars[params[i].first] = defaults_[i];
      } else {
        vars[params[i].first] = Value::Undefined(params[i].first);
      }
    }
    for (auto& [k, v] : kwargs) {
      bool known = false;
      for (const auto& p : params) known = known || p.first == k;
      if (!known)
        return InvalidArgument("macro '{}' takes no keyword argument '{}'", def_->text, k);
      vars[k] = std::move(v);
    }
    FS_ASSIGN_OR_RETURN(std::string out, in.RunMacroBody(def_->body, std::move(vars)));
    return Value(std::move(out));
  }
  std::string name() const override { return def_->text; }

 private:
  const Stmt* def_;
  std::vector<Value> defaults_;
};

// loop.cycle(a, b, ...).
class Cycle : public Function {
 public:
  explicit Cycle(int64_t index0) : index0_(index0) {}
  Result<Value> Call(Interpreter&, ValueList args, KwArgs) const override {
    if (args.empty()) return InvalidArgument("no items for cycling given");
    return args[static_cast<size_t>(index0_) % args.size()];
  }
  std::string name() const override { return "loop.cycle"; }

 private:
  int64_t index0_;
};

Status LineError(int line, const Status& st) {
  if (st.ok()) return st;
  const std::string& m = st.message();
  if (m.rfind("line ", 0) == 0) return st;
  return Status(st.code(), fmt::format("line {}: {}", line, m));
}

Result<int64_t> FloorDivInt(int64_t a, int64_t b) {
  if (b == 0) return InvalidArgument("integer division or modulo by zero");
  if (a == INT64_MIN && b == -1)
    return InvalidArgument("integer overflow: {} // -1 does not fit in 64 bits", a);
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

}  // namespace

Result<Value> BinaryOp(const std::string& op, const Value& a, const Value& b) {
  auto type_error = [&]() -> Status {
    return InvalidArgument("unsupported operand type(s) for {}: '{}' and '{}'", op, a.TypeName(),
                           b.TypeName());
  };
  if (a.is_undefined() || b.is_undefined()) {
    if (op == "~") return Value(a.Str() + b.Str());
    const Value& u = a.is_undefined() ? a : b;
    return InvalidArgument("'{}' is undefined", u.undefined_hint());
  }
  if (op == "~") return Value(a.Str() + b.Str());
  const bool nums = a.is_number() && b.is_number();
  const bool floats = nums && (a.is_float() || b.is_float());
  // Python's integers do not overflow; 64-bit ones do, and a wrapped number
  // would render wrong: past 64 bits is an error.
  // `overflowed` is computed before the call reads `exact`.
  int64_t exact = 0;
  auto checked = [&](bool overflowed) -> Result<Value> {
    if (overflowed) {
      return InvalidArgument("integer overflow: {} {} {} does not fit in 64 bits", a.as_int(), op,
                             b.as_int());
    }
    return Value(exact);
  };
  if (op == "+") {
    if (nums && !floats) return checked(__builtin_add_overflow(a.as_int(), b.as_int(), &exact));
    if (nums) return Value(a.as_double() + b.as_double());
    if (a.is_string() && b.is_string()) {
      if (!a.is_markup() && !b.is_markup()) return Value(a.as_string() + b.as_string());
      // Markup escapes the plain side (markupsafe's __add__ / __radd__).
      auto safe = [](const Value& v) {
        return v.is_markup() ? v.as_string() : HtmlEscape(v.as_string());
      };
      return Value::Markup(safe(a) + safe(b));
    }
    if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
      ValueList l = a.as_list();
      l.insert(l.end(), b.as_list().begin(), b.as_list().end());
      return a.is_tuple() ? Value::Tuple(std::move(l)) : Value(std::move(l));
    }
    return type_error();
  }
  if (op == "-") {
    if (!nums) return type_error();
    if (floats) return Value(a.as_double() - b.as_double());
    return checked(__builtin_sub_overflow(a.as_int(), b.as_int(), &exact));
  }
  if (op == "*") {
    if (nums && !floats) return checked(__builtin_mul_overflow(a.as_int(), b.as_int(), &exact));
    if (nums) return Value(a.as_double() * b.as_double());
    const Value* seq = a.is_number() ? &b : &a;
    const Value* n = a.is_number() ? &a : &b;
    if (!n->is_number() || n->is_float()) return type_error();
    const int64_t times = std::max<int64_t>(0, n->as_int());
    if (times > kMaxRepetition) return InvalidArgument("repetition count {} is too large", times);
    if (seq->is_string()) {
      std::string s;
      for (int64_t i = 0; i < times; ++i) s += seq->as_string();
      return seq->is_markup() ? Value::Markup(std::move(s)) : Value(std::move(s));
    }
    if (seq->is_list()) {
      ValueList l;
      for (int64_t i = 0; i < times; ++i)
        l.insert(l.end(), seq->as_list().begin(), seq->as_list().end());
      return Value(std::move(l));
    }
    return type_error();
  }
  if (!nums) {
    if (op == "%" && a.is_string()) {
      return InvalidArgument("unsupported construct: printf-style '%' string formatting");
    }
    return type_error();
  }
  if (op == "/") {
    if (b.as_double() == 0) return InvalidArgument("division by zero");
    return Value(a.as_double() / b.as_double());
  }
  if (op == "//") {
    if (floats) {
      if (b.as_double() == 0) return InvalidArgument("float floor division by zero");
      return Value(std::floor(a.as_double() / b.as_double()));
    }
    FS_ASSIGN_OR_RETURN(int64_t q, FloorDivInt(a.as_int(), b.as_int()));
    return Value(q);
  }
  if (op == "%") {
    if (floats) {
      if (b.as_double() == 0) return InvalidArgument("float modulo");
      const double r = std::fmod(a.as_double(), b.as_double());
      return Value((r != 0 && ((r < 0) != (b.as_double() < 0))) ? r + b.as_double() : r);
    }
    FS_ASSIGN_OR_RETURN(int64_t q, FloorDivInt(a.as_int(), b.as_int()));
    return Value(a.as_int() - q * b.as_int());
  }
  if (op == "**") {
    if (!floats && b.as_int() >= 0) {
      // By squaring: bases 0, 1 and -1 take any exponent, others overflow
      // within 63 squarings.
      int64_t result = 1, base = a.as_int();
      bool overflowed = false;
      for (int64_t e = b.as_int(); e > 0 && !overflowed; e >>= 1) {
        if (e & 1) overflowed |= __builtin_mul_overflow(result, base, &result);
        if (e > 1) overflowed |= __builtin_mul_overflow(base, base, &base);
      }
      exact = result;
      return checked(overflowed);
    }
    if (a.as_double() == 0 && b.as_double() < 0)
      return InvalidArgument("0.0 cannot be raised to a negative power");
    return Value(std::pow(a.as_double(), b.as_double()));
  }
  return InvalidArgument("unknown operator '{}'", op);
}

Interpreter::Interpreter(const Dict& context) : context_(context) {}

Result<std::string> Interpreter::Render(const Body& body) {
  std::string out;
  FS_RETURN_IF_ERROR(Exec(body, root_, &out).status());
  return out;
}

Result<std::string> Interpreter::RunMacroBody(const Body& body,
                                              std::unordered_map<std::string, Value> args) {
  if (++depth_ > 64) {
    --depth_;
    return InvalidArgument("macros nest deeper than 64 calls");
  }
  Scope scope;
  scope.vars = std::move(args);
  scope.parent = &root_;
  std::string out;
  auto flow = Exec(body, scope, &out);
  --depth_;
  FS_RETURN_IF_ERROR(flow.status());
  return out;
}

Result<Value> Interpreter::Call(const Value& f, ValueList args, KwArgs kwargs) {
  if (!f.is_function()) {
    if (f.is_undefined()) return InvalidArgument("'{}' is undefined", f.undefined_hint());
    return InvalidArgument("'{}' object is not callable", f.TypeName());
  }
  return f.as_function().Call(*this, std::move(args), std::move(kwargs));
}

Result<Value> Interpreter::Lookup(const std::string& name, Scope& scope) const {
  for (const Scope* s = &scope; s; s = s->parent) {
    auto it = s->vars.find(name);
    if (it != s->vars.end()) return it->second;
  }
  if (const Value* v = context_.Find(Value(name))) return *v;
  Value g = GlobalFunction(name);
  if (!g.is_undefined()) return g;
  return Value::Undefined(name);
}

Status Interpreter::Assign(const std::vector<std::string>& targets, const Value& v, Scope& scope,
                           int line) {
  if (targets.size() == 1) {
    const std::string& t = targets[0];
    const size_t dot = t.find('.');
    if (dot == std::string::npos) {
      scope.vars[t] = v;
      return Status::Ok();
    }
    FS_ASSIGN_OR_RETURN(Value ns, Lookup(t.substr(0, dot), scope));
    if (!ns.is_namespace()) {
      return InvalidArgument("line {}: cannot assign attribute on non-namespace object '{}'", line,
                             t.substr(0, dot));
    }
    ns.as_namespace().attrs.Set(Value(t.substr(dot + 1)), v);
    return Status::Ok();
  }
  FS_ASSIGN_OR_RETURN(ValueList items, v.Iterate());
  if (items.size() != targets.size()) {
    return InvalidArgument("line {}: cannot unpack {} values into {} names", line, items.size(),
                           targets.size());
  }
  for (size_t i = 0; i < targets.size(); ++i) scope.vars[targets[i]] = items[i];
  return Status::Ok();
}

Result<Interpreter::Flow> Interpreter::Exec(const Body& body, Scope& scope, std::string* out) {
  for (const auto& sp : body) {
    const Stmt& s = *sp;
    switch (s.kind) {
      case Stmt::Kind::kText:
        *out += s.text;
        break;
      case Stmt::Kind::kOutput: {
        auto v = Eval(*s.expr, scope);
        if (!v.ok()) return LineError(s.line, v.status());
        *out += v->Str();
        break;
      }
      case Stmt::Kind::kIf: {
        bool taken = false;
        for (size_t i = 0; i < s.conds.size() && !taken; ++i) {
          auto c = Eval(*s.conds[i], scope);
          if (!c.ok()) return LineError(s.line, c.status());
          if (c->Truthy()) {
            taken = true;
            FS_ASSIGN_OR_RETURN(Flow f, Exec(s.bodies[i], scope, out));
            if (f != Flow::kNormal) return f;
          }
        }
        if (!taken) {
          FS_ASSIGN_OR_RETURN(Flow f, Exec(s.else_body, scope, out));
          if (f != Flow::kNormal) return f;
        }
        break;
      }
      case Stmt::Kind::kFor:
        FS_RETURN_IF_ERROR(ExecFor(s, scope, out).status());
        break;
      case Stmt::Kind::kSet: {
        auto v = Eval(*s.expr, scope);
        if (!v.ok()) return LineError(s.line, v.status());
        FS_RETURN_IF_ERROR(Assign(s.targets, *v, scope, s.line));
        break;
      }
      case Stmt::Kind::kSetBlock:
      case Stmt::Kind::kFilterBlock: {
        std::string inner;
        FS_RETURN_IF_ERROR(Exec(s.body, scope, &inner).status());
        Value v(std::move(inner));
        for (const auto& f : s.filters) {
          auto args = EvalArgs(*f, scope);
          if (!args.ok()) return LineError(s.line, args.status());
          auto r = ApplyFilter(*this, f->name, v, std::move(args->first), std::move(args->second));
          if (!r.ok()) return LineError(s.line, r.status());
          v = std::move(*r);
        }
        if (s.kind == Stmt::Kind::kSetBlock) {
          FS_RETURN_IF_ERROR(Assign(s.targets, v, scope, s.line));
        } else {
          *out += v.Str();
        }
        break;
      }
      case Stmt::Kind::kMacro: {
        std::vector<Value> defaults;
        for (const auto& p : s.params) {
          if (!p.second) {
            defaults.emplace_back();
            continue;
          }
          auto d = Eval(*p.second, scope);
          if (!d.ok()) return LineError(s.line, d.status());
          defaults.push_back(*d);
        }
        scope.vars[s.text] = Value(std::make_shared<Macro>(&s, std::move(defaults)));
        break;
      }
      case Stmt::Kind::kWith: {
        Scope inner;
        inner.parent = &scope;
        for (size_t i = 0; i < s.targets.size(); ++i) {
          auto v = Eval(*s.values[i], scope);
          if (!v.ok()) return LineError(s.line, v.status());
          inner.vars[s.targets[i]] = *v;
        }
        FS_ASSIGN_OR_RETURN(Flow f, Exec(s.body, inner, out));
        if (f != Flow::kNormal) return f;
        break;
      }
      case Stmt::Kind::kGeneration: {
        FS_ASSIGN_OR_RETURN(Flow f, Exec(s.body, scope, out));
        if (f != Flow::kNormal) return f;
        break;
      }
      case Stmt::Kind::kBreak:
        return Flow::kBreak;
      case Stmt::Kind::kContinue:
        return Flow::kContinue;
    }
  }
  return Flow::kNormal;
}

Result<Interpreter::Flow> Interpreter::ExecFor(const Stmt& s, Scope& scope, std::string* out) {
  auto seq = Eval(*s.expr, scope);
  if (!seq.ok()) return LineError(s.line, seq.status());
  auto all = seq->Iterate();
  if (!all.ok()) return LineError(s.line, all.status());
  // The filter condition sees each item bound to the loop targets.
  ValueList items;
  Scope probe;
  probe.parent = &scope;
  for (const Value& v : *all) {
    if (s.cond) {
      FS_RETURN_IF_ERROR(Assign(s.targets, v, probe, s.line));
      auto keep = Eval(*s.cond, probe);
      if (!keep.ok()) return LineError(s.line, keep.status());
      if (!keep->Truthy()) continue;
    }
    items.push_back(v);
  }
  const int64_t n = static_cast<int64_t>(items.size());
  for (int64_t i = 0; i < n; ++i) {
    Scope body;
    body.parent = &scope;
    FS_RETURN_IF_ERROR(Assign(s.targets, items[i], body, s.line));
    Dict loop;
    loop.Set(Value("index"), Value(i + 1));
    loop.Set(Value("index0"), Value(i));
    loop.Set(Value("revindex"), Value(n - i));
    loop.Set(Value("revindex0"), Value(n - i - 1));
    loop.Set(Value("first"), Value(i == 0));
    loop.Set(Value("last"), Value(i == n - 1));
    loop.Set(Value("length"), Value(n));
    loop.Set(Value("depth"), Value(int64_t{1}));
    loop.Set(Value("depth0"), Value(int64_t{0}));
    loop.Set(Value("previtem"), i > 0 ? items[i - 1] : Value::Undefined("loop.previtem"));
    loop.Set(Value("nextitem"), i + 1 < n ? items[i + 1] : Value::Undefined("loop.nextitem"));
    loop.Set(Value("cycle"), Value(std::make_shared<Cycle>(i)));
    body.vars["loop"] = Value(std::move(loop));
    FS_ASSIGN_OR_RETURN(Flow f, Exec(s.body, body, out));
    if (f == Flow::kBreak) break;
  }
  if (n == 0) {
    FS_ASSIGN_OR_RETURN(Flow f, Exec(s.else_body, scope, out));
    (void)f;
  }
  return Flow::kNormal;
}

Result<std::pair<ValueList, KwArgs>> Interpreter::EvalArgs(const Expr& e, Scope& scope) {
  std::pair<ValueList, KwArgs> r;
  for (const auto& a : e.items) {
    FS_ASSIGN_OR_RETURN(Value v, Eval(*a, scope));
    r.first.push_back(std::move(v));
  }
  for (const auto& [k, a] : e.kwargs) {
    FS_ASSIGN_OR_RETURN(Value v, Eval(*a, scope));
    r.second.emplace_back(k, std::move(v));
  }
  return r;
}

Result<Value> Interpreter::EvalCompare(const Expr& e, Scope& scope) {
  FS_ASSIGN_OR_RETURN(Value left, Eval(*e.a, scope));
  for (size_t i = 0; i < e.ops.size(); ++i) {
    FS_ASSIGN_OR_RETURN(Value right, Eval(*e.items[i], scope));
    const std::string& op = e.ops[i];
    bool r = false;
    if (op == "==") {
      r = left.Equals(right);
    } else if (op == "!=") {
      r = !left.Equals(right);
    } else if (op == "in" || op == "notin") {
      FS_ASSIGN_OR_RETURN(bool in, ApplyTest(*this, "in", left, {right}));
      r = op == "in" ? in : !in;
    } else {
      const bool swap = op == ">" || op == "<=";
      FS_ASSIGN_OR_RETURN(bool less, swap ? Value::Less(right, left) : Value::Less(left, right));
      if (op == "<" || op == ">") {
        r = less;
      } else {  // <= is not (right < left); >= is not (left < right)
        r = !less;
      }
    }
    if (!r) return Value(false);
    left = std::move(right);
  }
  return Value(true);
}

Result<Value> Interpreter::Eval(const Expr& e, Scope& scope) {
  switch (e.kind) {
    case Expr::Kind::kLiteral:
      return e.value;
    case Expr::Kind::kName:
      return Lookup(e.name, scope);
    case Expr::Kind::kList:
    case Expr::Kind::kTuple: {
      ValueList l;
      for (const auto& x : e.items) {
        FS_ASSIGN_OR_RETURN(Value v, Eval(*x, scope));
        l.push_back(std::move(v));
      }
      return e.kind == Expr::Kind::kTuple ? Value::Tuple(std::move(l)) : Value(std::move(l));
    }
    case Expr::Kind::kDict: {
      Dict d;
      for (size_t i = 0; i + 1 < e.items.size(); i += 2) {
        FS_ASSIGN_OR_RETURN(Value k, Eval(*e.items[i], scope));
        FS_ASSIGN_OR_RETURN(Value v, Eval(*e.items[i + 1], scope));
        d.Set(k, std::move(v));
      }
      return Value(std::move(d));
    }
    case Expr::Kind::kGetAttr: {
      FS_ASSIGN_OR_RETURN(Value obj, Eval(*e.a, scope));
      return GetAttribute(obj, e.name);
    }
    case Expr::Kind::kGetItem: {
      FS_ASSIGN_OR_RETURN(Value obj, Eval(*e.a, scope));
      FS_ASSIGN_OR_RETURN(Value key, Eval(*e.b, scope));
      return GetItem(obj, key);
    }
    case Expr::Kind::kSlice: {
      FS_ASSIGN_OR_RETURN(Value obj, Eval(*e.a, scope));
      Value parts[3];
      const Expr* exprs[3] = {e.b.get(), e.c.get(), e.d.get()};
      for (int i = 0; i < 3; ++i) {
        if (exprs[i]) {
          FS_ASSIGN_OR_RETURN(parts[i], Eval(*exprs[i], scope));
        }
      }
      return Slice(obj, parts[0], parts[1], parts[2]);
    }
    case Expr::Kind::kCall: {
      FS_ASSIGN_OR_RETURN(Value f, Eval(*e.a, scope));
      FS_ASSIGN_OR_RETURN(auto args, EvalArgs(e, scope));
      if (++depth_ > 64) {
        --depth_;
        return InvalidArgument("calls nest deeper than 64");
      }
      auto r = Call(f, std::move(args.first), std::move(args.second));
      --depth_;
      return r;
    }
    case Expr::Kind::kFilter: {
      FS_ASSIGN_OR_RETURN(Value v, Eval(*e.a, scope));
      FS_ASSIGN_OR_RETURN(auto args, EvalArgs(e, scope));
      return ApplyFilter(*this, e.name, v, std::move(args.first), std::move(args.second));
    }
    case Expr::Kind::kTest: {
      FS_ASSIGN_OR_RETURN(Value v, Eval(*e.a, scope));
      FS_ASSIGN_OR_RETURN(auto args, EvalArgs(e, scope));
      FS_ASSIGN_OR_RETURN(bool r, ApplyTest(*this, e.name, v, args.first));
      return Value(e.negated ? !r : r);
    }
    case Expr::Kind::kNot: {
      FS_ASSIGN_OR_RETURN(Value v, Eval(*e.a, scope));
      return Value(!v.Truthy());
    }
    case Expr::Kind::kNeg:
    case Expr::Kind::kPos: {
      FS_ASSIGN_OR_RETURN(Value v, Eval(*e.a, scope));
      if (!v.is_number())
        return InvalidArgument("bad operand type for unary {}: '{}'",
                               e.kind == Expr::Kind::kNeg ? "-" : "+", v.TypeName());
      if (e.kind == Expr::Kind::kPos) return v.is_bool() ? Value(v.as_int()) : v;
      return v.is_float() ? Value(-v.as_double()) : Value(-v.as_int());
    }
    case Expr::Kind::kBinary: {
      if (e.name == "and" || e.name == "or") {
        FS_ASSIGN_OR_RETURN(Value a, Eval(*e.a, scope));
        if ((e.name == "and") != a.Truthy()) return a;
        return Eval(*e.b, scope);
      }
      FS_ASSIGN_OR_RETURN(Value a, Eval(*e.a, scope));
      FS_ASSIGN_OR_RETURN(Value b, Eval(*e.b, scope));
      return BinaryOp(e.name, a, b);
    }
    case Expr::Kind::kCompare:
      return EvalCompare(e, scope);
    case Expr::Kind::kCondition: {
      FS_ASSIGN_OR_RETURN(Value c, Eval(*e.a, scope));
      if (c.Truthy()) return Eval(*e.b, scope);
      if (e.c) return Eval(*e.c, scope);
      return Value::Undefined("the else branch of a conditional expression");
    }
  }
  return Internal("unknown expression");
}

}  // namespace failsafe::jinja
