// Parses template tokens into statements, as Jinja2's parser does, for the
// subset chat templates use: if/elif/else, for (with else, a filter
// condition, break/continue), set (names, tuples, namespace attributes,
// blocks), macro, filter blocks, with, raw, comments, and Hugging Face's
// generation tag. Expressions have Jinja2's precedence, filters, tests,
// calls, attributes, subscripts and slices.
//
// Anything else — include, import, extends, block, call blocks, a filter,
// test, method or function the interpreter does not have — is an error that
// names the construct and its line, so a template is refused at load rather
// than rendered wrong.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "jinja/ast.h"
#include "jinja/lexer.h"

namespace failsafe::jinja {

Result<Body> ParseTemplate(const std::vector<Token>& tokens);

}  // namespace failsafe::jinja
