// --kv-cache-dtype: the names, a clear error for an unknown one, and what auto resolves to.
#include <gtest/gtest.h>

#include <string>

#include "longctx/core/error.h"
#include "longctx/kv/kv_cache_dtype.h"

namespace longctx {
namespace {

TEST(KvCacheDtype, ParsesNames) {
  EXPECT_EQ(parse_kv_cache_dtype("auto"), KvCacheDtype::kAuto);
  EXPECT_EQ(parse_kv_cache_dtype("bf16"), KvCacheDtype::kBF16);
  EXPECT_EQ(parse_kv_cache_dtype("bfloat16"), KvCacheDtype::kBF16);
  EXPECT_EQ(parse_kv_cache_dtype("fp8"), KvCacheDtype::kFP8);
  EXPECT_EQ(parse_kv_cache_dtype("fp8_e4m3"), KvCacheDtype::kFP8);
  for (KvCacheDtype d : {KvCacheDtype::kAuto, KvCacheDtype::kBF16, KvCacheDtype::kFP8})
    EXPECT_EQ(parse_kv_cache_dtype(kv_cache_dtype_name(d)), d);
  try {
    parse_kv_cache_dtype("fp8_e5m2");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("'fp8_e5m2'"), std::string::npos) << e.what();
  }
}

TEST(KvCacheDtype, AutoFollowsTheCheckpoint) {
  EXPECT_EQ(resolve_kv_cache_dtype(KvCacheDtype::kAuto, false, DType::kBF16), DType::kBF16);
  EXPECT_EQ(resolve_kv_cache_dtype(KvCacheDtype::kAuto, true, DType::kBF16), DType::kFP8E4M3);
  EXPECT_EQ(resolve_kv_cache_dtype(KvCacheDtype::kBF16, true, DType::kF32), DType::kF32);
  EXPECT_EQ(resolve_kv_cache_dtype(KvCacheDtype::kFP8, false, DType::kF32), DType::kFP8E4M3);
}

}  // namespace
}  // namespace longctx
