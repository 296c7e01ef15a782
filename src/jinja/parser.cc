#include "jinja/parser.h"

#include <cerrno>
#include <set>

#include "jinja/builtins.h"

namespace failsafe::jinja {

namespace {

using Type = Token::Type;

class Parser {
 public:
  explicit Parser(const std::vector<Token>& t) : t_(t) {}

  Result<Body> Template() {
    Body body;
    std::string end;
    FS_RETURN_IF_ERROR(ParseBody({}, &body, &end));
    FS_RETURN_IF_ERROR(CheckCalls(body));
    return body;
  }

 private:
  const Token& Cur() const { return t_[pos_]; }
  const Token& Peek(int k = 1) const { return t_[std::min(pos_ + k, t_.size() - 1)]; }
  void Next() {
    if (pos_ + 1 < t_.size()) ++pos_;
  }
  bool IsOp(const char* op) const { return Cur().type == Type::kOp && Cur().text == op; }
  bool IsName(const char* n) const { return Cur().type == Type::kName && Cur().text == n; }
  bool SkipOp(const char* op) {
    if (!IsOp(op)) return false;
    Next();
    return true;
  }
  bool SkipName(const char* n) {
    if (!IsName(n)) return false;
    Next();
    return true;
  }
  Status Error(const std::string& what) const {
    return InvalidArgument("line {}: {}", Cur().line, what);
  }
  Status ExpectOp(const char* op) {
    if (SkipOp(op)) return Status::Ok();
    return Error(fmt::format("expected '{}'", op));
  }
  Status ExpectBlockEnd() {
    if (Cur().type == Type::kBlockEnd) {
      Next();
      return Status::Ok();
    }
    return Error("expected the end of the statement ('%}')");
  }
  Result<std::string> ExpectName() {
    if (Cur().type != Type::kName) return Error("expected a name");
    std::string n = Cur().text;
    Next();
    return n;
  }

  // Statements until a block tag named in `ends` (left unconsumed; its name in *end).
  Status ParseBody(const std::set<std::string>& ends, Body* body, std::string* end) {
    while (true) {
      const Token& tok = Cur();
      if (tok.type == Type::kEof) {
        if (ends.empty()) return Status::Ok();
        std::string want = *ends.begin();
        for (const auto& e : ends) {
          if (e.rfind("end", 0) == 0) want = e;
        }
        return Error(fmt::format("unexpected end of template: expected '{{% {} %}}'", want));
      }
      if (tok.type == Type::kData) {
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::kText;
        s->text = tok.text;
        body->push_back(std::move(s));
        Next();
        continue;
      }
      if (tok.type == Type::kVarBegin) {
        Next();
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::kOutput;
        s->line = tok.line;
        FS_ASSIGN_OR_RETURN(s->expr, Tuple(/*explicit_parens=*/false));
        if (Cur().type != Type::kVarEnd) return Error("expected the end of the print ('}}')");
        Next();
        body->push_back(std::move(s));
        continue;
      }
      if (tok.type != Type::kBlockBegin) return Error("unexpected token");
      const Token& name = Peek();
      if (name.type != Type::kName) return Error("expected a statement name after '{%'");
      if (ends.count(name.text)) {
        Next();  // at the name
        *end = name.text;
        return Status::Ok();
      }
      Next();
      FS_ASSIGN_OR_RETURN(auto stmt, Statement());
      body->push_back(std::move(stmt));
    }
  }

  // Bounds the recursion of nested statements and expressions.
  class Nest {
   public:
    explicit Nest(int* depth) : depth_(depth) { ++*depth_; }
    ~Nest() { --*depth_; }
    bool too_deep() const { return *depth_ > 200; }

   private:
    int* depth_;
  };

