// Token ids given on the command line (--ids of generate, forward, detokenize).
#pragma once

#include <cstdint>
#include <string>

namespace longctx::cli {

// One id: a decimal integer in [0, INT32_MAX]; throws Error(kInvalidArgument)
// "<where>: '<item>' is not a token id" otherwise (also for an empty item).
int32_t parse_token_id(const std::string& item, const std::string& where);

}  // namespace longctx::cli
