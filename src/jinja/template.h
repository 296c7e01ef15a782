// A Jinja2 template, parsed once and rendered many times, with the settings
// Hugging Face renders chat templates with (trim_blocks, lstrip_blocks, no
// autoescape, loop controls). Output is byte-identical to Python's jinja2 for
// the supported subset (see parser.h); anything outside it fails at Parse.
//
// Thread-safety: immutable after Parse; Render may run on several threads at
// once (each render has its own interpreter).
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "common/status.h"
#include "jinja/ast.h"
#include "jinja/value.h"

namespace failsafe::jinja {

class Template {
 public:
  // `name` names the template in error messages.
  static Result<std::unique_ptr<Template>> Parse(std::string_view source, const std::string& name);

  // Renders with `context` as the template's variables. Errors name the
  // template and line.
  Result<std::string> Render(const Dict& context) const;

 private:
  Template() = default;
  std::string name_;
  Body body_;
};

}  // namespace failsafe::jinja
