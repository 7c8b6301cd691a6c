// Small helpers that turn missing or mistyped tokenizer.json fields into Errors naming the field.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "longctx/core/error.h"

namespace longctx::tokenizer::json_util {

using nlohmann::json;

inline const json& require(const json& j, const char* key, const std::string& where) {
  LONGCTX_CHECK(j.is_object(), ErrorCode::kInvalidArgument, "tokenizer.json: {} is not an object",
                where);
  auto it = j.find(key);
  LONGCTX_CHECK(it != j.end(), ErrorCode::kInvalidArgument,
                "tokenizer.json: {} has no field \"{}\"", where, key);
  return *it;
}

inline std::string require_string(const json& j, const char* key, const std::string& where) {
  const json& v = require(j, key, where);
  LONGCTX_CHECK(v.is_string(), ErrorCode::kInvalidArgument,
                "tokenizer.json: {}.{} must be a string", where, key);
  return v.get<std::string>();
}

// A bool field that may be absent or null (then `fallback`).
inline bool optional_bool(const json& j, const char* key, bool fallback, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  LONGCTX_CHECK(it->is_boolean(), ErrorCode::kInvalidArgument,
                "tokenizer.json: {}.{} must be a boolean", where, key);
  return it->get<bool>();
}

// Sequences of components (normalizers, pre-tokenizers, decoders, post-processors) may nest
// this deep; real files nest two levels. Each level recurses and lengthens the `where` path.
constexpr int kMaxComponentNesting = 16;

inline void check_nesting(int depth, const std::string& where) {
  LONGCTX_CHECK(depth <= kMaxComponentNesting, ErrorCode::kInvalidArgument,
                "tokenizer.json: {}: Sequences nested deeper than {} levels", where.substr(0, 120),
                kMaxComponentNesting);
}

inline std::string type_of(const json& j, const std::string& where) {
  return require_string(j, "type", where);
}

}  // namespace longctx::tokenizer::json_util
