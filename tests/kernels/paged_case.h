// A batch prefill test case over a paged KV cache, built on the host: random unit-variance
// q/k/v (bf16 or f16), a shuffled page table (pages deliberately out of order, with unused pages
// in between) and, optionally, a random block-sparse mask. Shared by the CPU reference tests
// (tests/kernels) and the GPU op-test harness (tests/gpu_kernels).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/attention_params.h"
#include "kernels/cpu/attention_ref.h"
#include "kernels/decode_params.h"
#include "longctx/core/parallel.h"

namespace longctx::testing {

struct PagedCaseShape {
  std::vector<int32_t> q_lens;
  std::vector<int32_t> kv_lens;
  int num_qo_heads = 4;
  int num_kv_heads = 1;
  int head_dim = 64;
  int page_size = 16;
  DType dtype = DType::kBF16;
  kernels::MaskMode mask_mode = kernels::MaskMode::kNone;
  bool with_lse = true;
  // Block-sparse: 0 = dense; else the fraction of (q block, k block) pairs kept, per head
  // (sparse_per_head) or shared. Diagonal blocks are always kept so no row is fully masked by
  // accident (fully masked rows are tested separately).
  double sparse_keep = 0.0;
  bool sparse_per_head = false;
  // With sparse_per_head: the q heads of a KV group get the same mask (XAttention's default, one
  // selection per KV head written for each of its q heads).
  bool sparse_same_in_group = false;
  // Each request's pages are consecutive ids (PagedPrefillParams::kv_contiguous), the requests'
  // runs in random order with unused pages between them.
  bool contiguous_pages = false;
  uint64_t seed = 1;
  int window = 0;  // sliding window (kCausal prefill, decode): PagedPrefillParams::window

  // The head and page fields that PagedPrefillParams and DecodeParams share, with the scale
  // every case uses (1/sqrt(head_dim)).
  template <typename Params>
  void set_head_fields(Params& p) const {
    p.num_qo_heads = num_qo_heads;
    p.num_kv_heads = num_kv_heads;
    p.head_dim = head_dim;
    p.page_size = page_size;
    p.dtype = dtype;
    p.sm_scale = 1.f / std::sqrt(float(head_dim));
  }
};

// Uniform in [-sqrt(3), sqrt(3)) (unit variance) from a counter-based hash: fast and parallel.
inline float hashed_unit(uint64_t seed, uint64_t i) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + i + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return (float(z >> 40) / float(1ull << 24) * 2.f - 1.f) * 1.7320508f;
}

inline void fill_random(std::vector<uint16_t>& v, DType dtype, uint64_t seed) {
  parallel_for(
      int64_t(v.size()),
      [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
          const float x = hashed_unit(seed, uint64_t(i));
          v[i] = dtype == DType::kBF16 ? f32_to_bf16(x) : f32_to_f16(x);
        }
      },
      1 << 16);
}

struct PagedCase {
  PagedCaseShape shape;
  int64_t num_pages = 0;
  std::vector<uint16_t> q, k_cache, v_cache;  // element bits
  std::vector<int32_t> qo_indptr, kv_indptr, kv_indices, kv_last_page_len;
  std::vector<uint8_t> block_mask;
  std::vector<int64_t> block_mask_indptr;
  int64_t total_q = 0;

