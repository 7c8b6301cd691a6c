// XAttention's estimate and selection on the CPU, written for reading: one (q head, query group)
// row at a time.
#include "kernels/cpu/xattention_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/decode_elem.h"
#include "longctx/core/error.h"

namespace longctx::kernels::cpu {

using decode_detail::load_f32;

namespace {

constexpr int64_t kBlock = kSparseBlock;

double log_sum_exp(const std::vector<double>& x) {
  double mx = -INFINITY;
  for (double v : x) mx = std::max(mx, v);
  if (mx == -INFINITY) return mx;
  double s = 0;
  for (double v : x) s += std::exp(v - mx);
  return mx + std::log(s);
}

}  // namespace

void check_xattn_options(int stride, double threshold) {
  LONGCTX_CHECK(stride >= 1 && kBlock % stride == 0, ErrorCode::kInvalidArgument,
                "--xattn-stride {} must divide the mask block of {} tokens", stride, kBlock);
  LONGCTX_CHECK(threshold > 0 && threshold <= 1, ErrorCode::kInvalidArgument,
                "--xattn-threshold {} must be in (0, 1]", threshold);
}

void xattn_estimate(const XAttnEstimateParams& p) {
  check_xattn_options(p.stride, 0.5);
  const int64_t S = p.stride, d = p.head_dim, hkv = p.num_kv_heads;
  const int64_t group = p.num_qo_heads / p.num_kv_heads;
  const float scale = p.sm_scale / static_cast<float>(S);
  std::vector<float> a;
  for (int b = 0; b < p.batch_size; ++b) {
    const int64_t q0 = p.qo_indptr[b], n = p.qo_indptr[b + 1] - q0;
    const int64_t kv_len = paged_kv_len(p.kv_indptr, p.kv_last_page_len, b, p.page_size);
    const int64_t p0 = kv_len - n, q_groups = xattn_q_groups(n, S);
    const int64_t k_groups = (kv_len + S - 1) / S, k_blocks = xattn_blocks(kv_len);
    if (p.lse_indptr[b + 1] == p.lse_indptr[b]) continue;  // a dense request: no estimate
    const int32_t* pages = p.kv_indices + p.kv_indptr[b];
    auto key = [&](int64_t j, int64_t h) {
      return ((int64_t(pages[j / p.page_size]) * p.page_size + j % p.page_size) * hkv + h) * d;
    };
    float* out = p.block_lse + p.lse_indptr[b];
    a.resize(static_cast<size_t>(k_groups));
    for (int64_t hq = 0; hq < p.num_qo_heads; ++hq) {
      const int64_t h = hq / group;
      for (int64_t r = 0; r < q_groups; ++r) {
        const int64_t visible = std::min(k_groups, (p0 + r * S) / S + 1);
        for (int64_t c = 0; c < visible; ++c) {
          float dot = 0.f;
          for (int64_t s = 0; s < S; ++s) {
            const int64_t qi = r * S + S - 1 - s, kj = c * S + s;
            if (qi >= n || kj >= kv_len) continue;
            const int64_t qe = (q0 + qi) * p.q_row_stride + hq * d, ke = key(kj, h);
            for (int64_t e = 0; e < d; ++e)
              dot += load_f32(p.q, qe + e, p.dtype) * load_f32(p.k_cache, ke + e, p.dtype);
          }
          a[c] = dot * scale;
        }
        float* row = out + (hq * q_groups + r) * k_blocks;
        for (int64_t j = 0; j < k_blocks; ++j) {
          std::vector<double> in_block;
          for (int64_t c = j * kBlock / S; c < std::min(visible, (j + 1) * kBlock / S); ++c)
            in_block.push_back(a[c]);
          row[j] = static_cast<float>(log_sum_exp(in_block));
        }
      }
    }
  }
}

std::vector<double> xattn_block_masses(const XAttnSelectParams& p, int b, int h, int64_t i) {
  const int64_t S = p.stride, n = p.q_lens[b], kv_len = p.kv_lens[b];
  const int64_t q_groups = xattn_q_groups(n, S), k_blocks = xattn_blocks(kv_len);
  const int64_t k_groups = (kv_len + S - 1) / S;
  const float* lse = p.block_lse + p.lse_indptr[b] + int64_t(h) * q_groups * k_blocks;
  std::vector<double> mass(static_cast<size_t>(k_blocks), 0.0);
  for (int64_t r = i * kBlock / S; r < std::min(q_groups, (i + 1) * kBlock / S); ++r) {
    const float* row = lse + r * k_blocks;
    // Entries past the row's last visible block are not read (the CUDA estimate skips them).
    const int64_t last = (std::min(k_groups, (kv_len - n + r * S) / S + 1) - 1) / (kBlock / S);
    const double total = log_sum_exp(std::vector<double>(row, row + last + 1));
    if (total == -INFINITY) continue;
    for (int64_t j = 0; j <= last; ++j) mass[j] += std::exp(double(row[j]) - total);
  }
  return mass;
}

void xattn_select(const XAttnSelectParams& p) {
  check_xattn_options(p.stride, p.threshold);
  LONGCTX_CHECK(p.heads_per_mask >= 1 && p.num_qo_heads % p.heads_per_mask == 0,
                ErrorCode::kInvalidArgument, "xattention: {} heads per mask of {} q heads",
                p.heads_per_mask, p.num_qo_heads);
  for (int b = 0; b < p.batch_size; ++b) {
    const int64_t n = p.q_lens[b], kv_len = p.kv_lens[b], p0 = kv_len - n;
    const int64_t q_blocks = xattn_blocks(n), k_blocks = xattn_blocks(kv_len);
    const bool dense = xattn_dense(n, kv_len, p.min_kv_len);
    std::vector<int64_t> rest;
    const int hpm = p.heads_per_mask;
    for (int h = 0; h < p.num_qo_heads; h += hpm) {
      for (int64_t i = 0; i < q_blocks; ++i) {
        uint8_t* out = p.block_mask + p.mask_indptr[b] + (h * q_blocks + i) * k_blocks;
        const int64_t j_lo = (p0 + i * kBlock) / kBlock;
        const int64_t j_hi = (p0 + std::min(n, (i + 1) * kBlock) - 1) / kBlock;
        double total = 0, kept = 0;
        rest.clear();
        if (dense || std::min(n, (i + 1) * kBlock) > n - p.dense_tail) {
          for (int u = 0; u < hpm; ++u)
            for (int64_t j = 0; j < k_blocks; ++j)
              out[u * q_blocks * k_blocks + j] = j <= j_hi ? 1 : 0;
          continue;
        }
        std::vector<double> mass = xattn_block_masses(p, b, h, i);
        for (int u = 1; u < hpm; ++u) {
          const std::vector<double> more = xattn_block_masses(p, b, h + u, i);
          for (int64_t j = 0; j < k_blocks; ++j) mass[j] += more[j];
        }
        for (int64_t j = 0; j < k_blocks; ++j) {
          out[j] = 0;
          if (j > j_hi) continue;
          total += mass[j];
          if (j == 0 || j >= j_lo) {
            out[j] = 1;
            kept += mass[j];
          } else {
            rest.push_back(j);
          }
        }
        std::sort(rest.begin(), rest.end(), [&](int64_t x, int64_t y) {
          return mass[x] > mass[y] || (mass[x] == mass[y] && x < y);
        });
        for (int64_t j : rest) {
          if (kept >= p.threshold * total) break;
          out[j] = 1;
          kept += mass[j];
        }
        for (int u = 1; u < hpm; ++u) std::copy_n(out, k_blocks, out + u * q_blocks * k_blocks);
      }
    }
  }
}

bool xattn_gather_keeps(const XAttnGatherParams& p, int b, int h, int64_t kb) {
  const int64_t nqb = xattn_blocks(p.q_lens[b]), nkb = xattn_blocks(p.kv_lens[b]);
  const int group = p.num_qo_heads / p.num_kv_heads;
  const uint8_t* m = p.block_mask + p.mask_indptr[b];
  for (int hq = h * group; hq < (h + 1) * group; ++hq)
    for (int64_t qb = 0; qb < nqb; ++qb)
      if (m[(hq * nqb + qb) * nkb + kb] != 0) return true;
  return false;
}

int64_t xattn_gather_values(const XAttnGatherParams& p) {
  const int64_t es = static_cast<int64_t>(dtype_size(p.dtype)), bs = p.block_size;
  const int64_t head_bytes = p.head_dim * es, row_bytes = p.num_kv_heads * head_bytes;
  int64_t copied = 0;
  for (int i = 0; i < p.num_items; ++i) {
    const int32_t* it = p.items + 4 * i;
    const int b = it[0];
    const int64_t t0 = int64_t(it[1]) * bs, t1 = std::min<int64_t>(t0 + bs, p.kv_lens[b]);
    const char* src = static_cast<const char*>(p.src) + int64_t(it[2]) * p.block_stride;
    char* dst = static_cast<char*>(p.dst) + (it[3] + p.dst_block_offset) * p.block_stride;
    for (int h = 0; h < p.num_kv_heads; ++h)
      for (int64_t t = t0; t < t1; ++t) {
        if (!xattn_gather_keeps(p, b, h, t / kBlock)) continue;
        const int64_t at = (t - t0) * row_bytes + h * head_bytes;
        std::memcpy(dst + at, src + at, static_cast<size_t>(head_bytes));
        copied += head_bytes;
      }
  }
  return copied;
}

}  // namespace longctx::kernels::cpu