  Result<std::unique_ptr<Stmt>> Statement() {
    Nest nest(&depth_);
    if (nest.too_deep()) return Error("statements nest deeper than 200 levels");
    auto s = std::make_unique<Stmt>();
    s->line = Cur().line;
    const std::string word = Cur().text;
    Next();
    std::string end;
    if (word == "if") {
      s->kind = Stmt::Kind::kIf;
      FS_ASSIGN_OR_RETURN(auto cond, Expression());
      s->conds.push_back(std::move(cond));
      FS_RETURN_IF_ERROR(ExpectBlockEnd());
      while (true) {
        s->bodies.emplace_back();
        FS_RETURN_IF_ERROR(ParseBody({"elif", "else", "endif"}, &s->bodies.back(), &end));
        Next();  // the tag name
        if (end == "elif") {
          FS_ASSIGN_OR_RETURN(auto c, Expression());
          s->conds.push_back(std::move(c));
          FS_RETURN_IF_ERROR(ExpectBlockEnd());
          continue;
        }
        FS_RETURN_IF_ERROR(ExpectBlockEnd());
        if (end == "else") {
          FS_RETURN_IF_ERROR(ParseBody({"endif"}, &s->else_body, &end));
          Next();
          FS_RETURN_IF_ERROR(ExpectBlockEnd());
        }
        return s;
      }
    }
    if (word == "for") {
      s->kind = Stmt::Kind::kFor;
      FS_ASSIGN_OR_RETURN(s->targets, AssignTargets(false));
      if (!SkipName("in")) return Error("expected 'in' in the for statement");
      FS_ASSIGN_OR_RETURN(s->expr, Tuple(false, /*with_condexpr=*/false));
      if (SkipName("if")) {
        FS_ASSIGN_OR_RETURN(s->cond, Expression());
      }
      if (IsName("recursive")) return Error("unsupported construct: recursive for loops");
      FS_RETURN_IF_ERROR(ExpectBlockEnd());
      ++loop_depth_;
      FS_RETURN_IF_ERROR(ParseBody({"else", "endfor"}, &s->body, &end));
      --loop_depth_;
      Next();
      FS_RETURN_IF_ERROR(ExpectBlockEnd());
      if (end == "else") {
        FS_RETURN_IF_ERROR(ParseBody({"endfor"}, &s->else_body, &end));
        Next();
        FS_RETURN_IF_ERROR(ExpectBlockEnd());
      }
      return s;
    }
    if (word == "set") {
      FS_ASSIGN_OR_RETURN(s->targets, AssignTargets(true));
      if (SkipOp("=")) {
        s->kind = Stmt::Kind::kSet;
        FS_ASSIGN_OR_RETURN(s->expr, Tuple(false));
        FS_RETURN_IF_ERROR(ExpectBlockEnd());
        return s;
      }
      s->kind = Stmt::Kind::kSetBlock;
      if (s->targets.size() != 1) return Error("a block set assigns one name");
      FS_RETURN_IF_ERROR(FilterChain(&s->filters));
      FS_RETURN_IF_ERROR(ExpectBlockEnd());
      FS_RETURN_IF_ERROR(ParseBody({"endset"}, &s->body, &end));
      Next();
      FS_RETURN_IF_ERROR(ExpectBlockEnd());
      return s;
    }
    if (word == "macro") {
      s->kind = Stmt::Kind::kMacro;
      FS_ASSIGN_OR_RETURN(s->text, ExpectName());
      macros_.insert(s->text);
      FS_RETURN_IF_ERROR(ExpectOp("("));
      while (!IsOp(")")) {
        if (!s->params.empty()) FS_RETURN_IF_ERROR(ExpectOp(","));
        if (IsOp(")")) break;
        FS_ASSIGN_OR_RETURN(std::string p, ExpectName());
        ExprPtr def;
        if (SkipOp("=")) {
          FS_ASSIGN_OR_RETURN(def, Expression());
        }
        s->params.emplace_back(p, std::move(def));
      }
      Next();
      FS_RETURN_IF_ERROR(ExpectBlockEnd());
      const int saved = loop_depth_;
      loop_depth_ = 0;
      FS_RETURN_IF_ERROR(ParseBody({"endmacro"}, &s->body, &end));
      loop_depth_ = saved;
      Next();
      if (Cur().type == Type::kName) Next();  // {% endmacro name %}
      FS_RETURN_IF_ERROR(ExpectBlockEnd());
      return s;
    }
    if (word == "filter") {
      s->kind = Stmt::Kind::kFilterBlock;
      FS_RETURN_IF_ERROR(FilterChain(&s->filters, /*leading_pipe=*/false));
      FS_RETURN_IF_ERROR(ExpectBlockEnd());
      FS_RETURN_IF_ERROR(ParseBody({"endfilter"}, &s->body, &end));
      Next();
      FS_RETURN_IF_ERROR(ExpectBlockEnd());
      return s;
    }
    if (word == "with") {
      s->kind = Stmt::Kind::kWith;
      while (Cur().type != Type::kBlockEnd) {
        if (!s->targets.empty()) FS_RETURN_IF_ERROR(ExpectOp(","));
        FS_ASSIGN_OR_RETURN(std::string n, ExpectName());
        FS_RETURN_IF_ERROR(ExpectOp("="));
        FS_ASSIGN_OR_RETURN(auto v, Expression());
        s->targets.push_back(n);
        s->values.push_back(std::move(v));
      }
      FS_RETURN_IF_ERROR(ExpectBlockEnd());
      FS_RETURN_IF_ERROR(ParseBody({"endwith"}, &s->body, &end));
      Next();
      FS_RETURN_IF_ERROR(ExpectBlockEnd());
      return s;
    }
    if (word == "break" || word == "continue") {
      if (loop_depth_ == 0) return Error(fmt::format("'{}' outside of a loop", word));
      s->kind = word == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue;
      FS_RETURN_IF_ERROR(ExpectBlockEnd());
      return s;
    }
    if (word == "generation") {
      s->kind = Stmt::Kind::kGeneration;
      FS_RETURN_IF_ERROR(ExpectBlockEnd());
      FS_RETURN_IF_ERROR(ParseBody({"endgeneration"}, &s->body, &end));
      Next();
      FS_RETURN_IF_ERROR(ExpectBlockEnd());
      return s;
    }
    return InvalidArgument("line {}: unsupported statement '{{% {} %}}'", s->line, word);
  }

