// Untrusted JSON (checkpoint files, tokenizer files, request bodies): parsing with a nesting
// limit, and quoting values in error messages without printing them whole. nlohmann's dump()
// and copy constructor recurse once per nesting level, so a file nested 300,000 deep overflows
// the stack in an error message unless the parser refused it first.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace longctx {

// Far deeper than any real config, tokenizer or chat request (they nest < 20 levels).
constexpr int kMaxJsonDepth = 128;

// Throws Error(kInvalidArgument) "<what>: JSON nested deeper than <max_depth> levels (at byte
// N)" when `text` opens more than `max_depth` arrays/objects at once; strings are skipped.
void check_json_depth(std::string_view text, const std::string& what,
                      int max_depth = kMaxJsonDepth);

// check_json_depth, then parse; malformed JSON throws Error(kInvalidArgument) naming `what` and
// nlohmann's description of the first error (cut to a short length).
nlohmann::json parse_json(std::string_view text, const std::string& what,
                          int max_depth = kMaxJsonDepth);
nlohmann::ordered_json parse_ordered_json(std::string_view text, const std::string& what,
                                          int max_depth = kMaxJsonDepth);

// A short rendering of `v` for messages: at most about `max_chars` characters, nested values
// past a few levels shown as [...] / {...}; never recursion proportional to v's depth.
std::string json_excerpt(const nlohmann::json& v, size_t max_chars = 60);
std::string json_excerpt(const nlohmann::ordered_json& v, size_t max_chars = 60);

}  // namespace longctx
