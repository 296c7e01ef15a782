// The grammar of the JSON texts a JSON schema accepts, for structured
// outputs (response_format json_schema, forced tool calls) and JSON mode.
//
// Supported: type (one or a list), properties / required (properties in the
// schema's order; optional ones may be left out; no others), an object
// without properties (any keys; values per additionalProperties), items,
// minItems / maxItems, enum, const, anyOf / oneOf, a one-schema allOf, $ref
// into #/$defs or #/definitions (recursion included), minLength /
// maxLength of strings. Annotations (title, description, default,
// examples, $schema, $id) are ignored, and so are format and numeric bounds
// (minimum, maximum, multipleOf): the text is valid JSON of the type, not
// checked against them. Any other keyword (pattern, not, if, ...) is an
// error naming it, never silently dropped.
//
// Whitespace between tokens is limited (a newline and up to 20 spaces or
// tabs) and numbers to 20 digits per part, so a model cannot wander forever
// in either.
#pragma once

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "server/grammar.h"

namespace failsafe {

Result<Grammar> JsonSchemaGrammar(const nlohmann::ordered_json& schema);
// Any JSON object (response_format {"type": "json_object"}).
Grammar JsonObjectGrammar();

}  // namespace failsafe
