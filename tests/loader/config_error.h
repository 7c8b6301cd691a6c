// The message parse_model_config throws for a config.json (empty when it parses), for the loader
// tests that check a malformed config is refused by name.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "longctx/core/error.h"
#include "longctx/loader/model_config.h"

namespace longctx::testing {

inline std::string config_error_of(const nlohmann::json& j) {
  try {
    parse_model_config(j, "config.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace longctx::testing
