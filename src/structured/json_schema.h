// JSON Schema -> Grammar (structured/grammar.h): the grammar of the compact JSON documents (no
// whitespace) that a schema accepts, or of any JSON object. docs/server.md ("Structured
// outputs") lists what is supported; in short:
//  - type (one or a list), enum, const, anyOf / oneOf (oneOf as anyOf), allOf of one schema,
//    $ref to "#", "#/$defs/..." or "#/definitions/..." (recursion allowed);
//  - object: properties are written in the schema's order (as xgrammar), required ones always,
//    optional ones possibly skipped; required names missing from properties take any value;
//    no other property is ever generated, whatever additionalProperties says (the document is
//    valid either way). An object without properties takes any keys, its values
//    additionalProperties' schema (any value without one);
//  - array: items (one schema), minItems, maxItems;
//  - string: minLength, maxLength (code points), escapes except \u surrogates;
//  - integer: minimum, maximum, exclusiveMinimum, exclusiveMaximum exactly;
//  - number: without bounds any JSON number without exponent; with bounds only the integers
//    within them (so the bounds hold exactly);
//  - boolean, null; annotations (title, description, default, examples, $schema, $id, ...)
//    are ignored.
// Anything else throws Error(kUnsupported) "JSON schema: '<keyword>' (at <path>) is not
// supported", so a caller can answer 400 naming the keyword.
#pragma once

#include <nlohmann/json.hpp>

#include "structured/grammar.h"

namespace longctx::structured {

// Counted repetitions (maxLength, maxItems, digit counts) are unrolled; larger bounds are refused.
constexpr int64_t kMaxUnrolledRepeat = 10000;

// `schema` ordered as the client wrote it: properties are generated in that order.
Grammar json_schema_grammar(const nlohmann::ordered_json& schema);
Grammar any_json_object_grammar();

}  // namespace longctx::structured
