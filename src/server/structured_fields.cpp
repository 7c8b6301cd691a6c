#include "server/structured_fields.h"

#include <string>
#include <utility>
#include <vector>

#include "longctx/core/json_limits.h"
#include "structured/json_schema.h"
#include "structured/regex.h"

namespace longctx::server {

namespace {

const Json* member(const Json& body, const char* name) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

[[noreturn]] void bad(const std::string& param, const std::string& message) {
  throw ApiError(400, message, param);
}

StructuredOutput regex_output(const std::string& name, const Json& v) {
  if (!v.is_string()) bad(name, "'" + name + "' must be a string, got " + json_excerpt(v));
  StructuredOutput so;
  so.kind = StructuredOutput::Kind::kRegex;
  so.regex = v.get<std::string>();
  try {
    structured::regex_grammar(so.regex);
  } catch (const Error& e) {
    bad(name, name + ": " + e.what());
  }
  return so;
}

StructuredOutput choice_output(const std::string& name, const Json& v) {
  if (!v.is_array() || v.empty())
    bad(name, "'" + name + "' must be a non-empty array of strings, got " + json_excerpt(v));
  StructuredOutput so;
  so.kind = StructuredOutput::Kind::kChoice;
  for (const Json& c : v) {
    if (!c.is_string())
      bad(name,
          "'" + name + "' must be a non-empty array of strings, got " + json_excerpt(c) + " in it");
    so.choices.push_back(c.get<std::string>());
  }
  return so;
}

StructuredOutput json_output(const std::string& name, const Json& v) {
  // vLLM takes the schema as an object or as its JSON text.
  Json schema = v;
  if (v.is_string()) {
    try {
      schema = parse_ordered_json(v.get<std::string>(), name);
    } catch (const Error& e) {
      bad(name, e.what());
    }
  }
  if (!schema.is_object() && !schema.is_boolean())
    bad(name, "'" + name + "' must be a JSON schema (an object), got " + json_excerpt(v));
  try {
    structured::json_schema_grammar(schema);
  } catch (const Error& e) {
    bad(name, name + ": " + e.what());
  }
  StructuredOutput so;
  so.kind = StructuredOutput::Kind::kJsonSchema;
  so.json_schema = schema.dump();
  return so;
}

}  // namespace

void parse_structured_fields(const Json& body, SamplingParams& sp) {
  std::vector<std::pair<std::string, StructuredOutput>> found;
  if (sp.structured.enabled()) found.emplace_back("response_format", sp.structured);
  if (const Json* so = member(body, "structured_outputs")) {
    if (!so->is_object())
      bad("structured_outputs", "'structured_outputs' must be an object, got " + json_excerpt(*so));
    for (const auto& [k, v] : so->items()) {
      const std::string name = "structured_outputs." + k;
      if (v.is_null()) continue;
      if (k == "regex") {
        found.emplace_back(name, regex_output(name, v));
      } else if (k == "choice") {
        found.emplace_back(name, choice_output(name, v));
      } else if (k == "json") {
        found.emplace_back(name, json_output(name, v));
      } else if (k == "json_object") {
        if (!v.is_boolean()) bad(name, "'" + name + "' must be a boolean");
        if (v.get<bool>()) {
          StructuredOutput o;
          o.kind = StructuredOutput::Kind::kJsonObject;
          found.emplace_back(name, o);
        }
      } else if (k == "disable_fallback" || k == "disable_any_whitespace" ||
                 k == "disable_additional_properties") {
        // Backend switches of vLLM's; this engine has one backend and writes no whitespace.
        if (!v.is_boolean()) bad(name, "'" + name + "' must be a boolean");
      } else {
        bad(name, "'" + name + "' is not supported (json, regex, choice and json_object are)");
      }
    }
  }
  if (const Json* v = member(body, "guided_regex"))
    found.emplace_back("guided_regex", regex_output("guided_regex", *v));
  if (const Json* v = member(body, "guided_choice"))
    found.emplace_back("guided_choice", choice_output("guided_choice", *v));
  if (const Json* v = member(body, "guided_json"))
    found.emplace_back("guided_json", json_output("guided_json", *v));
  if (found.size() > 1)
    bad(found[1].first, "'" + found[0].first + "' and '" + found[1].first +
                            "' cannot be combined (one kind of structured output per request)");
  if (found.size() == 1) sp.structured = std::move(found[0].second);
}

}  // namespace longctx::server
