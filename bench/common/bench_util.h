// Helpers the benchmarks share: option lists and a wall clock. Header-only, no library needed.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <vector>

namespace longctx::bench {

// "1,16,64" -> {1, 16, 64}.
inline std::vector<int64_t> parse_list(const char* s) {
  std::vector<int64_t> v;
  for (const char* p = s; *p;) {
    char* end = nullptr;
    v.push_back(std::strtoll(p, &end, 10));
    p = end == p ? p + 1 : end;  // a stray character ends no loop
    if (*p == ',') ++p;
  }
  return v;
}

// Seconds on the steady clock.
inline double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace longctx::bench
