#include "token_ids.h"

#include <exception>

#include "longctx/core/error.h"

namespace longctx::cli {

int32_t parse_token_id(const std::string& item, const std::string& where) {
  size_t used = 0;
  long long v = 0;
  try {
    v = std::stoll(item, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  LONGCTX_CHECK(!item.empty() && used == item.size() && v >= 0 && v <= INT32_MAX,
                ErrorCode::kInvalidArgument, "{}: '{}' is not a token id", where, item);
  return static_cast<int32_t>(v);
}

}  // namespace longctx::cli
