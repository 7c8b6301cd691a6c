// Where test data lives: $LONGCTX_TEST_DATA_DIR when set (the GPU machine runs binaries built
// here from another path), else the source tree's tests/data.
#pragma once

#include <cstdlib>
#include <string>

namespace longctx::testing {

inline std::string test_data_dir() {
  if (const char* env = std::getenv("LONGCTX_TEST_DATA_DIR")) return env;
  return LONGCTX_TEST_DATA_DIR;
}

// build/test-data (fetched by tools/fetch_test_data.sh): $LONGCTX_FETCHED_DATA_DIR or the
// source tree's build/test-data.
inline std::string fetched_data_dir() {
  if (const char* env = std::getenv("LONGCTX_FETCHED_DATA_DIR")) return env;
  return std::string(LONGCTX_SOURCE_DIR) + "/build/test-data";
}

}  // namespace longctx::testing
