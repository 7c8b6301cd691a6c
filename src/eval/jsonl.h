// Sample files in JSON Lines (RULER's validation.jsonl, `longctx needle`'s samples): one JSON
// object per line, blank lines skipped, every error naming the file and line ("path:line").
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "longctx/core/error.h"

namespace longctx::eval {

// Calls fn(object, where) for each non-blank line of `path`, in order, with where =
// "path:line", until fn returns false. Throws Error(kNotFound) "cannot open <what> file <path>"
// when the file cannot be opened, Error(kInvalidArgument) "<where>: not JSON (...)" or "<where>:
// not a JSON object" for a bad line (nesting is limited before parsing), and "<path>: no
// samples" when fn was never called.
void for_each_jsonl_object(
    const std::string& path, const std::string& what,
    const std::function<bool(const nlohmann::json&, const std::string&)>& fn);

// j[name] as T. Throws Error(kInvalidArgument) "<where>: sample has no "<name>" field" or
// "<where>: field "<name>" has the wrong type (<json type>)".
template <typename T>
T json_field(const nlohmann::json& j, const char* name, const std::string& where) {
  LONGCTX_CHECK(j.contains(name), ErrorCode::kInvalidArgument, "{}: sample has no \"{}\" field",
                where, name);
  try {
    return j.at(name).get<T>();
  } catch (const nlohmann::json::exception&) {
    LONGCTX_THROW(ErrorCode::kInvalidArgument, "{}: field \"{}\" has the wrong type ({})", where,
                  name, j.at(name).type_name());
  }
}

}  // namespace longctx::eval
