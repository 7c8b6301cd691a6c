// --kv-cache-dtype: what the paged KV cache stores (docs/fp8_kv.md). Parsed once from the
// command line, the server's or Python's options; below that the engine passes the element
// DType it resolved.
#pragma once

#include <cstdint>
#include <string_view>

#include "longctx/core/dtype.h"

namespace longctx {

enum class KvCacheDtype : uint8_t {
  kAuto,  // FP8 when the checkpoint's quantization_config asks for an FP8 KV cache, else bf16
  kBF16,  // unquantized: bf16 on a GPU (the activations' dtype), f32 in the CPU reference
  kFP8,   // FP8 E4M3 with an fp32 scale per (block, layer, KV head) for K and for V
};

// "auto", "bf16" (also "bfloat16"), "fp8" (also "fp8_e4m3"); throws Error(kInvalidArgument)
// naming the value and the choices.
KvCacheDtype parse_kv_cache_dtype(std::string_view name);
std::string_view kv_cache_dtype_name(KvCacheDtype dtype);

// The KV cache's element: FP8 E4M3 for kFP8 (and kAuto with checkpoint_fp8), else `unquantized`.
DType resolve_kv_cache_dtype(KvCacheDtype dtype, bool checkpoint_fp8, DType unquantized);

}  // namespace longctx
