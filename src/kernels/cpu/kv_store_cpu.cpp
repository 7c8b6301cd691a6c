// CPU KV store: one memcpy per (token, head) row (FP8: one encoded row, its page's scale kept as
// kernels/kv_format.h says), after all slots have been checked.
#include "kernels/cpu/kv_store_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/decode_elem.h"
#include "longctx/core/error.h"

namespace longctx::kernels::cpu {

void check_kv_store_params(const KvStoreParams& p) {
  using E = ErrorCode;
  LONGCTX_CHECK(p.dtype == DType::kBF16 || p.dtype == DType::kF16 || p.dtype == DType::kF32,
                E::kUnsupported, "kv store: dtype {} (want bf16, f16 or f32)", dtype_name(p.dtype));
  LONGCTX_CHECK(p.num_tokens >= 0, E::kInvalidArgument, "kv store: num_tokens {} < 0",
                p.num_tokens);
  LONGCTX_CHECK(p.num_kv_heads > 0 && p.head_dim > 0, E::kInvalidArgument,
                "kv store: num_kv_heads {} and head_dim {} must be positive", p.num_kv_heads,
                p.head_dim);
  LONGCTX_CHECK(p.page_size > 0 && p.num_pages >= 0, E::kInvalidArgument,
                "kv store: page_size {} must be positive and num_pages {} >= 0", p.page_size,
                p.num_pages);
  const int64_t row = int64_t(p.num_kv_heads) * p.head_dim;
  LONGCTX_CHECK(p.k_token_stride >= row && p.v_token_stride >= row, E::kInvalidArgument,
                "kv store: token strides k {} / v {} must be >= num_kv_heads * head_dim = {}",
                p.k_token_stride, p.v_token_stride, row);
  LONGCTX_CHECK(
      p.kv_format == KvCacheFormat::kDtype || p.num_tokens == 0 || (p.k_scale && p.v_scale),
      E::kInvalidArgument, "kv store: an FP8 KV cache needs k_scale and v_scale");
  if (p.num_tokens > 0) {
    LONGCTX_CHECK(p.k && p.v && p.k_cache && p.v_cache && p.slot_mapping, E::kInvalidArgument,
                  "kv store: k, v, k_cache, v_cache and slot_mapping must be non-null for {} "
                  "tokens",
                  p.num_tokens);
  }
}

namespace {

// One (token, head) row of `src` into an FP8 cache at `slot`: the page's scale restarts at
// offset 0, grows (re-encoding the page's earlier rows of this head) when the row needs it.
void store_fp8_row(const KvStoreParams& p, const void* src, int64_t src_off, void* cache,
                   float* scales, int64_t slot, int h, std::vector<float>& row) {
  const int64_t d = p.head_dim, hkv = p.num_kv_heads;
  const int64_t page = slot / p.page_size, off = slot % p.page_size;
  float& scale = scales[page * hkv + h];
  if (off == 0) scale = 0.f;
  float amax = 0.f;
  for (int64_t c = 0; c < d; ++c) {
    row[c] = decode_detail::load_f32(src, src_off + c, p.dtype);
    if (std::isfinite(row[c])) amax = std::max(amax, std::abs(row[c]));
  }
  auto* codes = static_cast<uint8_t*>(cache);
  auto row_codes = [&](int64_t r) { return codes + ((page * p.page_size + r) * hkv + h) * d; };
  const float need = fp8_page_scale(amax);
  if (need > scale) {
    if (scale > 0.f) {  // a power-of-two ratio: exact while the codes stay normal
      const float ratio = scale / need;
      for (int64_t r = 0; r < off; ++r) {
        uint8_t* q = row_codes(r);
        for (int64_t c = 0; c < d; ++c) q[c] = f32_to_fp8e4m3(fp8e4m3_to_f32(q[c]) * ratio);
      }
    }
    scale = need;
  }
  const float inv = scale > 0.f ? 1.f / scale : 1.f;  // 0: the row is zeros (or not finite)
  uint8_t* q = row_codes(off);
  for (int64_t c = 0; c < d; ++c) q[c] = f32_to_fp8e4m3(row[c] * inv);
}

}  // namespace

void kv_store(const KvStoreParams& p) {
  check_kv_store_params(p);
  const int64_t capacity = int64_t(p.num_pages) * p.page_size;
  for (int t = 0; t < p.num_tokens; ++t) {
    LONGCTX_CHECK(p.slot_mapping[t] < capacity, ErrorCode::kOutOfRange,
                  "kv store: slot_mapping[{}] = {} past the pool ({} pages x {} = {} slots)", t,
                  p.slot_mapping[t], p.num_pages, p.page_size, capacity);
  }
  const size_t esize = dtype_size(p.dtype);
  const int64_t row = int64_t(p.num_kv_heads) * p.head_dim;  // elements of one token's K (or V)
  if (p.kv_format == KvCacheFormat::kFp8E4M3) {
    std::vector<float> buf(p.head_dim);
    for (int t = 0; t < p.num_tokens; ++t) {
      const int64_t slot = p.slot_mapping[t];
      if (slot < 0) continue;
      for (int h = 0; h < p.num_kv_heads; ++h) {
        store_fp8_row(p, p.k, t * p.k_token_stride + int64_t(h) * p.head_dim, p.k_cache, p.k_scale,
                      slot, h, buf);
        store_fp8_row(p, p.v, t * p.v_token_stride + int64_t(h) * p.head_dim, p.v_cache, p.v_scale,
                      slot, h, buf);
      }
    }
    return;
  }
  for (int t = 0; t < p.num_tokens; ++t) {
    const int64_t slot = p.slot_mapping[t];
    if (slot < 0) continue;
    // (page, offset) = (slot / page_size, slot % page_size) of [num_pages, page_size, heads, dim]
    // starts at element slot * row.
    const int64_t dst = slot * row;
    for (int h = 0; h < p.num_kv_heads; ++h) {
      const int64_t k_src = t * p.k_token_stride + int64_t(h) * p.head_dim;
      const int64_t v_src = t * p.v_token_stride + int64_t(h) * p.head_dim;
      const int64_t d = dst + int64_t(h) * p.head_dim;
      std::memcpy(static_cast<char*>(p.k_cache) + d * esize,
                  static_cast<const char*>(p.k) + k_src * esize, p.head_dim * esize);
      std::memcpy(static_cast<char*>(p.v_cache) + d * esize,
                  static_cast<const char*>(p.v) + v_src * esize, p.head_dim * esize);
    }
  }
}

}  // namespace longctx::kernels::cpu
