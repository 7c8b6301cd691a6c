// CPU reference of the KV store (see KvStoreParams in kernels/kv_store_params.h): what the CUDA
// kernel (kernels/cuda/kv_store.h) is tested against, and the host path of a CPU KV pool.
#pragma once

#include "kernels/kv_store_params.h"

namespace longctx::kernels::cpu {

// Validates the fields that do not need the slot values (shapes, strides, dtype, non-null
// pointers when num_tokens > 0; error_flag is not looked at). Throws Error(kInvalidArgument) or,
// for a dtype other than bf16/f16/f32, Error(kUnsupported), naming the field. Reads no pointer,
// so the CUDA entry uses it on device params too.
void check_kv_store_params(const KvStoreParams& params);

// Copies every token's K and V rows to its slot (FP8: encodes them and keeps the pages' scales,
// kernels/kv_format.h); host pointers. Checks every slot first: a slot
// >= num_pages * page_size throws Error(kOutOfRange) naming the token and nothing is written.
// Negative slots are skipped.
void kv_store(const KvStoreParams& params);

}  // namespace longctx::kernels::cpu
