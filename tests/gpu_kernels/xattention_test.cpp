// XAttention's CUDA kernels (kernels/cuda/xattention.h) against their CPU references
// (kernels/cpu/xattention_cpu.h, the CPU engine's policy; tests/kv/test_sparse_policy.cpp
// checks them against a brute force):
//   - estimate: every block log-sum-exp a row can see within 2e-3 of the reference (fp32 dot
//     products in another order, exp2 / log2 approximations), none NaN;
//   - select (from the GPU's estimate, so both sides see the same input): each query block keeps
//     its sink and diagonal and nothing past the diagonal, reaches threshold x its mass, takes
//     no block it did not need and only blocks at least as heavy as every block it left out (up
//     to 1e-5 of the row's mass: near ties may go either way); the counters equal the masks'
//     kept and causal blocks;
//   - batches mixing long prefills, chunks at an offset, one-query rows and short sequences
//     (dense masks), strides 4 / 8 / 16, head_dim 64 / 128, GQA 1 / 4 / 8, pages 16 / 128,
//     and q rows with padding (the fused QKV layout).
//   - gather (the offload path's values): byte-equal to the reference from mapped pinned host
//     memory and from device memory, random masks, pages 16 / 64 / 128 / 256, the bytes counter.
// Every output lives in a guarded buffer pre-filled with NaN bytes; the guards must survive.
#include "kernels/cuda/xattention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "gpu_kernels/harness.h"
#include "kernels/cpu/xattention_cpu.h"
#include "longctx/core/cuda_check.h"

