// Shared by the libFuzzer targets: a longctx::Error is the expected outcome for malformed input;
// anything else escaping (another exception type, a signal, a sanitizer report) is a finding.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "longctx/core/error.h"

namespace longctx::fuzz {

inline std::string_view as_text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// Runs f(); an Error is swallowed (it is the clear error the input deserves).
template <typename F>
void expect_clean(F&& f) {
  try {
    f();
  } catch (const Error&) {
  }
}

}  // namespace longctx::fuzz
