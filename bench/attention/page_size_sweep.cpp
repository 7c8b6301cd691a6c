#include "page_size_sweep.h"

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <random>

#include "bench_common.h"
#include "kernels/attention_params.h"
#include "kernels/cuda/decode.h"
#include "kernels/cuda/prefill.h"
#include "kernels/decode_params.h"

namespace longctx::bench {

namespace {

// The page-size sweep at Llama-3.1-8B attention shapes: one request whose pages sit in a shuffled
// order in a pool a quarter larger than needed (as a real pool hands them out), for each page
// size:
//   - causal prefill of a 32K prompt as one chunk (q 32K over 32K keys);
//   - the same prompt as 4 chunks of 8K queries over the growing cache (chunk c: q 8K over
//     8K * (c + 1) keys), summed;
//   - batch-1 decode over 32K and 128K keys;
//   - offload streaming: one layer's K and V of 32K tokens copied page by page (one
//     cudaMemcpyAsync per page and tensor) from a pinned host pool, pages in shuffled order, to a
//     contiguous device buffer (the granularity a paged host pool streams at).
// Plans are built outside the timing.
struct SweepPool {
  int page = 0;
  void* k = nullptr;           // [pool_pages, page, kHk, kD] bf16
  void* v = nullptr;           // [pool_pages, page, kHk, kD] bf16
  std::vector<int32_t> order;  // the request's page ids, shuffled
};

SweepPool make_pool(int page, int64_t max_tokens) {
  SweepPool p;
  p.page = page;
  const int64_t needed = (max_tokens + page - 1) / page;
  const int64_t pool_pages = needed + needed / 4;
  p.k = random_bf16(pool_pages * page * kHk * kD, 11);
  p.v = random_bf16(pool_pages * page * kHk * kD, 12);
  std::vector<int32_t> ids(pool_pages);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(uint32_t(page)));
  p.order.assign(ids.begin(), ids.begin() + needed);
  return p;
}

// Causal prefill of q_len queries over the first kv_len keys of the pool's request; ms.
double time_pool_prefill(const SweepPool& pool, const void* q, void* o, int q_len, int kv_len,
                         cudaStream_t stream) {
  const int pages = (kv_len + pool.page - 1) / pool.page;
  std::vector<int32_t> qo = {0, q_len}, kvp = {0, pages},
                       idx(pool.order.begin(), pool.order.begin() + pages),
                       last = {kv_len - (pages - 1) * pool.page}, kvl = {kv_len};
  kernels::PagedPrefillParams p;
  p.q = q;
  p.k_cache = pool.k;
  p.v_cache = pool.v;
  p.o = o;
  p.qo_indptr = upload(qo);
  p.kv_indptr = upload(kvp);
  p.kv_indices = upload(idx);
  p.kv_last_page_len = upload(last);
  p.batch_size = 1;
  p.num_qo_heads = kHq;
  p.num_kv_heads = kHk;
  p.head_dim = kD;
  p.page_size = pool.page;
  p.dtype = DType::kBF16;
  p.mask_mode = kernels::MaskMode::kCausal;
  p.sm_scale = 1.f / std::sqrt(float(kD));
  const size_t ws_bytes = kernels::cuda::paged_prefill_workspace_bytes(1, q_len, kHq / kHk) +
                          kernels::cuda::paged_prefill_split_workspace_bytes(kD);
  void* ws = nullptr;
  LONGCTX_CUDA_CHECK(cudaMalloc(&ws, ws_bytes));
  auto plan = kernels::cuda::paged_prefill_plan(qo.data(), kvl.data(), 1, kHq, kHk, kD, p.mask_mode,
                                                ws, ws_bytes, stream, g_tuning.prefill);
  const double ms = time_ms([&] { kernels::cuda::paged_prefill_run(p, plan, stream); }, stream, 10);
  for (void* x :
       {(void*)p.qo_indptr, (void*)p.kv_indptr, (void*)p.kv_indices, (void*)p.kv_last_page_len, ws})
    cudaFree(x);
  return ms;
}

// Batch-1 decode over the first kv_len keys of the pool's request; ms.
double time_pool_decode(const SweepPool& pool, const void* q, void* o, float* lse, int kv_len,
                        cudaStream_t stream) {
  const int pages = (kv_len + pool.page - 1) / pool.page;
  std::vector<int32_t> kvp = {0, pages}, idx(pool.order.begin(), pool.order.begin() + pages),
                       last = {kv_len - (pages - 1) * pool.page};
  kernels::DecodeParams p;
  p.q = q;
  p.k_cache = pool.k;
  p.v_cache = pool.v;
  p.o = o;
  p.lse = lse;
  p.kv_indptr = upload(kvp);
  p.kv_indices = upload(idx);
  p.kv_last_page_len = upload(last);
  p.batch_size = 1;
  p.num_qo_heads = kHq;
  p.num_kv_heads = kHk;
  p.head_dim = kD;
  p.page_size = pool.page;
  p.dtype = DType::kBF16;
  p.sm_scale = 1.f / std::sqrt(float(kD));
  const size_t ws_bytes = kernels::cuda::decode_workspace_bytes(1, kHq, kHk, kD);
  void* ws = nullptr;
  LONGCTX_CUDA_CHECK(cudaMalloc(&ws, ws_bytes));
  auto plan = kernels::cuda::decode_plan(kvp.data(), last.data(), 1, pool.page, kHq, kHk, kD, ws,
                                         ws_bytes, stream, 0, 256, {}, g_tuning.decode);
  const double ms = time_ms([&] { kernels::cuda::decode_run(p, plan, stream); }, stream, 50);
  for (void* x : {(void*)p.kv_indptr, (void*)p.kv_indices, (void*)p.kv_last_page_len, ws})
    cudaFree(x);
  return ms;
}

// Page-by-page H2D copy of tokens' K and V (shuffled host pages -> contiguous device); ms.
double time_page_stream(int page, int tokens, const char* host_k, const char* host_v, char* dev_k,
                        char* dev_v, cudaStream_t stream) {
  const int64_t page_bytes = int64_t(page) * kHk * kD * 2;
  const int pages = tokens / page;
  std::vector<int32_t> order(pages);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937(uint32_t(page) + 1));
  return time_ms(
      [&] {
        for (int i = 0; i < pages; ++i) {
          const int64_t src = int64_t(order[i]) * page_bytes, dst = int64_t(i) * page_bytes;
          LONGCTX_CUDA_CHECK(cudaMemcpyAsync(dev_k + dst, host_k + src, page_bytes,
                                             cudaMemcpyHostToDevice, stream));
          LONGCTX_CUDA_CHECK(cudaMemcpyAsync(dev_v + dst, host_v + src, page_bytes,
                                             cudaMemcpyHostToDevice, stream));
        }
      },
      stream, 5);
}

}  // namespace

