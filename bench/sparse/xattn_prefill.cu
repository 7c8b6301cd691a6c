// XAttention's prefill attention at Llama-3.1-8B shapes (32 q / 8 kv heads of 128, pages of 128),
// one layer, a prompt of CONTEXT tokens prefilled in chunks of CHUNK queries (each chunk against
// every key before it and itself, as the engine's chunked prefill): per chunk the estimate, the
// selection and the block-sparse prefill over its mask, against the dense causal prefill; then
// the block-sparse prefill over synthetic masks of fixed densities (the sink, the diagonal and
// random other blocks per q head, or one set shared by the q heads of a KV group). Inputs are
// random with a few shared directions, so the estimate's own density says little about a model:
// the engine's density on the needle model comes from `longctx needle` (docs/sparse.md).
// Prints milliseconds (CUDA events, mean of ITERS runs) and the ratios to dense.
//   bench_xattn_prefill [CONTEXT=131072] [CHUNK=16384] [STRIDE=8] [THRESHOLD=0.9] [ITERS=2]
//                       [DENSITIES=0.05,0.1,0.25]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/prefill.h"
#include "kernels/cuda/xattention.h"
#include "longctx/core/cuda_check.h"

namespace {

using namespace longctx;
using namespace longctx::kernels;

template <typename T>
T* device_copy(const std::vector<T>& v) {
  T* p = nullptr;
  LONGCTX_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(1, v.size() * sizeof(T))));
  if (!v.empty())
    LONGCTX_CUDA_CHECK(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return p;
}

struct Timer {
  cudaEvent_t a, b;
  Timer() {
    LONGCTX_CUDA_CHECK(cudaEventCreate(&a));
    LONGCTX_CUDA_CHECK(cudaEventCreate(&b));
  }
  template <typename F>
  double ms(F&& f, int iters) {
    f();  // warm-up
    LONGCTX_CUDA_CHECK(cudaEventRecord(a));
    for (int i = 0; i < iters; ++i) f();
    LONGCTX_CUDA_CHECK(cudaEventRecord(b));
    LONGCTX_CUDA_CHECK(cudaEventSynchronize(b));
    float t = 0;
    LONGCTX_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
    return double(t) / iters;
  }
};

}  // namespace

