// vLLM's request fields for structured outputs beside OpenAI's response_format:
// `structured_outputs: {"json" | "regex" | "choice" | "json_object"}` and the older top-level
// `guided_json`, `guided_regex`, `guided_choice`. One kind of constraint per request: two (from
// these fields or response_format) are a 400 naming both.
#pragma once

#include "longctx/engine/sampling_params.h"
#include "server/openai_protocol.h"

namespace longctx::server {

// Fills sp.structured from the fields (response_format, parsed before, counts as one).
// Patterns and schemas are compiled here so a bad one is a 400 naming the field.
void parse_structured_fields(const Json& body, SamplingParams& sp);

}  // namespace longctx::server
