// Quest's decode-step kernels one by one, at Llama-3.1-8B shapes (32 q / 8 kv heads of 128,
// pages of 16 in blocks of 128), batch 1, one layer: the selection (page scores, then the
// threshold search and compaction: both, and each launch alone; at batch 1 and 8), the gather of
// the chosen pages (from the GPU, or from pinned host memory read in place), and the split-KV
// decode over the compact buffer. Prints the microseconds of each (mean of 200 runs, CUDA events),
// per layer.
//   bench_quest_kernels [CONTEXT=130000] [BUDGET=4096]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cuda/decode.h"
#include "kernels/cuda/pdl.h"
#include "kernels/cuda/quest.h"
#include "longctx/core/cuda_check.h"

namespace {

using namespace longctx;
using namespace longctx::kernels;

template <typename F>
float time_us(F&& f, int iters = 200) {
  cudaEvent_t a, b;
  LONGCTX_CUDA_CHECK(cudaEventCreate(&a));
  LONGCTX_CUDA_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < 5; ++i) f();
  LONGCTX_CUDA_CHECK(cudaEventRecord(a));
  for (int i = 0; i < iters; ++i) f();
  LONGCTX_CUDA_CHECK(cudaEventRecord(b));
  LONGCTX_CUDA_CHECK(cudaEventSynchronize(b));
  float ms = 0;
  LONGCTX_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  return 1e3f * ms / iters;
}

