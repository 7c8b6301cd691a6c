#include "eval/jsonl.h"

#include <fstream>

#include "longctx/core/json_limits.h"

namespace longctx::eval {

void for_each_jsonl_object(
    const std::string& path, const std::string& what,
    const std::function<bool(const nlohmann::json&, const std::string&)>& fn) {
  std::ifstream f(path);
  LONGCTX_CHECK(f.good(), ErrorCode::kNotFound, "cannot open {} file {}", what, path);
  bool any = false;
  std::string line;
  for (int64_t n = 1; std::getline(f, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(n);
    nlohmann::json j;
    try {
      check_json_depth(line, where);  // json_field() errors recurse over deep values
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error& e) {
      LONGCTX_THROW(ErrorCode::kInvalidArgument, "{}: not JSON ({})", where, e.what());
    }
    LONGCTX_CHECK(j.is_object(), ErrorCode::kInvalidArgument, "{}: not a JSON object", where);
    any = true;
    if (!fn(j, where)) break;
  }
  LONGCTX_CHECK(any, ErrorCode::kInvalidArgument, "{}: no samples", path);
}

}  // namespace longctx::eval
