#include "longctx/kv/kv_cache_dtype.h"

#include "longctx/core/error.h"

namespace longctx {

KvCacheDtype parse_kv_cache_dtype(std::string_view name) {
  if (name == "auto") return KvCacheDtype::kAuto;
  if (name == "bf16" || name == "bfloat16") return KvCacheDtype::kBF16;
  if (name == "fp8" || name == "fp8_e4m3") return KvCacheDtype::kFP8;
  LONGCTX_THROW(ErrorCode::kInvalidArgument,
                "kv cache dtype '{}' is unknown (known: auto, bf16, fp8 = fp8_e4m3)", name);
}

std::string_view kv_cache_dtype_name(KvCacheDtype dtype) {
  switch (dtype) {
    case KvCacheDtype::kAuto:
      return "auto";
    case KvCacheDtype::kBF16:
      return "bf16";
    case KvCacheDtype::kFP8:
      return "fp8";
  }
  return "?";
}

DType resolve_kv_cache_dtype(KvCacheDtype dtype, bool checkpoint_fp8, DType unquantized) {
  const bool fp8 = dtype == KvCacheDtype::kFP8 || (dtype == KvCacheDtype::kAuto && checkpoint_fp8);
  return fp8 ? DType::kFP8E4M3 : unquantized;
}

}  // namespace longctx