  // Names to assign: `a`, `a, b`, `(a, b)`, or (for set) `ns.attr`.
  Result<std::vector<std::string>> AssignTargets(bool allow_attr) {
    std::vector<std::string> names;
    const bool parens = SkipOp("(");
    do {
      if (parens && IsOp(")")) break;
      FS_ASSIGN_OR_RETURN(std::string n, ExpectName());
      if (allow_attr && IsOp(".")) {
        Next();
        FS_ASSIGN_OR_RETURN(std::string attr, ExpectName());
        n += "." + attr;
      }
      names.push_back(n);
    } while (SkipOp(","));
    if (parens) FS_RETURN_IF_ERROR(ExpectOp(")"));
    for (const auto& n : names) {
      if (n.find('.') != std::string::npos && names.size() > 1)
        return Error("an attribute assignment assigns one target");
    }
    return names;
  }

  // `| f(args) | g` (the leading pipe optional for {% filter %}).
  Status FilterChain(std::vector<ExprPtr>* out, bool leading_pipe = true) {
    bool first = true;
    while ((first && !leading_pipe) || IsOp("|")) {
      if (!(first && !leading_pipe)) Next();
      first = false;
      FS_ASSIGN_OR_RETURN(auto f, FilterCall(nullptr));
      out->push_back(std::move(f));
    }
    return Status::Ok();
  }

  ExprPtr Make(Expr::Kind k) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->line = Cur().line;
    return e;
  }

  // A comma-separated tuple, or a single expression when there is no comma.
  Result<ExprPtr> Tuple(bool explicit_parens, bool with_condexpr = true) {
    auto t = Make(Expr::Kind::kTuple);
    bool comma = false;
    while (true) {
      if (!t->items.empty()) {
        if (!SkipOp(",")) break;
        comma = true;
      }
      if (Cur().type == Type::kVarEnd || Cur().type == Type::kBlockEnd || IsOp(")") ||
          (!with_condexpr && IsName("if")) || IsName("in")) {
        break;
      }
      FS_ASSIGN_OR_RETURN(auto e, with_condexpr ? Expression() : Or());
      t->items.push_back(std::move(e));
    }
    if (t->items.empty() && !explicit_parens) return Error("expected an expression");
    if (t->items.size() == 1 && !comma) return std::move(t->items[0]);
    return t;
  }

  Result<ExprPtr> Expression() {
    Nest nest(&depth_);
    if (nest.too_deep()) return Error("expressions nest deeper than 200 levels");
    FS_ASSIGN_OR_RETURN(auto a, Or());
    while (IsName("if")) {
      auto c = Make(Expr::Kind::kCondition);
      Next();
      FS_ASSIGN_OR_RETURN(c->a, Or());  // the condition
      c->b = std::move(a);              // if true
      if (SkipName("else")) {
        FS_ASSIGN_OR_RETURN(c->c, Expression());
      }
      a = std::move(c);
    }
    return a;
  }

