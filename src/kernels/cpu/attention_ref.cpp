// CPU reference attention: the specification (see attention_ref.h). Deliberately naive: one
// query row at a time, scores in fp32, max-subtracted softmax, one rounding of the output.
#include "kernels/cpu/attention_ref.h"

#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/decode_elem.h"
#include "longctx/core/error.h"
#include "longctx/core/parallel.h"

namespace longctx::kernels::cpu {

float load_elem(const void* base, int64_t index, DType dtype) {
  return decode_detail::load_f32(base, index, dtype);
}

void store_elem(void* base, int64_t index, DType dtype, float value) {
  decode_detail::store_f32(base, index, value, dtype);
}

void check_paged_prefill_params(const PagedPrefillParams& p, int64_t num_pages) {
  using E = ErrorCode;
  LONGCTX_CHECK(p.q && p.k_cache && p.v_cache && (p.o || p.o_f32), E::kInvalidArgument,
                "paged prefill: q, k_cache, v_cache and o (or o_f32) must be non-null");
  LONGCTX_CHECK(p.qo_indptr && p.kv_indptr && p.kv_indices && p.kv_last_page_len,
                E::kInvalidArgument, "paged prefill: index arrays must be non-null");
  LONGCTX_CHECK(p.batch_size >= 0, E::kInvalidArgument, "paged prefill: batch_size {} < 0",
                p.batch_size);
  LONGCTX_CHECK(p.num_qo_heads > 0 && p.num_kv_heads > 0 && p.num_qo_heads % p.num_kv_heads == 0,
                E::kInvalidArgument,
                "paged prefill: num_qo_heads {} must be a positive multiple of num_kv_heads {}",
                p.num_qo_heads, p.num_kv_heads);
  LONGCTX_CHECK(p.head_dim > 0, E::kInvalidArgument, "paged prefill: head_dim {} <= 0", p.head_dim);
  LONGCTX_CHECK(p.window >= 0 && (p.window == 0 || p.mask_mode == MaskMode::kCausal),
                E::kInvalidArgument, "paged prefill: window {} (>= 0, and only with kCausal)",
                p.window);
  LONGCTX_CHECK(p.page_size >= 1 && p.page_size <= 256, E::kInvalidArgument,
                "paged prefill: page_size {} outside [1, 256]", p.page_size);
  LONGCTX_CHECK(p.dtype == DType::kBF16 || p.dtype == DType::kF16 || p.dtype == DType::kF32,
                E::kUnsupported, "paged prefill: dtype {} (want bf16, f16 or f32)",
                dtype_name(p.dtype));
  LONGCTX_CHECK(p.kv_format == KvCacheFormat::kDtype || (p.k_scale && p.v_scale),
                E::kInvalidArgument, "paged prefill: an FP8 KV cache needs k_scale and v_scale");
  LONGCTX_CHECK(p.qo_indptr[0] == 0 && p.kv_indptr[0] == 0, E::kInvalidArgument,
                "paged prefill: qo_indptr[0] and kv_indptr[0] must be 0");
  for (int b = 0; b < p.batch_size; ++b) {
    LONGCTX_CHECK(p.qo_indptr[b + 1] >= p.qo_indptr[b], E::kInvalidArgument,
                  "paged prefill: qo_indptr decreases at request {}", b);
    LONGCTX_CHECK(p.kv_indptr[b + 1] >= p.kv_indptr[b], E::kInvalidArgument,
                  "paged prefill: kv_indptr decreases at request {}", b);
    if (p.kv_indptr[b + 1] > p.kv_indptr[b]) {
      LONGCTX_CHECK(p.kv_last_page_len[b] >= 1 && p.kv_last_page_len[b] <= p.page_size,
                    E::kInvalidArgument,
                    "paged prefill: kv_last_page_len[{}] = {} outside [1, page_size {}]", b,
                    p.kv_last_page_len[b], p.page_size);
    }
    if (p.kv_contiguous) {  // the promise the fast kernels rely on
      for (int32_t i = p.kv_indptr[b] + 1; i < p.kv_indptr[b + 1]; ++i)
        LONGCTX_CHECK(p.kv_indices[i] == p.kv_indices[i - 1] + 1, E::kInvalidArgument,
                      "paged prefill: kv_contiguous, but request {}'s pages {} and {} are not "
                      "consecutive",
                      b, p.kv_indices[i - 1], p.kv_indices[i]);
    }
    if (num_pages >= 0) {
      for (int32_t i = p.kv_indptr[b]; i < p.kv_indptr[b + 1]; ++i) {
        LONGCTX_CHECK(p.kv_indices[i] >= 0 && p.kv_indices[i] < num_pages, E::kInvalidArgument,
                      "paged prefill: kv_indices[{}] = {} outside [0, {})", i, p.kv_indices[i],
                      num_pages);
      }
    }
  }
  if (p.block_mask) {
    LONGCTX_CHECK(p.block_mask_indptr, E::kInvalidArgument,
                  "paged prefill: block_mask needs block_mask_indptr");
    LONGCTX_CHECK(p.block_mask_heads == 1 || p.block_mask_heads == p.num_qo_heads,
                  E::kInvalidArgument,
                  "paged prefill: block_mask_heads {} must be 1 or num_qo_heads {}",
                  p.block_mask_heads, p.num_qo_heads);
    for (int b = 0; b < p.batch_size; ++b) {
      const int64_t q_len = p.qo_indptr[b + 1] - p.qo_indptr[b];
      const int64_t kv_len = paged_kv_len(p.kv_indptr, p.kv_last_page_len, b, p.page_size);
      const int64_t want = int64_t(p.block_mask_heads) *
                           ((q_len + kSparseBlock - 1) / kSparseBlock) *
                           ((kv_len + kSparseBlock - 1) / kSparseBlock);
      LONGCTX_CHECK(p.block_mask_indptr[b + 1] - p.block_mask_indptr[b] == want,
                    E::kInvalidArgument,
                    "paged prefill: request {} block mask has {} bytes, want {} "
                    "(heads x q blocks x k blocks)",
                    b, p.block_mask_indptr[b + 1] - p.block_mask_indptr[b], want);
    }
  }
}

namespace {

// One query row (token t of request b, q head h): the textbook formula.
void prefill_row(const PagedPrefillParams& p, int b, int32_t t, int h, std::vector<float>& q,
                 std::vector<float>& scores, std::vector<float>& acc) {
  const int d = p.head_dim;
  const int group = p.num_qo_heads / p.num_kv_heads;
  const int kvh = h / group;
  const int32_t q_start = p.qo_indptr[b];
  const int32_t q_len = p.qo_indptr[b + 1] - q_start;
  const int32_t kv_len = paged_kv_len(p.kv_indptr, p.kv_last_page_len, b, p.page_size);
  const int32_t i = t - q_start;  // position inside the segment
  const int64_t row = int64_t(t) * p.num_qo_heads + h;

  for (int c = 0; c < d; ++c) q[c] = load_elem(p.q, row * d + c, p.dtype);

  // Which keys this row may see.
  int32_t last_key = kv_len - 1, first_key = 0;
  if (p.mask_mode == MaskMode::kCausal) {
    last_key = std::min(last_key, kv_len - q_len + i);
    first_key = window_first_key(kv_len - q_len + i, p.window);
  }
  const uint8_t* block_row = nullptr;
  if (p.block_mask) {
    const int64_t nqb = (q_len + kSparseBlock - 1) / kSparseBlock;
    const int64_t nkb = (kv_len + kSparseBlock - 1) / kSparseBlock;
    const int mh = p.block_mask_heads == 1 ? 0 : h;
    block_row = p.block_mask + p.block_mask_indptr[b] + (mh * nqb + i / kSparseBlock) * nkb;
  }
  auto page_of = [&](int32_t j) -> int64_t {
    return p.kv_indices[p.kv_indptr[b] + j / p.page_size];
  };
  auto key_offset = [&](int32_t j) {  // element offset of key j's row for kv head kvh
    const int64_t slot = j % p.page_size;
    return ((page_of(j) * p.page_size + slot) * p.num_kv_heads + kvh) * d;
  };
  using decode_detail::kv_scale;
  using decode_detail::load_kv_f32;

  float max_s = -std::numeric_limits<float>::infinity();
  scores.assign(kv_len > 0 ? kv_len : 0, -std::numeric_limits<float>::infinity());
  for (int32_t j = first_key; j <= last_key; ++j) {
    if (block_row && !block_row[j / kSparseBlock]) continue;
    const int64_t off = key_offset(j);
    const float ks = kv_scale(p.k_scale, p.kv_format, page_of(j), kvh, p.num_kv_heads);
    float dot = 0.f;
    for (int c = 0; c < d; ++c)
      dot += q[c] * (load_kv_f32(p.k_cache, off + c, p.kv_format, p.dtype) * ks);
    scores[j] = dot * p.sm_scale;
    max_s = std::max(max_s, scores[j]);
  }
  acc.assign(d, 0.f);
  float sum = 0.f;
  if (max_s != -std::numeric_limits<float>::infinity()) {
    for (int32_t j = first_key; j <= last_key; ++j) {
      if (scores[j] == -std::numeric_limits<float>::infinity()) continue;
      const float w = std::exp(scores[j] - max_s);
      sum += w;
      const int64_t off = key_offset(j);
      const float vs = kv_scale(p.v_scale, p.kv_format, page_of(j), kvh, p.num_kv_heads);
      for (int c = 0; c < d; ++c)
        acc[c] += w * (load_kv_f32(p.v_cache, off + c, p.kv_format, p.dtype) * vs);
    }
  }
  for (int c = 0; c < d; ++c) {
    const float v = sum > 0.f ? acc[c] / sum : 0.f;
    if (p.o_f32)
      p.o_f32[row * d + c] = v;
    else
      store_elem(p.o, row * d + c, p.dtype, v);
  }
  if (p.lse) {
    p.lse[row] = sum > 0.f ? max_s + std::log(sum) : -std::numeric_limits<float>::infinity();
  }
}

}  // namespace

void paged_prefill_ref(const PagedPrefillParams& p, const int32_t* rows, int64_t num_rows) {
  check_paged_prefill_params(p);
  const int32_t total_q = p.qo_indptr[p.batch_size];
  // Tokens to compute, with their request.
  std::vector<int32_t> tokens;
  if (rows) {
    tokens.assign(rows, rows + num_rows);
  } else {
    tokens.resize(total_q);
    for (int32_t t = 0; t < total_q; ++t) tokens[t] = t;
  }
  std::vector<int> request(tokens.size());
  for (size_t n = 0; n < tokens.size(); ++n) {
    LONGCTX_CHECK(tokens[n] >= 0 && tokens[n] < total_q, ErrorCode::kInvalidArgument,
                  "paged prefill ref: row {} outside [0, {})", tokens[n], total_q);
    int b = 0;
    while (p.qo_indptr[b + 1] <= tokens[n]) ++b;
    request[n] = b;
  }
  const int64_t work = int64_t(tokens.size()) * p.num_qo_heads;
  parallel_for(work, [&](int64_t begin, int64_t end) {
    std::vector<float> q(p.head_dim), scores, acc;
    for (int64_t w = begin; w < end; ++w) {
      const int64_t n = w / p.num_qo_heads;
      prefill_row(p, request[n], tokens[n], int(w % p.num_qo_heads), q, scores, acc);
    }
  });
}

void dense_attention_masked_ref(const float* q, const float* k, const float* v, const uint8_t* mask,
                                int n_q, int n_k, int num_qo_heads, int num_kv_heads, int head_dim,
                                float sm_scale, float* o, float* lse) {
  LONGCTX_CHECK(num_kv_heads > 0 && num_qo_heads % num_kv_heads == 0, ErrorCode::kInvalidArgument,
                "dense attention: num_qo_heads {} not a multiple of num_kv_heads {}", num_qo_heads,
                num_kv_heads);
  const int group = num_qo_heads / num_kv_heads;
  const int d = head_dim;
  std::vector<float> s(n_k);
  for (int h = 0; h < num_qo_heads; ++h) {
    const int kvh = h / group;
    for (int i = 0; i < n_q; ++i) {
      const float* qi = q + (int64_t(i) * num_qo_heads + h) * d;
      const uint8_t* m = mask + (int64_t(h) * n_q + i) * n_k;
      // Direct formula p_j = exp(s_j) / sum_{j' allowed} exp(s_j') over the explicit mask, in
      // double precision (no page table, no mask rules: those are what the references add).
      double denom = 0.0;
      double max_s = -INFINITY;
      for (int j = 0; j < n_k; ++j) {
        if (!m[j]) continue;
        double dot = 0.0;
        const float* kj = k + (int64_t(j) * num_kv_heads + kvh) * d;
        for (int c = 0; c < d; ++c) dot += double(qi[c]) * kj[c];
        s[j] = float(dot * sm_scale);
        max_s = std::max(max_s, double(s[j]));
      }
      float* oi = o + (int64_t(i) * num_qo_heads + h) * d;
      for (int c = 0; c < d; ++c) oi[c] = 0.f;
      if (max_s == -INFINITY) {
        if (lse) lse[int64_t(i) * num_qo_heads + h] = -INFINITY;
        continue;
      }
      std::vector<double> acc(d, 0.0);
      for (int j = 0; j < n_k; ++j) {
        if (!m[j]) continue;
        const double w = std::exp(double(s[j]) - max_s);
        denom += w;
        const float* vj = v + (int64_t(j) * num_kv_heads + kvh) * d;
        for (int c = 0; c < d; ++c) acc[c] += w * vj[c];
      }
      for (int c = 0; c < d; ++c) oi[c] = float(acc[c] / denom);
      if (lse) lse[int64_t(i) * num_qo_heads + h] = float(max_s + std::log(denom));
    }
  }
}

}  // namespace longctx::kernels::cpu
