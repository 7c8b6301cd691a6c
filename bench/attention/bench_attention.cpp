// Timing of the attention kernels at the points on one GPU (CUDA events, median of
// timed launches after warm-up). One line per case:
//   name  ms  TFLOP/s (useful work)  [GB/s of KV read for decode]
// Useful work = 4 * head_dim FLOPs per (q head, query, visible key): causal counts the visible
// half, block-causal the attended blocks only.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/attention_params.h"
#include "kernels/cuda/decode.h"
#include "kernels/cuda/prefill.h"
#include "kernels/decode_params.h"
#include "longctx/attention/block_causal.h"
#include "longctx/core/cuda_check.h"
#include "longctx/core/tensor.h"

namespace {

using namespace longctx;

constexpr int kHq = 32, kHk = 8, kD = 128;

double time_ms(const std::function<void()>& fn, cudaStream_t stream, int iters = 20) {
  for (int i = 0; i < 3; ++i) fn();
  std::vector<float> t;
  cudaEvent_t a, b;
  LONGCTX_CUDA_CHECK(cudaEventCreate(&a));
  LONGCTX_CUDA_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < iters; ++i) {
    LONGCTX_CUDA_CHECK(cudaEventRecord(a, stream));
    fn();
    LONGCTX_CUDA_CHECK(cudaEventRecord(b, stream));
    LONGCTX_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    LONGCTX_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Device buffer of n bf16 values, uniform in [-1, 1]: 16M values generated on the host, then
// repeated on the device (host generation of the 4 GB decode caches would dominate the run).
void* random_bf16(int64_t n, uint32_t seed) {
  const int64_t chunk = std::min<int64_t>(n, int64_t(1) << 24);
  std::vector<uint16_t> h(chunk);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (auto& x : h) x = f32_to_bf16(u(rng));
  char* d = nullptr;
  LONGCTX_CUDA_CHECK(cudaMalloc(&d, std::max<int64_t>(n, 1) * 2));
  LONGCTX_CUDA_CHECK(cudaMemcpy(d, h.data(), chunk * 2, cudaMemcpyHostToDevice));
  for (int64_t done = chunk; done < n;) {
    const int64_t c = std::min(done, n - done);
    LONGCTX_CUDA_CHECK(cudaMemcpy(d + done * 2, d, c * 2, cudaMemcpyDeviceToDevice));
    done += c;
  }
  return d;
}

int32_t* upload(const std::vector<int32_t>& v) {
  int32_t* d = nullptr;
  LONGCTX_CUDA_CHECK(cudaMalloc(&d, std::max<size_t>(v.size(), 1) * 4));
  if (!v.empty()) LONGCTX_CUDA_CHECK(cudaMemcpy(d, v.data(), v.size() * 4, cudaMemcpyHostToDevice));
  return d;
}

void print(const std::string& name, double ms, double flops, double bytes = 0) {
  std::printf("%-58s %9.3f ms %8.1f TFLOP/s", name.c_str(), ms, flops / (ms * 1e9));
  if (bytes > 0) std::printf(" %8.1f GB/s", bytes / (ms * 1e6));
  std::printf("\n");
  std::fflush(stdout);
}

// Paged prefill of one request, q_len queries over kv_len keys (pages in order).
void bench_prefill(const char* name, int q_len, int kv_len, kernels::MaskMode mode, bool lse,
                   int page, cudaStream_t stream) {
  const int pages = (kv_len + page - 1) / page;
  void* q = random_bf16(int64_t(q_len) * kHq * kD, 1);
  void* k = random_bf16(int64_t(pages) * page * kHk * kD, 2);
  void* v = random_bf16(int64_t(pages) * page * kHk * kD, 3);
  void* o = nullptr;
  float* l = nullptr;
  LONGCTX_CUDA_CHECK(cudaMalloc(&o, int64_t(q_len) * kHq * kD * 2));
  LONGCTX_CUDA_CHECK(cudaMalloc(&l, int64_t(q_len) * kHq * 4));
  std::vector<int32_t> qo = {0, q_len}, kvp = {0, pages}, idx(pages),
                       last = {kv_len - (pages - 1) * page}, kvl = {kv_len};
  std::iota(idx.begin(), idx.end(), 0);
  kernels::PagedPrefillParams p;
  p.q = q;
  p.k_cache = k;
  p.v_cache = v;
  p.o = o;
  p.lse = lse ? l : nullptr;
  p.qo_indptr = upload(qo);
  p.kv_indptr = upload(kvp);
  p.kv_indices = upload(idx);
  p.kv_last_page_len = upload(last);
  p.batch_size = 1;
  p.num_qo_heads = kHq;
  p.num_kv_heads = kHk;
  p.head_dim = kD;
  p.page_size = page;
  p.dtype = DType::kBF16;
  p.mask_mode = mode;
  p.sm_scale = 1.f / std::sqrt(float(kD));
  size_t ws_bytes = kernels::cuda::paged_prefill_workspace_bytes(1, q_len, kHq / kHk);
  void* ws = nullptr;
  LONGCTX_CUDA_CHECK(cudaMalloc(&ws, ws_bytes));
  auto plan = kernels::cuda::paged_prefill_plan(qo.data(), kvl.data(), 1, kHq, kHk, kD, mode, ws,
                                                ws_bytes, stream);
  const double ms = time_ms([&] { kernels::cuda::paged_prefill_run(p, plan, stream); }, stream);
  double pairs = 0;
  if (mode == kernels::MaskMode::kNone)
    pairs = double(q_len) * kv_len;
  else
    for (int i = 0; i < q_len; ++i) pairs += std::clamp(kv_len - q_len + i + 1, 0, kv_len);
  print(name, ms, 4.0 * kD * kHq * pairs);
  for (void* x : {q, k, v, o, static_cast<void*>(l), ws, (void*)p.qo_indptr, (void*)p.kv_indptr,
                  (void*)p.kv_indices, (void*)p.kv_last_page_len})
    cudaFree(x);
}

void bench_decode(int batch, int kv_len, int page, cudaStream_t stream) {
  const int pages_per = (kv_len + page - 1) / page;
  const int64_t pages = int64_t(batch) * pages_per;
  void* q = random_bf16(int64_t(batch) * kHq * kD, 4);
  void* k = random_bf16(pages * page * kHk * kD, 5);
  void* v = random_bf16(pages * page * kHk * kD, 6);
  void* o = nullptr;
  float* l = nullptr;
  LONGCTX_CUDA_CHECK(cudaMalloc(&o, int64_t(batch) * kHq * kD * 2));
  LONGCTX_CUDA_CHECK(cudaMalloc(&l, int64_t(batch) * kHq * 4));
  std::vector<int32_t> kvp(batch + 1), idx(pages), last(batch, kv_len - (pages_per - 1) * page);
  for (int b = 0; b <= batch; ++b) kvp[b] = b * pages_per;
  std::iota(idx.begin(), idx.end(), 0);
  std::shuffle(idx.begin(), idx.end(), std::mt19937(7));  // a fragmented cache
  kernels::DecodeParams p;
  p.q = q;
  p.k_cache = k;
  p.v_cache = v;
  p.o = o;
  p.lse = l;
  p.kv_indptr = upload(kvp);
  p.kv_indices = upload(idx);
  p.kv_last_page_len = upload(last);
  p.batch_size = batch;
  p.num_qo_heads = kHq;
  p.num_kv_heads = kHk;
  p.head_dim = kD;
  p.page_size = page;
  p.dtype = DType::kBF16;
  p.sm_scale = 1.f / std::sqrt(float(kD));
  size_t ws_bytes = kernels::cuda::decode_workspace_bytes(batch, kHq, kHk, kD);
  void* ws = nullptr;
  LONGCTX_CUDA_CHECK(cudaMalloc(&ws, ws_bytes));
  auto plan = kernels::cuda::decode_plan(kvp.data(), last.data(), batch, page, kHq, kHk, kD, ws,
                                         ws_bytes, stream);
  const double ms = time_ms([&] { kernels::cuda::decode_run(p, plan, stream); }, stream, 50);
  const double keys = double(batch) * kv_len;
  char name[128];
  std::snprintf(name, sizeof name, "decode B=%d kv=%d page=%d (chunk %d, %d CTAs x %d)", batch,
                kv_len, page, plan.chunk_tokens, plan.num_work_items, kHk);
  print(name, ms, 4.0 * kD * kHq * keys, keys * kHk * kD * 2 * 2);
  for (void* x : {q, k, v, o, static_cast<void*>(l), ws, (void*)p.kv_indptr, (void*)p.kv_indices,
                  (void*)p.kv_last_page_len})
    cudaFree(x);
}

void bench_block_causal(int64_t total, int64_t span, int64_t block, cudaStream_t stream) {
  std::vector<int64_t> seg(total / span, span);
  if (total % span) seg.push_back(total % span);
  Tensor q = Tensor::empty({total, kHq, kD}, DType::kBF16, Device::cuda());
  Tensor k = Tensor::empty({total, kHk, kD}, DType::kBF16, Device::cuda());
  Tensor v = Tensor::empty({total, kHk, kD}, DType::kBF16, Device::cuda());
  for (Tensor* t : {&q, &k, &v}) {
    void* src = random_bf16(t->numel(), 9);
    LONGCTX_CUDA_CHECK(cudaMemcpy(t->data_ptr(), src, t->nbytes(), cudaMemcpyDeviceToDevice));
    cudaFree(src);
  }
  Tensor out = Tensor::empty({total, kHq, kD}, DType::kBF16, Device::cuda());
  const int64_t nb = max_blocks(int64_t(seg.size()), total, block);
  Tensor ws = Tensor::empty(
      {int64_t(RaggedBlockCausalAttention::workspace_bytes(kHq, kHk, total, block, nb))},
      DType::kU8, Device::cuda());
  BlockCausalOptions opt;
  opt.num_qo_heads = kHq;
  opt.num_kv_heads = kHk;
  opt.head_dim = kD;
  opt.block_size = block;
  opt.device = Device::cuda();
  RaggedBlockCausalAttention attn(ws, opt);
  attn.plan(seg, stream);
  const double ms = time_ms([&] { attn.run(q, k, v, out, stream); }, stream);
  const BlockCausalLayout& l = attn.layout();
  double pairs = 0;
  for (size_t b = 0; b + 1 < l.qo_indptr.size(); ++b)
    pairs += double(l.qo_indptr[b + 1] - l.qo_indptr[b]) * (l.kv_indptr[b + 1] - l.kv_indptr[b]);
  char name[128];
  std::snprintf(name, sizeof name, "block-causal total=%ld spans=%zu x %ld block=%ld", long(total),
                seg.size(), long(span), long(block));
  print(name, ms, 4.0 * kD * kHq * pairs);
}

}  // namespace

int main() {
  cudaStream_t stream;
  LONGCTX_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaDeviceProp prop;
  LONGCTX_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("# bench_attention on %s (%d SMs); 32 q / 8 kv heads, head_dim 128, bf16\n",
              prop.name, prop.multiProcessorCount);
  using kernels::MaskMode;
  bench_prefill("prefill causal S=8192 (page 16)", 8192, 8192, MaskMode::kCausal, false, 16,
                stream);
  bench_prefill("prefill causal S=32768 (page 16)", 32768, 32768, MaskMode::kCausal, false, 16,
                stream);
  bench_prefill("prefill causal S=32768 (page 128)", 32768, 32768, MaskMode::kCausal, false, 128,
                stream);
  bench_prefill("chunk q=2048 kv=30720 non-causal +lse (page 16)", 2048, 30720, MaskMode::kNone,
                true, 16, stream);
  for (int b : {1, 16, 64}) bench_decode(b, 32768, 16, stream);
  bench_decode(1, 32768, 128, stream);
  for (int64_t block : {64, 128}) bench_block_causal(32768, 1500, block, stream);
  cudaStreamDestroy(stream);
  return 0;
}