  explicit PagedCase(const PagedCaseShape& s) : shape(s) {
    const int batch = int(s.q_lens.size());
    std::mt19937_64 rng(s.seed);
    qo_indptr.assign(1, 0);
    kv_indptr.assign(1, 0);
    int64_t pages_needed = 0;
    for (int b = 0; b < batch; ++b) {
      qo_indptr.push_back(qo_indptr.back() + s.q_lens[b]);
      const int32_t pages = (s.kv_lens[b] + s.page_size - 1) / s.page_size;
      kv_indptr.push_back(kv_indptr.back() + pages);
      kv_last_page_len.push_back(pages == 0 ? 0 : s.kv_lens[b] - (pages - 1) * s.page_size);
      pages_needed += pages;
    }
    total_q = qo_indptr.back();
    if (s.contiguous_pages) {
      // Requests' runs placed in a random order, each after a gap of 0..2 unused pages.
      std::vector<int> order(batch);
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), rng);
      std::vector<int32_t> first(batch);
      int64_t next = 0;
      for (int b : order) {
        next += int64_t(rng() % 3);
        first[b] = int32_t(next);
        next += kv_indptr[b + 1] - kv_indptr[b];
      }
      num_pages = std::max<int64_t>(next, 1);
      for (int b = 0; b < batch; ++b)
        for (int32_t j = 0; j < kv_indptr[b + 1] - kv_indptr[b]; ++j)
          kv_indices.push_back(first[b] + j);
    } else {
      // A quarter more pages than needed, handed out in random order: the kernels must gather.
      num_pages = pages_needed + pages_needed / 4 + 1;
      std::vector<int32_t> ids(num_pages);
      std::iota(ids.begin(), ids.end(), 0);
      std::shuffle(ids.begin(), ids.end(), rng);
      kv_indices.assign(ids.begin(), ids.begin() + pages_needed);
    }

    const int64_t kv_elems = num_pages * s.page_size * s.num_kv_heads * s.head_dim;
    q.resize(total_q * s.num_qo_heads * s.head_dim);
    k_cache.resize(kv_elems);
    v_cache.resize(kv_elems);
    fill_random(q, s.dtype, s.seed * 3 + 1);
    fill_random(k_cache, s.dtype, s.seed * 3 + 2);
    fill_random(v_cache, s.dtype, s.seed * 3 + 3);

    if (s.sparse_keep > 0.0) {
      std::bernoulli_distribution keep(s.sparse_keep);
      const int mh = s.sparse_per_head ? s.num_qo_heads : 1;
      block_mask_indptr.assign(1, 0);
      for (int b = 0; b < batch; ++b) {
        const int64_t nqb = (s.q_lens[b] + kernels::kSparseBlock - 1) / kernels::kSparseBlock;
        const int64_t nkb = (s.kv_lens[b] + kernels::kSparseBlock - 1) / kernels::kSparseBlock;
        // The key block holding the last key a query block's first query may see (causal
        // diagonal, aligned to the end of the KV like the causal rule).
        const int group = s.num_qo_heads / s.num_kv_heads;
        for (int h = 0; h < mh; ++h) {
          if (s.sparse_same_in_group && s.sparse_per_head && h % group != 0) {
            const size_t at = block_mask.size() - size_t(h % group) * nqb * nkb;
            const std::vector<uint8_t> first(block_mask.begin() + at,
                                             block_mask.begin() + at + nqb * nkb);
            block_mask.insert(block_mask.end(), first.begin(), first.end());
            continue;
          }
          for (int64_t qb = 0; qb < nqb; ++qb) {
            const int64_t diag_key =
                std::max<int64_t>(0, s.kv_lens[b] - s.q_lens[b] + qb * kernels::kSparseBlock);
            for (int64_t kb = 0; kb < nkb; ++kb) {
              block_mask.push_back(keep(rng) || kb == diag_key / kernels::kSparseBlock);
            }
          }
        }
        block_mask_indptr.push_back(int64_t(block_mask.size()));
      }
    }
  }

  // The params over this case's host buffers; o/lse are the caller's.
  kernels::PagedPrefillParams params(void* o, float* lse) const {
    kernels::PagedPrefillParams p;
    p.q = q.data();
    p.k_cache = k_cache.data();
    p.v_cache = v_cache.data();
    p.o = o;
    p.lse = shape.with_lse ? lse : nullptr;
    p.qo_indptr = qo_indptr.data();
    p.kv_indptr = kv_indptr.data();
    p.kv_indices = kv_indices.data();
    p.kv_last_page_len = kv_last_page_len.data();
    p.kv_contiguous = shape.contiguous_pages;
    if (!block_mask.empty()) {
      p.block_mask = block_mask.data();
      p.block_mask_indptr = block_mask_indptr.data();
      p.block_mask_heads = shape.sparse_per_head ? shape.num_qo_heads : 1;
    }
    p.batch_size = int(shape.q_lens.size());
    shape.set_head_fields(p);
    p.mask_mode = shape.mask_mode;
    p.window = shape.window;
    return p;
  }

  // The same case as a decode batch (q_lens of at most kDecodeMaxQLen; qo_indptr set unless they
  // are all 1, causal from mask_mode): host pointers as above.
  kernels::DecodeParams decode_params(void* o, float* lse) const {
    kernels::DecodeParams p;
    p.q = q.data();
    p.k_cache = k_cache.data();
    p.v_cache = v_cache.data();
    p.o = o;
    p.lse = lse;
    p.kv_indptr = kv_indptr.data();
    p.kv_indices = kv_indices.data();
    p.kv_last_page_len = kv_last_page_len.data();
    p.batch_size = int(shape.kv_lens.size());
    if (total_q != p.batch_size ||
        std::any_of(shape.q_lens.begin(), shape.q_lens.end(), [](int32_t n) { return n != 1; }))
      p.qo_indptr = qo_indptr.data();
    p.causal = shape.mask_mode == kernels::MaskMode::kCausal;
    shape.set_head_fields(p);
    p.window = shape.window;
    return p;
  }
};

}  // namespace longctx::testing