  Result<ExprPtr> Binary(Result<ExprPtr> (Parser::*sub)(), std::initializer_list<const char*> ops,
                         bool names) {
    FS_ASSIGN_OR_RETURN(auto a, (this->*sub)());
    while (true) {
      const char* hit = nullptr;
      for (const char* op : ops) {
        if (names ? IsName(op) : IsOp(op)) hit = op;
      }
      if (!hit) return a;
      auto e = Make(Expr::Kind::kBinary);
      e->name = hit;
      Next();
      FS_ASSIGN_OR_RETURN(e->b, (this->*sub)());
      e->a = std::move(a);
      a = std::move(e);
    }
  }
  Result<ExprPtr> Or() { return Binary(&Parser::And, {"or"}, true); }
  Result<ExprPtr> And() { return Binary(&Parser::Not, {"and"}, true); }
  Result<ExprPtr> Not() {
    if (IsName("not")) {
      auto e = Make(Expr::Kind::kNot);
      Next();
      FS_ASSIGN_OR_RETURN(e->a, Not());
      return e;
    }
    return Compare();
  }
  Result<ExprPtr> Compare() {
    FS_ASSIGN_OR_RETURN(auto a, Math1());
    auto e = Make(Expr::Kind::kCompare);
    while (true) {
      std::string op;
      if (Cur().type == Type::kOp &&
          (Cur().text == "==" || Cur().text == "!=" || Cur().text == "<" || Cur().text == ">" ||
           Cur().text == "<=" || Cur().text == ">=")) {
        op = Cur().text;
        Next();
      } else if (IsName("in")) {
        op = "in";
        Next();
      } else if (IsName("not") && Peek().type == Type::kName && Peek().text == "in") {
        op = "notin";
        Next();
        Next();
      } else {
        break;
      }
      FS_ASSIGN_OR_RETURN(auto b, Math1());
      e->ops.push_back(op);
      e->items.push_back(std::move(b));
    }
    if (e->ops.empty()) return a;
    e->a = std::move(a);
    return e;
  }
  Result<ExprPtr> Math1() { return Binary(&Parser::Concat, {"+", "-"}, false); }
  Result<ExprPtr> Concat() { return Binary(&Parser::Math2, {"~"}, false); }
  Result<ExprPtr> Math2() { return Binary(&Parser::Pow, {"*", "/", "//", "%"}, false); }
  Result<ExprPtr> Pow() { return Binary(&Parser::UnaryWithFilter, {"**"}, false); }
  Result<ExprPtr> UnaryWithFilter() { return Unary(true); }

  Result<ExprPtr> Unary(bool with_filter) {
    Nest nest(&depth_);
    if (nest.too_deep()) return Error("expressions nest deeper than 200 levels");
    ExprPtr node;
    if (IsOp("-") || IsOp("+")) {
      node = Make(IsOp("-") ? Expr::Kind::kNeg : Expr::Kind::kPos);
      Next();
      FS_ASSIGN_OR_RETURN(node->a, Unary(false));
    } else {
      FS_ASSIGN_OR_RETURN(node, Primary());
    }
    FS_ASSIGN_OR_RETURN(node, Postfix(std::move(node)));
    if (with_filter) {
      FS_ASSIGN_OR_RETURN(node, FilterExpr(std::move(node)));
    }
    return node;
  }

