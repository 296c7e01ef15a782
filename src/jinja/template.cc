#include "jinja/template.h"

#include "jinja/interpreter.h"
#include "jinja/lexer.h"
#include "jinja/parser.h"

namespace failsafe::jinja {

Result<std::unique_ptr<Template>> Template::Parse(std::string_view source,
                                                  const std::string& name) {
  auto tokens = Tokenize(source);
  if (!tokens.ok()) return InvalidArgument("{}: {}", name, tokens.status().message());
  auto body = ParseTemplate(*tokens);
  if (!body.ok()) return InvalidArgument("{}: {}", name, body.status().message());
  auto t = std::unique_ptr<Template>(new Template());
  t->name_ = name;
  t->body_ = std::move(body).value();
  return t;
}

Result<std::string> Template::Render(const Dict& context) const {
  Interpreter in(context);
  auto out = in.Render(body_);
  if (!out.ok())
    return Status(out.status().code(), fmt::format("{}: {}", name_, out.status().message()));
  return out;
}

}  // namespace failsafe::jinja
