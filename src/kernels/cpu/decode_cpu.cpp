#include "kernels/cpu/decode_cpu.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/decode_elem.h"
#include "longctx/core/error.h"
#include "longctx/core/parallel.h"

namespace longctx::kernels::cpu {
using decode_detail::kv_scale;
using decode_detail::load_f32;
using decode_detail::load_kv_f32;
using decode_detail::store_f32;

void decode_attention(const DecodeParams& p) {
  LONGCTX_CHECK(p.num_qo_heads > 0 && p.num_kv_heads > 0 && p.num_qo_heads % p.num_kv_heads == 0,
                ErrorCode::kInvalidArgument,
                "decode: num_qo_heads {} is not a positive multiple of num_kv_heads {}",
                p.num_qo_heads, p.num_kv_heads);
  LONGCTX_CHECK(p.page_size >= 1 && p.head_dim >= 1, ErrorCode::kInvalidArgument,
                "decode: page_size {} and head_dim {} must be >= 1", p.page_size, p.head_dim);
  LONGCTX_CHECK(p.window >= 0, ErrorCode::kInvalidArgument, "decode: window {} < 0", p.window);
  LONGCTX_CHECK(p.kv_format == KvCacheFormat::kDtype || (p.k_scale && p.v_scale),
                ErrorCode::kInvalidArgument, "decode: an FP8 KV cache needs k_scale and v_scale");
  const int group = p.num_qo_heads / p.num_kv_heads;
  const int64_t D = p.head_dim;
  const int64_t q_stride = p.q_token_stride > 0 ? p.q_token_stride : p.num_qo_heads * D;
  for (int b = 0; b < p.batch_size; ++b) {
    int32_t pages = p.kv_indptr[b + 1] - p.kv_indptr[b];
    LONGCTX_CHECK(pages >= 0, ErrorCode::kInvalidArgument, "decode: kv_indptr decreases at {}", b);
    LONGCTX_CHECK(
        pages == 0 || (p.kv_last_page_len[b] >= 1 && p.kv_last_page_len[b] <= p.page_size),
        ErrorCode::kInvalidArgument, "decode: kv_last_page_len[{}] = {} not in [1, {}]", b,
        p.kv_last_page_len[b], p.page_size);
  }
  // Each query row's request (one row per request without qo_indptr).
  std::vector<int> request_of;
  if (p.qo_indptr) {
    LONGCTX_CHECK(p.batch_size == 0 || p.qo_indptr[0] == 0, ErrorCode::kInvalidArgument,
                  "decode: qo_indptr[0] = {} is not 0", p.qo_indptr[0]);
    for (int b = 0; b < p.batch_size; ++b) {
      const int32_t q_len = p.qo_indptr[b + 1] - p.qo_indptr[b];
      LONGCTX_CHECK(q_len >= 0 && q_len <= kDecodeMaxQLen, ErrorCode::kInvalidArgument,
                    "decode: request {} has {} queries (0 to {})", b, q_len, kDecodeMaxQLen);
      request_of.insert(request_of.end(), q_len, b);
    }
  } else {
    for (int b = 0; b < p.batch_size; ++b) request_of.push_back(b);
  }
  const int64_t rows = int64_t(request_of.size());
  parallel_for(rows * p.num_qo_heads, [&](int64_t begin, int64_t end) {
    std::vector<float> s, acc(D);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t row = item / p.num_qo_heads;
      const int b = request_of[row], h = int(item % p.num_qo_heads);
      const int kvh = h / group;
      const int32_t pages = p.kv_indptr[b + 1] - p.kv_indptr[b];
      const int64_t kv_len =
          pages == 0 ? 0 : int64_t(pages - 1) * p.page_size + p.kv_last_page_len[b];
      const int64_t q_start = p.qo_indptr ? p.qo_indptr[b] : b;
      const int64_t q_len = p.qo_indptr ? p.qo_indptr[b + 1] - q_start : 1;
      // The row's keys [j0, j_end): the causal tail rule of DecodeParams.
      const int64_t j_end =
          std::max<int64_t>(0, p.causal ? kv_len - q_len + 1 + (row - q_start) : kv_len);
      const int64_t q_off = row * q_stride + h * D;
      const int64_t o_off = (row * p.num_qo_heads + h) * D;
      auto page_of = [&](int64_t j) -> int64_t {
        return p.kv_indices[p.kv_indptr[b] + j / p.page_size];
      };
      auto kv_offset = [&](int64_t j) {
        return ((page_of(j) * p.page_size + j % p.page_size) * p.num_kv_heads + kvh) * D;
      };
      const int64_t j0 = p.window > 0 ? std::max<int64_t>(0, j_end - p.window) : 0;
      s.assign(j_end, 0.f);
      float m = -std::numeric_limits<float>::infinity();
      for (int64_t j = j0; j < j_end; ++j) {
        int64_t k_off = kv_offset(j);
        const float ks = kv_scale(p.k_scale, p.kv_format, page_of(j), kvh, p.num_kv_heads);
        float dot = 0.f;
        for (int64_t d = 0; d < D; ++d)
          dot += load_f32(p.q, q_off + d, p.dtype) *
                 (load_kv_f32(p.k_cache, k_off + d, p.kv_format, p.dtype) * ks);
        s[j] = dot * p.sm_scale;
        m = std::max(m, s[j]);
      }
      float l = 0.f;
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t j = j0; j < j_end; ++j) {
        float w = std::exp(s[j] - m);
        l += w;
        int64_t v_off = kv_offset(j);
        const float vs = kv_scale(p.v_scale, p.kv_format, page_of(j), kvh, p.num_kv_heads);
        for (int64_t d = 0; d < D; ++d)
          acc[d] += w * (load_kv_f32(p.v_cache, v_off + d, p.kv_format, p.dtype) * vs);
      }
      const bool none = j0 >= j_end;  // the row sees no key
      for (int64_t d = 0; d < D; ++d)
        if (p.o_f32)
          p.o_f32[o_off + d] = none ? 0.f : acc[d] / l;
        else
          store_f32(p.o, o_off + d, none ? 0.f : acc[d] / l, p.dtype);
      if (p.lse)
        p.lse[row * p.num_qo_heads + h] =
            none ? -std::numeric_limits<float>::infinity() : m + std::log(l);
    }
  });
}

}  // namespace longctx::kernels::cpu