  Result<ExprPtr> Primary() {
    const Token& tok = Cur();
    if (tok.type == Type::kName) {
      static const std::set<std::string> kTrue = {"true", "True"}, kFalse = {"false", "False"},
                                         kNone = {"none", "None"};
      auto e = Make(Expr::Kind::kLiteral);
      if (kTrue.count(tok.text)) {
        e->value = Value(true);
      } else if (kFalse.count(tok.text)) {
        e->value = Value(false);
      } else if (kNone.count(tok.text)) {
        e->value = Value::None();
      } else {
        e->kind = Expr::Kind::kName;
        e->name = tok.text;
      }
      Next();
      return e;
    }
    if (tok.type == Type::kString) {
      std::string s;
      while (Cur().type == Type::kString) {  // adjacent literals concatenate
        s += Cur().text;
        Next();
      }
      auto e = Make(Expr::Kind::kLiteral);
      e->value = Value(std::move(s));
      return e;
    }
    if (tok.type == Type::kInt || tok.type == Type::kFloat) {
      auto e = Make(Expr::Kind::kLiteral);
      if (tok.type == Type::kInt) {
        errno = 0;
        const long long v = std::strtoll(tok.text.c_str(), nullptr, 10);
        if (errno == ERANGE) return Error("integer literal out of range");
        e->value = Value(static_cast<int64_t>(v));
      } else {
        e->value = Value(std::strtod(tok.text.c_str(), nullptr));
      }
      Next();
      return e;
    }
    if (SkipOp("(")) {
      FS_ASSIGN_OR_RETURN(auto e, Tuple(true));
      FS_RETURN_IF_ERROR(ExpectOp(")"));
      return e;
    }
    if (IsOp("[")) {
      auto e = Make(Expr::Kind::kList);
      Next();
      while (!IsOp("]")) {
        if (!e->items.empty()) FS_RETURN_IF_ERROR(ExpectOp(","));
        if (IsOp("]")) break;
        FS_ASSIGN_OR_RETURN(auto x, Expression());
        e->items.push_back(std::move(x));
      }
      Next();
      return e;
    }
    if (IsOp("{")) {
      auto e = Make(Expr::Kind::kDict);
      Next();
      while (!IsOp("}")) {
        if (!e->items.empty()) FS_RETURN_IF_ERROR(ExpectOp(","));
        if (IsOp("}")) break;
        FS_ASSIGN_OR_RETURN(auto k, Expression());
        FS_RETURN_IF_ERROR(ExpectOp(":"));
        FS_ASSIGN_OR_RETURN(auto v, Expression());
        e->items.push_back(std::move(k));
        e->items.push_back(std::move(v));
      }
      Next();
      return e;
    }
    return Error(fmt::format("unexpected '{}'", tok.text.empty() ? "end of tag" : tok.text));
  }

  Result<ExprPtr> Postfix(ExprPtr node) {
    while (true) {
      if (IsOp(".")) {
        Next();
        if (Cur().type == Type::kName) {
          auto e = Make(Expr::Kind::kGetAttr);
          e->name = Cur().text;
          e->a = std::move(node);
          Next();
          node = std::move(e);
        } else if (Cur().type == Type::kInt) {
          auto e = Make(Expr::Kind::kGetItem);
          e->b = Make(Expr::Kind::kLiteral);
          errno = 0;
          const long long index = std::strtoll(Cur().text.c_str(), nullptr, 10);
          if (errno == ERANGE) return Error("integer literal out of range");
          e->b->value = Value(static_cast<int64_t>(index));
          e->a = std::move(node);
          Next();
          node = std::move(e);
        } else {
          return Error("expected an attribute name after '.'");
        }
      } else if (IsOp("[")) {
        Next();
        FS_ASSIGN_OR_RETURN(node, Subscript(std::move(node)));
      } else if (IsOp("(")) {
        FS_ASSIGN_OR_RETURN(node, Call(std::move(node)));
      } else {
        return node;
      }
    }
  }

  // After '[': an index or a slice, then ']'.
  Result<ExprPtr> Subscript(ExprPtr node) {
    ExprPtr parts[3];
    int colons = 0;
    while (!IsOp("]")) {
      if (SkipOp(":")) {
        if (++colons > 2) return Error("too many ':' in a slice");
        continue;
      }
      if (parts[colons]) return Error("expected ':' or ']'");
      FS_ASSIGN_OR_RETURN(parts[colons], Expression());
    }
    Next();
    if (colons == 0) {
      if (!parts[0]) return Error("expected a subscript");
      auto e = Make(Expr::Kind::kGetItem);
      e->a = std::move(node);
      e->b = std::move(parts[0]);
      return e;
    }
    auto e = Make(Expr::Kind::kSlice);
    e->a = std::move(node);
    e->b = std::move(parts[0]);
    e->c = std::move(parts[1]);
    e->d = std::move(parts[2]);
    return e;
  }