namespace longctx::gpu_test {
namespace {

struct Shape {
  int hq = 32, hkv = 8, d = 128, page = 128, stride = 8;
  std::vector<std::pair<int, int>> seqs = {{1000, 5000}};  // (queries, keys)
  int q_pad = 0;                                           // extra elements per q row
  double threshold = 0.9;
  bool per_kv_head = true;  // one selection per KV head from its q heads' summed masses
  uint64_t seed = 1;
};

void run_case(const Shape& s) {
  SCOPED_TRACE(::testing::Message()
               << "hq " << s.hq << " hkv " << s.hkv << " d " << s.d << " page " << s.page
               << " stride " << s.stride << (s.per_kv_head ? " per KV head" : " per q head"));
  const int hpm = s.per_kv_head ? s.hq / s.hkv : 1;
  std::mt19937 rng(static_cast<uint32_t>(s.seed));
  const int batch = static_cast<int>(s.seqs.size());
  const int64_t row = int64_t(s.hkv) * s.d, q_row = int64_t(s.hq) * s.d + s.q_pad;
  std::vector<int32_t> qo = {0}, kv_indptr = {0}, last, kv_lens, q_lens;
  for (auto [n, kv] : s.seqs) {
    qo.push_back(qo.back() + n);
    kv_indptr.push_back(kv_indptr.back() + (kv + s.page - 1) / s.page);
    last.push_back(kv == 0 ? 0 : (kv - 1) % s.page + 1);
    kv_lens.push_back(kv);
    q_lens.push_back(n);
  }
  const int num_pages = kv_indptr.back() + 2;
  std::vector<int32_t> pages(num_pages);
  std::iota(pages.begin(), pages.end(), 0);
  std::shuffle(pages.begin(), pages.end(), rng);
  pages.resize(kv_indptr.back());

  // Keys: noise plus a few "needle" directions that some queries share, so masses are uneven
  // and the threshold keeps a real subset.
  std::normal_distribution<float> n01(0.f, 1.f);
  std::vector<float> dirs(size_t(4) * s.d);
  for (float& x : dirs) x = n01(rng);
  std::vector<uint16_t> keys(size_t(num_pages) * s.page * row), q(size_t(qo.back()) * q_row);
  for (size_t i = 0; i < keys.size(); ++i) {
    const size_t e = i % s.d, tok = i / row;
    const float hot = (tok * 2654435761u >> 7) % 23 == 0 ? 2.f * dirs[(tok % 4) * s.d + e] : 0.f;
    keys[i] = f32_to_bf16(0.5f * n01(rng) + hot);
  }
  for (size_t i = 0; i < q.size(); ++i) {
    const size_t e = i % q_row, tok = i / q_row;
    q[i] = e < size_t(s.hq) * s.d ? f32_to_bf16(n01(rng) * 0.5f + dirs[(tok % 4) * s.d + e % s.d])
                                  : 0x7fc0;  // padding: NaN, never read
  }

  const kernels::cuda::XAttnPlan plan =
      kernels::cuda::xattn_plan(qo.data(), kv_lens.data(), batch, s.hq, s.hkv, s.stride);
  GuardedBuffer d_q = upload_vector(q), d_k = upload_vector(keys), d_qo = upload_vector(qo),
                d_kvp = upload_vector(kv_indptr), d_pages = upload_vector(pages),
                d_last = upload_vector(last), d_est = upload_vector(plan.estimate_items),
                d_sel = upload_vector(plan.select_items), d_lsep = upload_vector(plan.lse_indptr),
                d_maskp = upload_vector(plan.mask_indptr), d_ql = upload_vector(q_lens),
                d_kl = upload_vector(kv_lens);
  const int64_t lse_n = plan.lse_indptr.back(), mask_n = plan.mask_indptr.back();
  GuardedBuffer d_lse(std::max<int64_t>(lse_n, 1) * 4, 0xFF),
      d_mask(std::max<int64_t>(mask_n, 1), 0xFF);
  GuardedBuffer d_counters(16, 0);

  kernels::XAttnEstimateParams e;
  e.q = d_q.data();
  e.q_row_stride = q_row;
  e.k_cache = d_k.data();
  e.qo_indptr = static_cast<const int32_t*>(d_qo.data());
  e.kv_indptr = static_cast<const int32_t*>(d_kvp.data());
  e.kv_indices = static_cast<const int32_t*>(d_pages.data());
  e.kv_last_page_len = static_cast<const int32_t*>(d_last.data());
  e.block_lse = static_cast<float*>(d_lse.data());
  e.lse_indptr = static_cast<const int64_t*>(d_lsep.data());
  e.work_items = static_cast<const int32_t*>(d_est.data());
  e.num_work_items = static_cast<int>(plan.estimate_items.size() / 2);
  e.batch_size = batch;
  e.num_qo_heads = s.hq;
  e.num_kv_heads = s.hkv;
  e.head_dim = s.d;
  e.page_size = s.page;
  e.stride = s.stride;
  e.dtype = DType::kBF16;
  e.sm_scale = 1.f / std::sqrt(float(s.d));
  ASSERT_TRUE(kernels::cuda::xattn_estimate_supported(e));
  kernels::cuda::xattn_estimate_run(e, nullptr);

  kernels::XAttnSelectParams sel;
  sel.block_lse = e.block_lse;
  sel.lse_indptr = e.lse_indptr;
  sel.block_mask = static_cast<uint8_t*>(d_mask.data());
  sel.mask_indptr = static_cast<const int64_t*>(d_maskp.data());
  sel.q_lens = static_cast<const int32_t*>(d_ql.data());
  sel.kv_lens = static_cast<const int32_t*>(d_kl.data());
  sel.work_items = static_cast<const int32_t*>(d_sel.data());
  sel.num_work_items = static_cast<int>(plan.select_items.size() / 2);
  sel.counters = static_cast<unsigned long long*>(d_counters.data());
  sel.batch_size = batch;
  sel.num_qo_heads = s.hq;
  sel.heads_per_mask = hpm;
  sel.stride = s.stride;
  sel.threshold = s.threshold;
  kernels::cuda::xattn_select_run(sel, plan.max_k_blocks, nullptr);
  LONGCTX_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_TRUE(d_lse.guards_intact());
  EXPECT_TRUE(d_mask.guards_intact());

  // The estimate.
  std::vector<float> lse_ref(std::max<int64_t>(lse_n, 1), NAN);
  kernels::XAttnEstimateParams er = e;
  er.q = q.data();
  er.k_cache = keys.data();
  er.qo_indptr = qo.data();
  er.kv_indptr = kv_indptr.data();
  er.kv_indices = pages.data();
  er.kv_last_page_len = last.data();
  er.block_lse = lse_ref.data();
  er.lse_indptr = plan.lse_indptr.data();
  kernels::cpu::xattn_estimate(er);
  const std::vector<float> lse = d_lse.download<float>();
  int64_t compared = 0, bad = 0;
  double worst = 0;
  for (int b = 0; b < batch; ++b) {
    const int n = q_lens[b], kv = kv_lens[b], S = s.stride;
    if (plan.lse_indptr[b + 1] == plan.lse_indptr[b]) continue;  // dense: no estimate
    const int64_t groups = kernels::xattn_q_groups(n, S), kb = kernels::xattn_blocks(kv);
    for (int h = 0; h < s.hq; ++h)
      for (int64_t r = 0; r < groups; ++r) {
        const int64_t vis = std::min<int64_t>((kv + S - 1) / S, (kv - n) / S + r + 1);
        for (int64_t j = 0; j <= (vis - 1) / (128 / S); ++j) {
          const int64_t at = plan.lse_indptr[b] + (h * groups + r) * kb + j;
          const float g = lse[at], w = lse_ref[at];
          ++compared;
          const bool same_inf = std::isinf(g) && std::isinf(w) && g == w;
          const double diff = same_inf ? 0 : std::fabs(double(g) - double(w));
          worst = std::max(worst, std::isnan(diff) ? INFINITY : diff);
          if (!(diff <= 2e-3)) ++bad;
        }
      }
  }
  EXPECT_EQ(bad, 0) << "of " << compared << " block lse entries; worst diff " << worst;

  // The selection, judged by the CPU masses of the GPU's own estimate.
  const std::vector<uint8_t> mask = d_mask.download<uint8_t>();
  sel.block_lse = lse.data();
  sel.lse_indptr = plan.lse_indptr.data();
  sel.q_lens = q_lens.data();
  sel.kv_lens = kv_lens.data();
  int64_t kept_total = 0, causal_total = 0, sparse_rows = 0, rows_differing = 0;
  std::vector<uint8_t> mask_ref(std::max<int64_t>(mask_n, 1));
  sel.block_mask = mask_ref.data();
  sel.mask_indptr = plan.mask_indptr.data();
  kernels::cpu::xattn_select(sel);
  for (int b = 0; b < batch; ++b) {
    const int n = q_lens[b], kv = kv_lens[b], p0 = kv - n;
    const int64_t qb = kernels::xattn_blocks(n), kb = kernels::xattn_blocks(kv);
    const bool dense = plan.lse_indptr[b + 1] == plan.lse_indptr[b];
    for (int h = 0; h < s.hq; ++h)
      for (int64_t i = 0; i < qb; ++i) {
        const uint8_t* m = mask.data() + plan.mask_indptr[b] + (h * qb + i) * kb;
        const uint8_t* mr = mask_ref.data() + plan.mask_indptr[b] + (h * qb + i) * kb;
        const int64_t lo = (p0 + i * 128) / 128,
                      hi = (p0 + std::min<int64_t>(n, (i + 1) * 128) - 1) / 128;
        causal_total += hi + 1;
        rows_differing += !std::equal(m, m + kb, mr);
        double total = 0, kept = 0, lightest_taken = INFINITY, heaviest_left = 0;
        std::vector<double> masses(kb, 0.0);
        for (int u = h - h % hpm; u < h - h % hpm + hpm && !dense; ++u) {
          const std::vector<double> one = kernels::cpu::xattn_block_masses(sel, b, u, i);
          for (int64_t j = 0; j < kb; ++j) masses[j] += one[j];
        }
        if (h % hpm)
          EXPECT_TRUE(std::equal(m, m + kb, m - qb * kb)) << "a KV head's q heads share its mask";
        for (int64_t j = 0; j < kb; ++j) {
          ASSERT_LE(m[j], 1) << "b " << b << " h " << h << " i " << i << " j " << j;
          kept_total += m[j];
          if (j > hi) {
            ASSERT_EQ(m[j], 0) << "past the diagonal: b " << b << " h " << h << " i " << i;
            continue;
          }
          if (dense || j == 0 || j >= lo) {
            ASSERT_EQ(m[j], 1) << "sink / diagonal / dense: b " << b << " h " << h << " i " << i;
            if (dense) continue;
          }
          const double mass = masses[j];
          total += mass;
          if (m[j]) kept += mass;
          if (j != 0 && j < lo) {
            if (m[j])
              lightest_taken = std::min(lightest_taken, mass);
            else
              heaviest_left = std::max(heaviest_left, mass);
          }
        }
        if (dense) continue;
        const double tol = 1e-5 * total;
        EXPECT_GE(kept, s.threshold * total - tol) << "b " << b << " h " << h << " i " << i;
        if (lightest_taken < INFINITY) {
          ++sparse_rows;
          EXPECT_LT(kept - lightest_taken, s.threshold * total + tol) << "took a block too many";
          EXPECT_GE(lightest_taken, heaviest_left - tol) << "left a heavier block out";
        }
      }
  }
  const std::vector<int64_t> counters = d_counters.download<int64_t>();
  EXPECT_EQ(counters[0], kept_total);
  EXPECT_EQ(counters[1], causal_total);
  std::printf(
      "    %lld lse entries (worst diff %.2e), %lld sparse rows, %lld masks differ from "
      "the CPU's (near ties), density %.3f\n",
      static_cast<long long>(compared), worst, static_cast<long long>(sparse_rows),
      static_cast<long long>(rows_differing), double(kept_total) / causal_total);
}

TEST(XAttentionKernels, EstimateAndSelectMatchTheReference) {
  run_case({});  // one chunk at an offset, Llama-8B heads
  Shape s;
  s.seqs = {{3000, 3000}, {1, 700}, {300, 300}, {517, 2300}, {129, 129}};
  s.stride = 16;
  s.page = 16;
  s.seed = 2;
  run_case(s);
  s = {};
  s.hq = 8;
  s.hkv = 8;
  s.d = 64;
  s.stride = 4;
  s.seqs = {{2049, 6001}};
  s.q_pad = 2 * 8 * 64;  // the fused QKV row: q heads, then K and V
  s.threshold = 0.95;
  s.per_kv_head = false;
  s.seed = 3;
  run_case(s);
  s = {};
  s.hq = 16;
  s.hkv = 2;
  s.d = 64;
  s.seqs = {{4096, 40000}, {8, 12000}};
  s.page = 64;
  s.seed = 4;
  run_case(s);
  s.per_kv_head = false;  // GQA 8 per q head
  s.seqs = {{1000, 9000}};
  run_case(s);
  s = {};
  s.hq = 12;  // GQA 3: one head per estimate tile
  s.hkv = 4;
  s.seqs = {{700, 1500}, {2, 900}};
  s.seed = 5;
  run_case(s);
}

// The gather against its reference: random masks over a batch, every staged block of each
// request, the source in mapped pinned host memory (as the offload path reads it) or on the
// device.
void run_gather(int hq, int hkv, int d, int bs, DType dtype, bool host_src, uint32_t seed) {
  SCOPED_TRACE(::testing::Message() << "hq " << hq << " hkv " << hkv << " d " << d << " block "
                                    << bs << (host_src ? " host" : " device") << " source");
  std::mt19937 rng(seed);
  const std::vector<std::pair<int, int>> seqs = {{2000, 9000}, {1, 3000}, {300, 300}, {77, 4100}};
  std::vector<int32_t> q_lens, kv_lens, items;
  std::vector<int64_t> mask_indptr = {0};
  int32_t slots = 0;
  for (int b = 0; b < int(seqs.size()); ++b) {
    auto [n, kv] = seqs[b];
    q_lens.push_back(n);
    kv_lens.push_back(kv);
    mask_indptr.push_back(mask_indptr.back() + kernels::xattn_mask_elems(n, kv, hq));
    for (int j = 0; j * bs < kv; ++j)
      if (rng() % 4 != 0) items.insert(items.end(), {b, j, 0, slots++});
  }
  const int num_src = slots + 3;
  std::vector<int32_t> perm(num_src);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  for (int i = 0; i < slots; ++i) items[4 * i + 2] = perm[i];
  std::vector<uint8_t> mask(mask_indptr.back());
  for (auto& m : mask) m = rng() % 7 == 0;
  const int64_t es = int64_t(dtype_size(dtype)), block = int64_t(bs) * hkv * d * es;
  const int64_t stride = 2 * block;  // K and V adjacent, as the offload layout
  std::vector<uint8_t> src(num_src * stride);
  for (auto& x : src) x = static_cast<uint8_t>(rng());
  void* host = nullptr;
  LONGCTX_CUDA_CHECK(cudaHostAlloc(&host, src.size(), cudaHostAllocMapped));
  std::memcpy(host, src.data(), src.size());
  GuardedBuffer d_src = upload_vector(src);
  const int64_t offset = 3;  // destination blocks counted past a base, as the staging is
  GuardedBuffer d_dst((slots + offset) * stride, 0xFF),
      d_mask = upload_vector(mask), d_mask_indptr = upload_vector(mask_indptr),
      d_q = upload_vector(q_lens), d_kv = upload_vector(kv_lens), d_items = upload_vector(items),
      d_bytes(8, 0);
  kernels::XAttnGatherParams p;
  p.block_mask = mask.data();
  p.mask_indptr = mask_indptr.data();
  p.q_lens = q_lens.data();
  p.kv_lens = kv_lens.data();
  p.items = items.data();
  p.num_items = slots;
  p.block_stride = stride;
  p.dst_block_offset = offset;
  p.block_size = bs;
  p.num_qo_heads = hq;
  p.num_kv_heads = hkv;
  p.head_dim = d;
  p.dtype = dtype;
  std::vector<uint8_t> want((slots + offset) * stride, 0xFF);
  p.src = src.data() + block;  // V: the second half of each block
  p.dst = want.data() + block;
  const int64_t copied = kernels::cpu::xattn_gather_values(p);
  p.block_mask = static_cast<const uint8_t*>(d_mask.data());
  p.mask_indptr = static_cast<const int64_t*>(d_mask_indptr.data());
  p.q_lens = static_cast<const int32_t*>(d_q.data());
  p.kv_lens = static_cast<const int32_t*>(d_kv.data());
  p.items = static_cast<const int32_t*>(d_items.data());
  p.src = static_cast<const char*>(host_src ? host : d_src.data()) + block;
  p.dst = static_cast<char*>(d_dst.data()) + block;
  p.bytes_copied = static_cast<unsigned long long*>(d_bytes.data());
  ASSERT_TRUE(kernels::cuda::xattn_gather_supported(p));
  kernels::cuda::xattn_gather_run(p, nullptr);
  LONGCTX_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<uint8_t> got(want.size());
  d_dst.download(got.data());
  int64_t counted = 0;
  d_bytes.download(&counted);
  cudaFreeHost(host);
  EXPECT_TRUE(got == want) << "the gathered blocks differ from the reference";
  EXPECT_EQ(counted, copied);
  EXPECT_GT(copied, 0);
  EXPECT_LT(copied, int64_t(slots) * block);  // sparse masks: not every row
  EXPECT_TRUE(d_dst.guards_intact());
  std::printf("    gather: %d blocks, %lld of %lld bytes kept\n", slots,
              static_cast<long long>(copied), static_cast<long long>(int64_t(slots) * block));
}

TEST(XAttentionKernels, GatherCopiesTheKeptValues) {
  run_gather(32, 8, 128, 128, DType::kBF16, true, 1);
  run_gather(32, 8, 128, 256, DType::kBF16, true, 2);
  run_gather(16, 2, 64, 16, DType::kF16, false, 3);
  run_gather(12, 4, 64, 64, DType::kBF16, true, 4);
}

TEST(XAttentionKernels, BadShapesAreClearErrors) {
  const int32_t qo[2] = {0, 10}, kv[1] = {5};
  EXPECT_THROW(kernels::cuda::xattn_plan(qo, kv, 1, 4, 2, 8), Error);  // more queries than keys
  const int32_t kv2[1] = {100};
  EXPECT_THROW(kernels::cuda::xattn_plan(qo, kv2, 1, 4, 2, 32), Error);  // stride 32
  const int32_t kv3[1] = {kernels::cuda::kXAttnMaxKvLen + 1};
  EXPECT_THROW(kernels::cuda::xattn_plan(qo, kv3, 1, 4, 2, 8), Error);
}

// Requests with fewer keys than --xattn-min-len attend densely: no estimate items, no block_lse
// (the other request of the step keeps both), masks for every request.
TEST(XAttentionKernels, PlanSkipsTheEstimateBelowTheMinimumLength) {
  const int32_t qo[3] = {0, 1000, 3000}, kv[2] = {4000, 9000};
  const auto all = kernels::cuda::xattn_plan(qo, kv, 2, 8, 2, 8, 0);
  const auto some = kernels::cuda::xattn_plan(qo, kv, 2, 8, 2, 8, 8192);
  EXPECT_EQ(all.lse_indptr[1], 8 * (1000 / 8) * 32);
  EXPECT_EQ(some.lse_indptr[1], 0);
  EXPECT_EQ(some.lse_indptr[2], all.lse_indptr[2] - all.lse_indptr[1]);
  EXPECT_EQ(some.mask_indptr, all.mask_indptr);
  EXPECT_EQ(some.select_items, all.select_items);
  ASSERT_FALSE(some.estimate_items.empty());
  EXPECT_LT(some.estimate_items.size(), all.estimate_items.size());
  for (size_t i = 0; i < some.estimate_items.size(); i += 2) EXPECT_EQ(some.estimate_items[i], 1);
}

}  // namespace
}  // namespace longctx::gpu_test
