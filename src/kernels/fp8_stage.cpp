#include <algorithm>

#include "kernels/fp8_stage_params.h"
#include "longctx/core/error.h"

namespace longctx::kernels {

namespace {

size_t align256(size_t x) { return (x + 255) / 256 * 256; }

}  // namespace

Fp8StageLayout fp8_stage_layout(int64_t num_pages, int page_size, int num_kv_heads, int head_dim,
                                DType dtype) {
  const size_t n = static_cast<size_t>(std::max<int64_t>(num_pages, 0));
  const size_t page = size_t(page_size) * num_kv_heads * head_dim * dtype_size(dtype);
  Fp8StageLayout l;
  l.k = 0;
  l.v = align256(n * page);
  l.iota = l.v + align256(n * page);
  l.bytes = l.iota + align256(n * sizeof(int32_t));
  return l;
}

int64_t fp8_stage_capacity_pages(size_t max_bytes, int page_size, int num_kv_heads, int head_dim,
                                 DType dtype) {
  if (page_size <= 0 || num_kv_heads <= 0 || head_dim <= 0) return 0;
  const size_t per_page = 2 * size_t(page_size) * num_kv_heads * head_dim * dtype_size(dtype);
  return static_cast<int64_t>(max_bytes / per_page);
}

size_t fp8_stage_pool_bytes(int64_t max_call_pages, int cap_mib, int page_size, int num_kv_heads,
                            int head_dim, DType dtype) {
  if (cap_mib <= 0 || max_call_pages <= 0) return 0;
  const int64_t cap =
      fp8_stage_capacity_pages(size_t(cap_mib) << 20, page_size, num_kv_heads, head_dim, dtype);
  const int64_t pages = std::min(max_call_pages, cap);
  return pages > 0 ? fp8_stage_layout(pages, page_size, num_kv_heads, head_dim, dtype).bytes : 0;
}

bool fp8_stage_fits(int64_t call_pages, size_t pool_bytes, int page_size, int num_kv_heads,
                    int head_dim, DType dtype) {
  return call_pages > 0 && pool_bytes > 0 &&
         fp8_stage_layout(call_pages, page_size, num_kv_heads, head_dim, dtype).bytes <= pool_bytes;
}

void check_fp8_stage_params(const Fp8StageParams& p) {
  LONGCTX_CHECK(p.num_pages >= 0, ErrorCode::kInvalidArgument, "fp8 stage: num_pages {} < 0",
                p.num_pages);
  LONGCTX_CHECK(p.page_size >= 1 && p.page_size <= 256, ErrorCode::kInvalidArgument,
                "fp8 stage: page_size {} not in [1, 256]", p.page_size);
  LONGCTX_CHECK(p.num_kv_heads >= 1, ErrorCode::kInvalidArgument, "fp8 stage: num_kv_heads {}",
                p.num_kv_heads);
  LONGCTX_CHECK(p.head_dim >= 16 && p.head_dim % 16 == 0, ErrorCode::kInvalidArgument,
                "fp8 stage: head_dim {} is not a multiple of 16", p.head_dim);
  LONGCTX_CHECK(p.dtype == DType::kBF16 || p.dtype == DType::kF16, ErrorCode::kInvalidArgument,
                "fp8 stage: staging dtype {} (bf16 or f16)", dtype_name(p.dtype));
  if (p.num_pages == 0) return;
  LONGCTX_CHECK(
      p.k_codes && p.v_codes && p.k_scale && p.v_scale && p.kv_indices && p.k_out && p.v_out,
      ErrorCode::kInvalidArgument,
      "fp8 stage: null pointer (k_codes, v_codes, k_scale, v_scale, kv_indices, k_out or "
      "v_out)");
}

}  // namespace longctx::kernels