void page_size_sweep(const std::vector<int>& page_sizes, cudaStream_t stream) {
  constexpr int kPrompt = 32768, kChunk = 8192, kLongDecode = 131072;
  const double causal_pairs = double(kPrompt) * (kPrompt + 1) / 2;
  const double prefill_flops = 4.0 * kD * kHq * causal_pairs;
  void* q = random_bf16(int64_t(kPrompt) * kHq * kD, 21);
  void* o = nullptr;
  float* lse = nullptr;
  LONGCTX_CUDA_CHECK(cudaMalloc(&o, int64_t(kPrompt) * kHq * kD * 2));
  LONGCTX_CUDA_CHECK(cudaMalloc(&lse, int64_t(kHq) * 4));
  const int64_t stream_bytes = int64_t(kPrompt) * kHk * kD * 2;  // one layer's K (or V)
  char *host_k = nullptr, *host_v = nullptr, *dev_k = nullptr, *dev_v = nullptr;
  LONGCTX_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&host_k), stream_bytes, 0));
  LONGCTX_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&host_v), stream_bytes, 0));
  std::memset(host_k, 0x3c, stream_bytes);
  std::memset(host_v, 0x3c, stream_bytes);
  LONGCTX_CUDA_CHECK(cudaMalloc(&dev_k, stream_bytes));
  LONGCTX_CUDA_CHECK(cudaMalloc(&dev_v, stream_bytes));
  std::printf(
      "# page-size sweep: pages shuffled in a pool 1.25x the request; prefill kernel %s\n",
      g_tuning.prefill.kernel == kernels::PrefillKernel::kFa2 ? "fa2" : "default (sm90 on sm_90)");
  std::printf(
      "| page | prefill 32K, 1 chunk | prefill 32K, 4 x 8K chunks | decode B=1, 32K | "
      "decode B=1, 128K | H2D page stream, 32K tokens K+V |\n");
  std::printf("| ---: | ---: | ---: | ---: | ---: | ---: |\n");
  for (int page : page_sizes) {
    SweepPool pool = make_pool(page, kLongDecode);
    const double one = time_pool_prefill(pool, q, o, kPrompt, kPrompt, stream);
    double chunks = 0;
    for (int c = 0; c < kPrompt / kChunk; ++c) {
      // Chunk c's queries are prompt tokens [c * 8K, (c + 1) * 8K): their rows of q.
      const void* qc = static_cast<const char*>(q) + int64_t(c) * kChunk * kHq * kD * 2;
      chunks += time_pool_prefill(pool, qc, o, kChunk, kChunk * (c + 1), stream);
    }
    const double d32 = time_pool_decode(pool, q, o, lse, kPrompt, stream);
    const double d128 = time_pool_decode(pool, q, o, lse, kLongDecode, stream);
    const double h2d = time_page_stream(page, kPrompt, host_k, host_v, dev_k, dev_v, stream);
    auto kv_gbs = [](double keys, double ms) { return keys * kHk * kD * 2 * 2 / (ms * 1e6); };
    std::printf(
        "| %d | %.3f ms, %.1f TF | %.3f ms, %.1f TF | %.4f ms, %.0f GB/s | %.4f ms, %.0f GB/s | "
        "%.3f ms, %.1f GB/s |\n",
        page, one, prefill_flops / (one * 1e9), chunks, prefill_flops / (chunks * 1e9), d32,
        kv_gbs(kPrompt, d32), d128, kv_gbs(kLongDecode, d128), h2d,
        2.0 * stream_bytes / (h2d * 1e6));
    std::fflush(stdout);
    cudaFree(pool.k);
    cudaFree(pool.v);
  }
  cudaFree(q);
  cudaFree(o);
  cudaFree(lse);
  cudaFree(dev_k);
  cudaFree(dev_v);
  cudaFreeHost(host_k);
  cudaFreeHost(host_v);
}

}  // namespace longctx::bench
