// Tokenizes a template as Jinja2's lexer does with the settings Hugging Face
// uses: trim_blocks and lstrip_blocks on, keep_trailing_newline off, "-" and
// "+" whitespace control on every tag, comments dropped, raw blocks as text,
// newlines normalised to "\n".
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace failsafe::jinja {

struct Token {
  enum class Type {
    kData,        // template text
    kVarBegin,    // {{
    kVarEnd,      // }}
    kBlockBegin,  // {%
    kBlockEnd,    // %}
    kName,
    kString,  // text holds the decoded value
    kInt,
    kFloat,
    kOp,  // + - * / // % ** ~ == != < > <= >= = ( ) [ ] { } , . : | ;
    kEof,
  };
  Type type;
  std::string text;
  int line = 1;
};

// Errors name the line.
Result<std::vector<Token>> Tokenize(std::string_view source);

// Python's str.isspace() for one code point.
bool IsPythonSpace(int cp);

}  // namespace failsafe::jinja
