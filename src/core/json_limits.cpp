#include "longctx/core/json_limits.h"

#include "longctx/core/error.h"

namespace longctx {

void check_json_depth(std::string_view text, const std::string& what, int max_depth) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      LONGCTX_CHECK(++depth <= max_depth, ErrorCode::kInvalidArgument,
                    "{}: JSON nested deeper than {} levels (at byte {})", what, max_depth, i);
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
}

namespace {

template <typename Json>
Json parse_impl(std::string_view text, const std::string& what, int max_depth) {
  check_json_depth(text, what, max_depth);
  try {
    return Json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::exception& e) {
    std::string msg = e.what();
    if (msg.size() > 200) msg = msg.substr(0, 200) + "...";  // "last read: '<token>'" can be long
    LONGCTX_THROW(ErrorCode::kInvalidArgument, "{}: not valid JSON: {}", what, msg);
  }
}

template <typename Json>
void excerpt_into(const Json& v, std::string& out, size_t max_chars, int levels) {
  if (out.size() >= max_chars) return;
  if (v.is_array() || v.is_object()) {
    const bool arr = v.is_array();
    if (levels == 0 || v.empty()) {
      out += arr ? (v.empty() ? "[]" : "[...]") : (v.empty() ? "{}" : "{...}");
      return;
    }
    out += arr ? '[' : '{';
    bool first = true;
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (out.size() >= max_chars) {
        out += "...";
        break;
      }
      if (!first) out += ", ";
      first = false;
      if (!arr) out += Json(it.key()).dump() + ": ";
      excerpt_into(*it, out, max_chars, levels - 1);
    }
    out += arr ? ']' : '}';
    return;
  }
  std::string s = v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (s.size() > max_chars) s = s.substr(0, max_chars) + "...";
  out += s;
}

template <typename Json>
std::string excerpt_impl(const Json& v, size_t max_chars) {
  std::string out;
  excerpt_into(v, out, max_chars, 3);
  if (out.size() > max_chars + 8) out = out.substr(0, max_chars) + "...";
  return out;
}

}  // namespace

nlohmann::json parse_json(std::string_view text, const std::string& what, int max_depth) {
  return parse_impl<nlohmann::json>(text, what, max_depth);
}

nlohmann::ordered_json parse_ordered_json(std::string_view text, const std::string& what,
                                          int max_depth) {
  return parse_impl<nlohmann::ordered_json>(text, what, max_depth);
}

std::string json_excerpt(const nlohmann::json& v, size_t max_chars) {
  return excerpt_impl(v, max_chars);
}

std::string json_excerpt(const nlohmann::ordered_json& v, size_t max_chars) {
  return excerpt_impl(v, max_chars);
}

}  // namespace longctx