template <typename T>
T* device_copy(const std::vector<T>& v) {
  T* p = nullptr;
  LONGCTX_CUDA_CHECK(cudaMalloc(&p, v.size() * sizeof(T)));
  LONGCTX_CUDA_CHECK(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  const int context = argc > 1 ? std::atoi(argv[1]) : 130000;
  const int budget = argc > 2 ? std::atoi(argv[2]) : 4096;
  const int hq = 32, hkv = 8, d = 128, bs = 128, page = 16, ppb = bs / page;
  const int blocks = (context + bs - 1) / bs;
  const int64_t row = int64_t(hkv) * d, blk = int64_t(bs) * row;
  std::mt19937 rng(1);
  std::normal_distribution<float> n01(0.f, 1.f);
  auto random_bf16 = [&](size_t n) {
    std::vector<__nv_bfloat16> v(n);
    for (auto& x : v) x = __float2bfloat16(n01(rng));
    return v;
  };
  // Keys in the GPU pool and in pinned host memory (both [blocks][bs][hkv][d], K then V).
  const auto keys = random_bf16(size_t(blocks) * blk);
  __nv_bfloat16* k_dev = device_copy(keys);
  __nv_bfloat16* v_dev = device_copy(keys);
  void* host = nullptr;
  LONGCTX_CUDA_CHECK(cudaMallocHost(&host, 2 * keys.size() * sizeof(__nv_bfloat16)));
  std::memcpy(host, keys.data(), keys.size() * sizeof(__nv_bfloat16));
  std::memcpy(static_cast<__nv_bfloat16*>(host) + keys.size(), keys.data(),
              keys.size() * sizeof(__nv_bfloat16));
  std::vector<int32_t> table(blocks), loc_dev(blocks), loc_host(blocks);
  for (int b = 0; b < blocks; ++b) table[b] = b, loc_dev[b] = b, loc_host[b] = -b - 1;
  std::vector<int32_t> pages;
  for (int j = 0; j * page < context; ++j)
    pages.insert(pages.end(), {j / ppb, j / ppb, j % ppb, page});
  const std::vector<int32_t> indptr = {0, blocks}, lens = {context};
  int32_t *d_table = device_copy(table), *d_loc_dev = device_copy(loc_dev),
          *d_loc_host = device_copy(loc_host), *d_pages = device_copy(pages),
          *d_indptr = device_copy(indptr), *d_lens = device_copy(lens);
  __nv_bfloat16* q = device_copy(random_bf16(size_t(hq) * d));
  __nv_bfloat16* meta = nullptr;
  LONGCTX_CUDA_CHECK(cudaMalloc(&meta, size_t(blocks) * ppb * row * 2 * sizeof(__nv_bfloat16)));
  QuestMetaParams m;
  m.k_cache = k_dev;
  m.block_stride = blk;
  m.meta = meta;
  m.pages = d_pages;
  m.num_pages = static_cast<int>(pages.size() / 4);
  m.num_kv_heads = hkv;
  m.head_dim = d;
  m.page_tokens = page;
  m.pages_per_block = ppb;
  m.dtype = DType::kBF16;
  cuda::quest_meta_run(m, nullptr);

  QuestBudget qb{page, budget, 64, 256};
  const int max_pages = (context + page - 1) / page;
  const int max_sel = std::min(quest_max_selected(qb), max_pages);
  float* scores = nullptr;
  int32_t* selected = nullptr;
  LONGCTX_CUDA_CHECK(cudaMalloc(&scores, size_t(hkv) * max_pages * 4));
  LONGCTX_CUDA_CHECK(cudaMalloc(&selected, size_t(hkv) * max_sel * 4));
  __nv_bfloat16 *ck = nullptr, *cv = nullptr, *o = nullptr;
  LONGCTX_CUDA_CHECK(cudaMalloc(&ck, size_t(max_sel) * page * row * 2));
  LONGCTX_CUDA_CHECK(cudaMalloc(&cv, size_t(max_sel) * page * row * 2));
  LONGCTX_CUDA_CHECK(cudaMalloc(&o, size_t(hq) * d * 2));
  QuestSelectParams s;
  s.q = q;
  s.meta = meta;
  s.block_indptr = d_indptr;
  s.block_tables = d_table;
  s.kv_lens = d_lens;
  s.scores = scores;
  s.selected = selected;
  s.batch = 1;
  s.num_qo_heads = hq;
  s.num_kv_heads = hkv;
  s.head_dim = d;
  s.pages_per_block = ppb;
  s.max_pages = max_pages;
  s.max_selected = max_sel;
  s.budget = qb;
  s.dtype = DType::kBF16;

  std::printf(
      "quest kernels, one layer, batch 1: context %d, budget %d (%d of %d pages per KV head)\n",
      context, budget, quest_count(context, qb).num_selected, max_pages);
  // The selection's two launches apart: the scores, and the lists from scores already there
  // (select_kernel alone); then both.
  auto print_select = [&](QuestSelectParams& sp, const char* what) {
    for (bool per_head : {true, false}) {
      sp.per_head = per_head;
      const float score = time_us([&] { cuda::quest_score_run(sp, nullptr); });
      const float lists = time_us([&] { cuda::quest_select_lists_run(sp, nullptr); });
      std::printf("  select (%s, %s): %.1f us, of which the scores %.1f us; lists alone %.1f us\n",
                  per_head ? "per KV head" : "head-averaged", what,
                  time_us([&] { cuda::quest_select_run(sp, nullptr); }), score, lists);
    }
  };
  print_select(s, "batch 1");
  // The same without programmatic dependent launch (each kernel waits for the one before).
  cuda::set_pdl_allowed(0, false);
  print_select(s, "batch 1, no PDL");
  cuda::set_pdl_allowed(0, true);
  {
    // Batch 8: eight sequences of `context` keys, each over its own copy of the metadata (no L2
    // reuse between them).
    const int batch8 = 8;
    const size_t meta_elems = size_t(blocks) * ppb * row * 2;
    __nv_bfloat16* meta8 = nullptr;
    LONGCTX_CUDA_CHECK(cudaMalloc(&meta8, batch8 * meta_elems * sizeof(__nv_bfloat16)));
    std::vector<int32_t> table8(size_t(batch8) * blocks), indptr8(batch8 + 1), lens8(batch8);
    for (int b = 0; b < batch8; ++b) {
      LONGCTX_CUDA_CHECK(cudaMemcpy(meta8 + b * meta_elems, meta,
                                    meta_elems * sizeof(__nv_bfloat16), cudaMemcpyDeviceToDevice));
      for (int k = 0; k < blocks; ++k) table8[size_t(b) * blocks + k] = b * blocks + k;
      indptr8[b] = b * blocks;
      lens8[b] = context;
    }
    indptr8[batch8] = batch8 * blocks;
    QuestSelectParams s8 = s;
    s8.batch = batch8;
    s8.meta = meta8;
    s8.block_tables = device_copy(table8);
    s8.block_indptr = device_copy(indptr8);
    s8.kv_lens = device_copy(lens8);
    s8.q = device_copy(random_bf16(size_t(batch8) * hq * d));
    LONGCTX_CUDA_CHECK(cudaMalloc(&s8.scores, size_t(batch8) * hkv * max_pages * 4));
    LONGCTX_CUDA_CHECK(cudaMalloc(&s8.selected, size_t(batch8) * hkv * max_sel * 4));
    print_select(s8, "batch 8");
    LONGCTX_CUDA_CHECK(cudaFree(meta8));
  }
  s.per_head = true;
  {
    QuestSelectParams all = s;  // no page beyond the sink and window: no scores, no radix select
    all.budget.budget_tokens = all.budget.sink_tokens + all.budget.window_tokens + 1;
    std::printf("  select with no free page (launches and the ordered compaction): %.1f us\n",
                time_us([&] { cuda::quest_select_run(all, nullptr); }));
  }
  QuestGatherParams g;
  g.block_indptr = d_indptr;
  g.kv_lens = d_lens;
  g.selected = selected;
  g.out_k = ck;
  g.out_v = cv;
  g.batch = 1;
  g.num_kv_heads = hkv;
  g.head_dim = d;
  g.pages_per_block = ppb;
  g.max_selected = max_sel;
  g.budget = qb;
  g.dtype = DType::kBF16;
  g.k_base[0] = k_dev;
  g.v_base[0] = v_dev;
  g.block_stride[0] = blk;
  void* host_dev = nullptr;
  LONGCTX_CUDA_CHECK(cudaHostGetDevicePointer(&host_dev, host, 0));
  g.k_base[1] = host_dev;
  g.v_base[1] = static_cast<__nv_bfloat16*>(host_dev) + keys.size();
  g.block_stride[1] = blk;
  const double bytes = double(quest_count(context, qb).num_selected) * page * d * 2 * 2 * hkv;
  g.block_loc = d_loc_dev;
  const float gpu_us = time_us([&] { cuda::quest_gather_run(g, nullptr); });
  g.block_loc = d_loc_host;
  const float host_us = time_us([&] { cuda::quest_gather_run(g, nullptr); }, 50);
  std::printf(
      "  gather from the GPU: %.1f us; from pinned host memory: %.1f us (%.1f MB, %.1f GB/s)\n",
      gpu_us, host_us, bytes / 1e6, bytes / (host_us * 1e-6) / 1e9);

  const int sel_len = (quest_count(context, qb).num_selected - 1) * page + page;
  const std::vector<int32_t> dec_indptr = {0, 1}, dec_indices = {0}, dec_last = {sel_len};
  int32_t *di = device_copy(dec_indptr), *dx = device_copy(dec_indices),
          *dl = device_copy(dec_last);
  const size_t ws_bytes = cuda::decode_workspace_bytes(1, hq, hkv, d);
  void* ws = nullptr;
  LONGCTX_CUDA_CHECK(cudaMalloc(&ws, ws_bytes));
  const cuda::DecodePlan plan = cuda::decode_plan(
      dec_indptr.data(), dec_last.data(), 1, max_sel * page, hq, hkv, d, ws, ws_bytes, nullptr);
  DecodeParams dp;
  dp.q = q;
  dp.k_cache = ck;
  dp.v_cache = cv;
  dp.o = o;
  dp.kv_indptr = di;
  dp.kv_indices = dx;
  dp.kv_last_page_len = dl;
  dp.batch_size = 1;
  dp.num_qo_heads = hq;
  dp.num_kv_heads = hkv;
  dp.head_dim = d;
  dp.page_size = max_sel * page;
  dp.dtype = DType::kBF16;
  dp.sm_scale = 1.f / std::sqrt(float(d));
  std::printf("  decode over the compact pages (%d keys): %.1f us\n", sel_len,
              time_us([&] { cuda::decode_run(dp, plan, nullptr); }));
  m.num_pages = 1;
  std::printf("  metadata of one new page: %.1f us\n",
              time_us([&] { cuda::quest_meta_run(m, nullptr); }));
  return 0;
}