int main(int argc, char** argv) {
  const int context = argc > 1 ? std::atoi(argv[1]) : 131072;
  const int chunk = std::min(context, argc > 2 ? std::atoi(argv[2]) : 16384);
  const int stride = argc > 3 ? std::atoi(argv[3]) : 8;
  const double threshold = argc > 4 ? std::atof(argv[4]) : 0.9;
  const int iters = argc > 5 ? std::atoi(argv[5]) : 2;
  const int hq = 32, hkv = 8, d = 128, page = 128, group = hq / hkv;
  const int pages = (context + page - 1) / page;
  const int64_t row = int64_t(hkv) * d;
  std::mt19937 rng(1);
  std::normal_distribution<float> n01(0.f, 1.f);
  std::vector<float> dirs(4 * d);
  for (float& x : dirs) x = n01(rng);
  std::vector<__nv_bfloat16> k(size_t(pages) * page * row), q(size_t(chunk) * hq * d);
  for (size_t i = 0; i < k.size(); ++i) {
    const size_t tok = i / row, e = i % d;
    const float hot = (tok * 2654435761u >> 7) % 23 == 0 ? 2.f * dirs[(tok % 4) * d + e] : 0.f;
    k[i] = __float2bfloat16(0.5f * n01(rng) + hot);
  }
  for (size_t i = 0; i < q.size(); ++i)
    q[i] = __float2bfloat16(0.5f * n01(rng) + dirs[((i / (hq * d)) % 4) * d + i % d]);
  std::vector<int32_t> indices(pages);
  for (int i = 0; i < pages; ++i) indices[i] = i;
  __nv_bfloat16 *dk = device_copy(k), *dv = device_copy(k), *dq = device_copy(q), *o = nullptr;
  LONGCTX_CUDA_CHECK(cudaMalloc(&o, q.size() * sizeof(__nv_bfloat16)));
  int32_t* dind = device_copy(indices);
  const size_t ws_bytes = cuda::paged_prefill_workspace_bytes(1, chunk, group);
  void* ws = nullptr;
  LONGCTX_CUDA_CHECK(cudaMalloc(&ws, ws_bytes));
  const XAttnBuffers buf = xattn_buffers(hq, stride, chunk, 1, context);
  float* lse = nullptr;
  uint8_t *mask = nullptr, *synth = nullptr;
  unsigned long long* counters = nullptr;
  LONGCTX_CUDA_CHECK(cudaMalloc(&lse, buf.lse_elems * 4));
  LONGCTX_CUDA_CHECK(cudaMalloc(&mask, buf.mask_elems));
  LONGCTX_CUDA_CHECK(cudaMalloc(&synth, buf.mask_elems));
  LONGCTX_CUDA_CHECK(cudaMalloc(&counters, 16));
  Timer timer;
  std::vector<double> densities;
  {
    std::string list = argc > 6 ? argv[6] : "0.05,0.1,0.25";
    for (size_t at = 0; at <= list.size();) {
      const size_t end = std::min(list.find(',', at), list.size());
      const double d = std::atof(list.substr(at, end - at).c_str());
      if (d <= 0 || d > 1) {
        std::fprintf(stderr, "densities: want values in (0, 1], got %s\n", list.c_str());
        return 2;
      }
      densities.push_back(d);
      at = end + 1;
    }
  }
  const int nd = static_cast<int>(densities.size());
  double t_dense = 0, t_est = 0, t_sel = 0, t_sparse = 0, flops_dense = 0, flops_est = 0;
  std::vector<std::array<double, 2>> t_fixed(nd), dens_fixed(nd);
  double kept_union = 0;
  unsigned long long kept = 0, causal = 0;
  std::vector<uint8_t> hm;
  for (int c0 = 0; c0 < context; c0 += chunk) {
    const int n = std::min(chunk, context - c0), kv = c0 + n;
    const int32_t qo[2] = {0, n}, kvl[1] = {kv}, kvp[2] = {0, (kv + page - 1) / page};
    const int32_t last[1] = {(kv - 1) % page + 1};
    int32_t *d_qo = device_copy(std::vector<int32_t>(qo, qo + 2)),
            *d_kvp = device_copy(std::vector<int32_t>(kvp, kvp + 2)),
            *d_last = device_copy(std::vector<int32_t>(last, last + 1)),
            *d_ql = device_copy(std::vector<int32_t>{n}),
            *d_kl = device_copy(std::vector<int32_t>{kv});
    PagedPrefillParams p;
    p.q = dq;
    p.k_cache = dk;
    p.v_cache = dv;
    p.o = o;
    p.qo_indptr = d_qo;
    p.kv_indptr = d_kvp;
    p.kv_indices = dind;
    p.kv_last_page_len = d_last;
    p.batch_size = 1;
    p.num_qo_heads = hq;
    p.num_kv_heads = hkv;
    p.head_dim = d;
    p.page_size = page;
    p.mask_mode = MaskMode::kCausal;
    p.sm_scale = 1.f / std::sqrt(float(d));
    const cuda::PrefillPlan pp =
        cuda::paged_prefill_plan(qo, kvl, 1, hq, hkv, d, MaskMode::kCausal, ws, ws_bytes, nullptr);
    const cuda::XAttnPlan xp = cuda::xattn_plan(qo, kvl, 1, hq, hkv, stride);
    int32_t *d_est = device_copy(xp.estimate_items), *d_sel = device_copy(xp.select_items);
    int64_t *d_lsep = device_copy(xp.lse_indptr), *d_maskp = device_copy(xp.mask_indptr);
    XAttnEstimateParams e = xattn_estimate_params(p, stride);
    e.block_lse = lse;
    e.lse_indptr = d_lsep;
    e.work_items = d_est;
    e.num_work_items = int(xp.estimate_items.size() / 2);
    XAttnSelectParams s;
    s.block_lse = lse;
    s.lse_indptr = d_lsep;
    s.block_mask = mask;
    s.mask_indptr = d_maskp;
    s.q_lens = d_ql;
    s.kv_lens = d_kl;
    s.work_items = d_sel;
    s.num_work_items = int(xp.select_items.size() / 2);
    s.batch_size = 1;
    s.num_qo_heads = hq;
    s.stride = stride;
    s.threshold = threshold;

    t_dense += timer.ms([&] { cuda::paged_prefill_run(p, pp, nullptr); }, iters);
    flops_dense += 4.0 * hq * d * (double(n) * c0 + double(n) * n / 2);
    t_est += timer.ms([&] { cuda::xattn_estimate_run(e, nullptr); }, iters);
    flops_est += 2.0 * hq * stride * d * (double(n) / stride) * ((double(c0) + n / 2.0) / stride);
    t_sel += timer.ms([&] { cuda::xattn_select_run(s, xp.max_k_blocks, nullptr); }, iters);
    LONGCTX_CUDA_CHECK(cudaMemset(counters, 0, 16));
    s.counters = counters;
    cuda::xattn_select_run(s, xp.max_k_blocks, nullptr);
    unsigned long long cnt[2];
    LONGCTX_CUDA_CHECK(cudaMemcpy(cnt, counters, 16, cudaMemcpyDeviceToHost));
    kept += cnt[0];
    causal += cnt[1];
    PagedPrefillParams sp = p;
    sp.block_mask = mask;
    sp.block_mask_indptr = d_maskp;
    sp.block_mask_heads = hq;
    t_sparse += timer.ms([&] { cuda::paged_prefill_run(sp, pp, nullptr); }, iters);
    // The union over each KV group's q heads: what the prefill kernel's tiles compute.
    const int64_t qb = xattn_blocks(n), kb = xattn_blocks(kv);
    hm.resize(size_t(xp.mask_indptr[1]));
    LONGCTX_CUDA_CHECK(cudaMemcpy(hm.data(), mask, hm.size(), cudaMemcpyDeviceToHost));
    for (int g = 0; g < hkv; ++g)
      for (int64_t i = 0; i < qb; ++i)
        for (int64_t j = 0; j < kb; ++j) {
          bool any = false;
          for (int u = 0; u < group; ++u) any |= hm[((g * group + u) * qb + i) * kb + j] != 0;
          kept_union += any ? group : 0;
        }
    // Fixed densities: per q head, or one set per KV group.
    for (int di = 0; di < nd; ++di)
      for (int shared = 0; shared < 2; ++shared) {
        std::vector<uint8_t> m(hm.size(), 0);
        int64_t on = 0, all = 0;
        for (int h = 0; h < hq; ++h)
          for (int64_t i = 0; i < qb; ++i) {
            uint8_t* r = m.data() + (h * qb + i) * kb;
            const int64_t lo = (c0 + i * 128) / 128,
                          hi = (c0 + std::min<int64_t>(n, (i + 1) * 128) - 1) / 128;
            all += hi + 1;
            if (shared && h % group) {
              std::copy_n(m.data() + ((h - h % group) * qb + i) * kb, kb, r);
            } else {
              std::vector<int64_t> rest;
              for (int64_t j = 0; j <= hi; ++j)
                (j == 0 || j >= lo) ? void(r[j] = 1) : rest.push_back(j);
              std::shuffle(rest.begin(), rest.end(), rng);
              const int64_t want =
                  std::llround(densities[di] * (hi + 1)) - (hi + 1 - int64_t(rest.size()));
              for (int64_t t = 0; t < std::min<int64_t>(want, rest.size()); ++t) r[rest[t]] = 1;
            }
            for (int64_t j = 0; j <= hi; ++j) on += r[j];
          }
        LONGCTX_CUDA_CHECK(cudaMemcpy(synth, m.data(), m.size(), cudaMemcpyHostToDevice));
        PagedPrefillParams fp = sp;
        fp.block_mask = synth;
        t_fixed[di][shared] += timer.ms([&] { cuda::paged_prefill_run(fp, pp, nullptr); }, iters);
        dens_fixed[di][shared] += double(on) / all / ((context + chunk - 1) / chunk);
      }
    for (void* ptr : {(void*)d_qo, (void*)d_kvp, (void*)d_last, (void*)d_ql, (void*)d_kl,
                      (void*)d_est, (void*)d_sel, (void*)d_lsep, (void*)d_maskp})
      LONGCTX_CUDA_CHECK(cudaFree(ptr));
  }
  const double density = double(kept) / double(causal);
  std::printf(
      "xattention prefill, one layer, 32/8 heads x 128, context %d in chunks of %d, "
      "stride %d, threshold %.2f\n",
      context, chunk, stride, threshold);
  std::printf("| what | ms | vs dense | note |\n| --- | ---: | ---: | --- |\n");
  std::printf("| dense causal prefill | %.2f | 1.00 | %.0f TFLOP/s |\n", t_dense,
              flops_dense / t_dense * 1e-9);
  std::printf("| estimate | %.2f | %.3f | %.0f TFLOP/s |\n", t_est, t_est / t_dense,
              flops_est / t_est * 1e-9);
  std::printf("| select | %.2f | %.3f | |\n", t_sel, t_sel / t_dense);
  std::printf(
      "| sparse prefill, estimated mask | %.2f | %.3f | density %.3f per q head, %.3f per "
      "KV group |\n",
      t_sparse, t_sparse / t_dense, density, kept_union / double(causal));
  std::printf("| estimate + select + sparse | %.2f | %.3f | |\n", t_est + t_sel + t_sparse,
              (t_est + t_sel + t_sparse) / t_dense);
  for (int di = 0; di < nd; ++di)
    for (int shared = 0; shared < 2; ++shared)
      std::printf(
          "| fixed %.0f%% %s: sparse prefill / + estimate + select | %.2f / %.2f | %.3f / "
          "%.3f | density %.3f |\n",
          100 * densities[di], shared ? "per KV group" : "per q head", t_fixed[di][shared],
          t_fixed[di][shared] + t_est + t_sel, t_fixed[di][shared] / t_dense,
          (t_fixed[di][shared] + t_est + t_sel) / t_dense, dens_fixed[di][shared]);
  return 0;
}
