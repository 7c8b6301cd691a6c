// Streaming parsers hold back the end of a piece that could be the start of a marker
// (`<tool_call>`,
// `</think>`) until the next piece says whether the marker follows.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string_view>

namespace longctx::server {

// How many bytes at the end of `text` are a proper prefix of `marker`.
inline size_t partial_marker_suffix(std::string_view text, std::string_view marker) {
  for (size_t n = std::min(text.size(), marker.size() - 1); n > 0; --n) {
    if (text.substr(text.size() - n) == marker.substr(0, n)) return n;
  }
  return 0;
}

}  // namespace longctx::server