  // Arguments after '(' up to ')': positional, then name=value.
  Status Args(Expr* e) {
    FS_RETURN_IF_ERROR(ExpectOp("("));
    while (!IsOp(")")) {
      if (!e->items.empty() || !e->kwargs.empty()) FS_RETURN_IF_ERROR(ExpectOp(","));
      if (IsOp(")")) break;
      if (IsOp("*") || IsOp("**"))
        return Error("unsupported construct: *args / **kwargs in a call");
      if (Cur().type == Type::kName && Peek().type == Type::kOp && Peek().text == "=") {
        std::string k = Cur().text;
        Next();
        Next();
        FS_ASSIGN_OR_RETURN(auto v, Expression());
        e->kwargs.emplace_back(k, std::move(v));
        continue;
      }
      if (!e->kwargs.empty()) return Error("a positional argument follows keyword arguments");
      FS_ASSIGN_OR_RETURN(auto v, Expression());
      e->items.push_back(std::move(v));
    }
    Next();
    return Status::Ok();
  }

  Result<ExprPtr> Call(ExprPtr callee) {
    auto e = Make(Expr::Kind::kCall);
    if (callee->kind == Expr::Kind::kGetAttr && !IsKnownMethod(callee->name) &&
        !(callee->a->kind == Expr::Kind::kName && callee->a->name == "loop" &&
          callee->name == "cycle")) {
      return Error(fmt::format("unsupported method '{}()'", callee->name));
    }
    if (callee->kind == Expr::Kind::kName) called_.emplace_back(callee->name, callee->line);
    e->a = std::move(callee);
    FS_RETURN_IF_ERROR(Args(e.get()));
    return e;
  }

  Result<ExprPtr> FilterCall(ExprPtr value) {
    auto f = Make(Expr::Kind::kFilter);
    FS_ASSIGN_OR_RETURN(f->name, ExpectName());
    while (IsOp(".")) {  // dotted filter names
      Next();
      FS_ASSIGN_OR_RETURN(std::string part, ExpectName());
      f->name += "." + part;
    }
    if (!IsKnownFilter(f->name)) return Error(fmt::format("unsupported filter '{}'", f->name));
    if (IsOp("(")) FS_RETURN_IF_ERROR(Args(f.get()));
    f->a = std::move(value);
    return f;
  }

  Result<ExprPtr> FilterExpr(ExprPtr node) {
    while (true) {
      if (IsOp("|")) {
        Next();
        FS_ASSIGN_OR_RETURN(node, FilterCall(std::move(node)));
      } else if (IsName("is")) {
        Next();
        auto t = Make(Expr::Kind::kTest);
        t->negated = SkipName("not");
        FS_ASSIGN_OR_RETURN(t->name, ExpectName());
        if (!IsKnownTest(t->name)) return Error(fmt::format("unsupported test '{}'", t->name));
        if (IsOp("(")) {
          FS_RETURN_IF_ERROR(Args(t.get()));
        } else if ((Cur().type == Type::kName || Cur().type == Type::kString ||
                    Cur().type == Type::kInt || Cur().type == Type::kFloat || IsOp("(") ||
                    IsOp("[") || IsOp("{")) &&
                   !IsName("else") && !IsName("or") && !IsName("and")) {
          if (IsName("is")) return Error("you cannot chain multiple tests with 'is'");
          FS_ASSIGN_OR_RETURN(auto arg, Primary());
          FS_ASSIGN_OR_RETURN(arg, Postfix(std::move(arg)));
          t->items.push_back(std::move(arg));
        }
        t->a = std::move(node);
        node = std::move(t);
      } else if (IsOp("(")) {
        FS_ASSIGN_OR_RETURN(node, Call(std::move(node)));
      } else {
        return node;
      }
    }
  }

  // A called name must be a global function, a macro or a variable the
  // template assigns.
  Status CheckCalls(const Body&) {
    for (const auto& [name, line] : called_) {
      if (IsKnownGlobal(name) || macros_.count(name) || name == "raise_exception" ||
          name == "strftime_now" || name == "caller") {
        continue;
      }
      return InvalidArgument("line {}: unsupported function '{}()'", line, name);
    }
    return Status::Ok();
  }

  const std::vector<Token>& t_;
  size_t pos_ = 0;
  int loop_depth_ = 0;
  int depth_ = 0;
  std::set<std::string> macros_;
  std::vector<std::pair<std::string, int>> called_;
};

}  // namespace

Result<Body> ParseTemplate(const std::vector<Token>& tokens) { return Parser(tokens).Template(); }

}  // namespace failsafe::jinja
