// Jinja's built-in filters and tests, the Python str/dict methods templates call, and the globals
// transformers provides (raise_exception, namespace, range, dict, strftime_now).
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "template/value.h"

namespace longctx::jinja {

bool has_filter(std::string_view name);
bool has_test(std::string_view name);

Value apply_filter(const std::string& name, const Value& subject, const CallArgs& args);
bool apply_test(const std::string& name, const Value& subject, const CallArgs& args);

// Calls the Python method `name` of a str, list or dict; nullopt when the object has none.
std::optional<Value> call_method(const Value& object, const std::string& name,
                                 const CallArgs& args);

// `obj.attr` (and `obj[attr]` with a string): dict keys; missing -> undefined with Jinja's hint.
Value get_attribute(const Value& object, const std::string& attr);
// `obj[index]`: list/str index (negative from the end), dict key; missing -> undefined.
Value get_item(const Value& object, const Value& index);
// Python slicing obj[start:stop:step] on lists and strings (code points); null bounds are omitted.
Value slice(const Value& object, const Value* start, const Value* stop, const Value* step);

// Arithmetic with Python semantics: + - * / // % ** (and list/str + and *).
Value binary_op(const std::string& op, const Value& a, const Value& b);

// The template globals; raise_exception throws an Error whose message is exactly its argument.
Object make_globals();

// Thrown by raise_exception(): carries the template's message verbatim.
class TemplateRaised : public Error {
 public:
  explicit TemplateRaised(const std::string& message)
      : Error(ErrorCode::kInvalidArgument, message) {}
};

}  // namespace longctx::jinja
