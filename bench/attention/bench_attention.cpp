// Timing of the attention kernels at the points on one GPU (CUDA events, median of
// timed launches after warm-up). One line per case:
//   name  ms  TFLOP/s (useful work)  [GB/s of KV read for decode]
// Useful work = 4 * head_dim FLOPs per (q head, query, visible key): causal counts the visible
// half, block-causal the attended blocks only.
//
// bench_attention --prefill HEAD_DIM:S[:PAGE[:HQ:HK]],... times causal prefills (a profiler's
// target); --prefill-kernels with the same specs times each on the Hopper (sm90) kernel and then on
// the mma.sync one, side by side.
// bench_attention --block-causal times the two block-causal rows alone.
// bench_attention --prefill-fp8 S,S,... times causal prefills with bf16 and FP8 K/V side by side
// (Llama-3.1-8B's and the needle model's heads, pages of 16 and 128; prefill_fp8_table): FP8
// staged (the conversion launch timed with the kernel), the conversion alone (GB/s of codes read
// and 16-bit pages written) and FP8 converted in the kernel.
//
// bench_attention --page-sizes 16,32,64,128,256 runs the page-size sweep instead (see
// page_size_sweep.h) and prints a markdown table.
//
// bench_attention --decode [VARIANTS [PAGES [SHAPES]]] runs the decode table instead (see
// decode_table): batch 1 at 1K/4K/32K/128K/1M keys and batches 8-64 at 4K and 32K, GB/s of K+V
// read, for each plan variant (a comma-separated list, default "default": the plan as the flags
// below tune it; "s=N", "o=M" or "s=N/o=M" set DecodeTuning's slots / overhead, "l=0" / "l=1" its
// loader and "c=0" / "c=1" its stage copy (as --decode-slots / -overhead / -loader / -copy),
// "g=N" the fused merge's group size (DecodePlan::merge_group; g=1000: one level), "pf=N" the
// keys each CTA prefetches into L2 before it waits for the launch before it (pf=0: none), "kv=fp8"
// an FP8 cache ("kv=fp8/fk=0" on the converting-tile kernel, "fk=1" the registers one, "fk=2"
// its deeper ring), so
// wave-model settings, loaders and merges compare in the same process on the same data; the "merge"
// column shows the first request's splits and groups), page size (default 128) and, optionally,
// only the shapes "B:KV:HQ[:HK],..." (e.g. 1:32768:32, 64:32768:4:1).
//
// Kernel tuning flags, before any of the above (longctx/kernels/kernel_tuning.h; e.g.
// --prefill-kernel fa2, --prefill-split 0, --decode-loader 0, --pdl 0) pin the plans' choices
// for every row; --help lists them.
//
// bench_attention --loaders KIND:TILE:STAGES:CTAS[:THREADS],... streams a K/V cache through each
// way of filling shared memory, without compute (loader_ceiling.h).
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bench_common.h"
#include "kernels/attention_params.h"
#include "kernels/cuda/decode.h"
#include "kernels/cuda/fp8_stage.h"
#include "kernels/cuda/pdl.h"
#include "kernels/cuda/prefill.h"
#include "kernels/decode_params.h"
#include "loader_ceiling.h"
#include "longctx/attention/block_causal.h"
#include "longctx/core/cuda_check.h"
#include "longctx/core/tensor.h"
#include "longctx/kernels/kernel_tuning.h"
#include "page_size_sweep.h"
#include "read_ceiling.h"

namespace {

using namespace longctx;

using namespace longctx::bench;

// The K/V cache of a prefill bench: 16-bit (bf16) or FP8 E4M3 with page scales.
struct BenchKv {
  bool fp8 = false;
  int hq = kHq, hk = kHk;  // q / kv heads
  // FP8: staged (kernels/cuda/fp8_stage.h) where the pages fit --prefill-fp8-stage's cap, else
  // converted in the kernel.
  bool staged = false;
};

// Paged prefill of one request, q_len queries over kv_len keys (pages in order), kv.hq q /
// kv.hk kv heads of head_dim (32 / 8 by default), a bf16 or FP8 cache.
void bench_prefill(const char* name, int q_len, int kv_len, kernels::MaskMode mode, bool lse,
                   int page, cudaStream_t stream, int head_dim = kD, const BenchKv& kv = {}) {
  const int kHq = kv.hq, kHk = kv.hk;  // this bench's heads (shadowing the file's)
  const int pages = (kv_len + page - 1) / page;
  const int64_t kv_elems = int64_t(pages) * page * kHk * head_dim;
  void* q = random_bf16(int64_t(q_len) * kHq * head_dim, 1);
  void* k = kv.fp8 ? random_fp8(kv_elems, 2) : random_bf16(kv_elems, 2);
  void* v = kv.fp8 ? random_fp8(kv_elems, 3) : random_bf16(kv_elems, 3);
  float* scales = nullptr;  // FP8: K and V page scales, [2][pages][kHk], all 2^-8
  if (kv.fp8) {
    const std::vector<float> h(size_t(2) * pages * kHk, 0x1p-8f);
    LONGCTX_CUDA_CHECK(cudaMalloc(&scales, h.size() * 4));
    LONGCTX_CUDA_CHECK(cudaMemcpy(scales, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
  }
  void* o = nullptr;
  float* l = nullptr;
  LONGCTX_CUDA_CHECK(cudaMalloc(&o, int64_t(q_len) * kHq * head_dim * 2));
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
  p.head_dim = head_dim;
  p.page_size = page;
  p.dtype = DType::kBF16;
  p.mask_mode = mode;
  p.sm_scale = 1.f / std::sqrt(float(head_dim));
  if (kv.fp8) {
    p.kv_format = kernels::KvCacheFormat::kFp8E4M3;
    p.k_scale = scales;
    p.v_scale = scales + int64_t(pages) * kHk;
  }
  // With the split's workspace, as the engine's backend has it (--prefill-split 0: none).
  size_t ws_bytes = kernels::cuda::paged_prefill_workspace_bytes(1, q_len, kHq / kHk) +
                    kernels::cuda::paged_prefill_split_workspace_bytes(head_dim);
  void* ws = nullptr;
  LONGCTX_CUDA_CHECK(cudaMalloc(&ws, ws_bytes));
  auto plan = kernels::cuda::paged_prefill_plan(qo.data(), kvl.data(), 1, kHq, kHk, head_dim, mode,
                                                ws, ws_bytes, stream, g_tuning.prefill);
  void* pool = nullptr;  // the staged FP8 path's pool
  if (kv.fp8 && kv.staged) {
    const size_t bytes = kernels::fp8_stage_pool_bytes(pages, g_tuning.prefill.fp8_stage_mib, page,
                                                       kHk, head_dim, DType::kBF16);
    if (kernels::fp8_stage_fits(pages, bytes, page, kHk, head_dim, DType::kBF16))
      LONGCTX_CUDA_CHECK(cudaMalloc(&pool, bytes));
  }
  const double ms = time_ms(
      [&] {
        kernels::cuda::paged_prefill_run(
            pool != nullptr ? kernels::cuda::fp8_stage_prefill(p, pages, pool, stream) : p, plan,
            stream);
      },
      stream);
  const std::string label = std::string(name) + (plan.split_ctas > 0 ? " [split]" : "") +
                            (kv.fp8 && kv.staged && pool == nullptr ? " [over the cap]" : "");
  name = label.c_str();
  double pairs = 0;
  if (mode == kernels::MaskMode::kNone)
    pairs = double(q_len) * kv_len;
  else
    for (int i = 0; i < q_len; ++i) pairs += std::clamp(kv_len - q_len + i + 1, 0, kv_len);
  print(name, ms, 4.0 * head_dim * kHq * pairs);
  if (pool != nullptr) {  // the conversion alone: codes and scales read, K and V pages written
    const double conv =
        time_ms([&] { kernels::cuda::fp8_stage_prefill(p, pages, pool, stream); }, stream);
    const double bytes = 2.0 * kv_elems * (1 + 2) + 2.0 * pages * kHk * 4;
    std::printf("%-58s %9.3f ms %8.1f %% of the staged row %8.1f GB/s\n",
                ("  (conversion of " + std::to_string(pages) + " pages)").c_str(), conv,
                100.0 * conv / ms, bytes / (conv * 1e6));
    std::fflush(stdout);
  }
  for (void* x : {q, k, v, o, static_cast<void*>(l), ws, (void*)p.qo_indptr, (void*)p.kv_indptr,
                  (void*)p.kv_indices, (void*)p.kv_last_page_len, static_cast<void*>(scales), pool})
    cudaFree(x);
}

// FP8 against bf16 K/V, causal prefill of one request: Llama-3.1-8B heads (32 / 8 x 128) and the
// needle model's (4 / 2 x 64), at each length of `lengths`, pages of 16 and 128; the tuning
// flags apply to both (--prefill-kernel fa2: the mma.sync kernel).
void prefill_fp8_table(const std::vector<int>& lengths, cudaStream_t stream) {
  struct Heads {
    const char* name;
    int hq, hk, d;
  };
  for (const Heads& h : {Heads{"8B 32/8x128", 32, 8, 128}, Heads{"needle 4/2x64", 4, 2, 64}})
    for (int n : lengths)
      for (int page : {16, 128})
        for (int row : {0, 1, 2}) {  // bf16, FP8 staged, FP8 in the kernel
          const std::string name = std::string("prefill causal ") + h.name +
                                   " S=" + std::to_string(n) + " page " + std::to_string(page) +
                                   (row == 0   ? " bf16"
                                    : row == 1 ? " fp8 staged"
                                               : " fp8 in-kernel");
          bench_prefill(name.c_str(), n, n, kernels::MaskMode::kCausal, false, page, stream, h.d,
                        BenchKv{row > 0, h.hq, h.hk, row == 1});
        }
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
                                         ws_bytes, stream, 0, 256, {}, g_tuning.decode);
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

// The decode table. Per (batch, kv_len, page): one pool of shuffled pages holding `reps`
// disjoint copies of the batch's KV (at least ~512 MB together, 10x the 50 MB L2), and each timed
// launch reads the next copy (same plan, another kv_indices array), so small shapes are not
// served from L2. Two times per plan variant: "isolated" = median of single launches between events
// (includes the launch gap, as the other rows of this bench), "stream" = 20 back-to-back launches
// / 20 (what consecutive layers under a CUDA graph see). GB/s = K+V bytes / time.
struct DecodeVariant {
  std::string name;
  int slots = 0, overhead = 0;  // 0: the flags' (DecodeTuning::slots / overhead)
  int loader = -1;              // -1: the flags'; 0 the cp.async ring / 1 TMA tiles of one tile
  int copy = -1;                // -1: the flags'; 0 TMA boxes / 1 cp.async
  bool fp8 = false;             // "kv=fp8": an FP8 E4M3 cache (its kernel; GB/s of its bytes)
  int fp8_kernel = -1;  // "fk=0" / "fk=1" / "fk=2": DecodeFp8Kernel kConvertTile / kRegisters /
                        // kRegistersDeep
  int merge_group = 0;  // "g=N": DecodePlan::merge_group (N >= the splits: one level)
  int prefetch = -1;    // "pf=N": DecodePlan::prefetch_tokens (-1: the plan's)
};

// "default", "s=N", "o=M", "l=0", "l=1", "kv=fp8", "fk=0", "g=N", "s=N/o=M/l=1", ... ; false on any
// other field (a typo would otherwise time the default plan under another name).
bool parse_variants(const std::string& list, std::vector<DecodeVariant>* out) {
  size_t at = 0;
  while (at <= list.size()) {
    const size_t comma = std::min(list.find(',', at), list.size());
    const std::string v = list.substr(at, comma - at);
    at = comma + 1;
    if (v.empty()) continue;
    DecodeVariant d;
    d.name = v;
    size_t f = 0;
    while (f <= v.size()) {
      const size_t slash = std::min(v.find('/', f), v.size());
      const std::string field = v.substr(f, slash - f);
      f = slash + 1;
      if (field.rfind("s=", 0) == 0) {
        d.slots = std::atoi(field.c_str() + 2);
      } else if (field.rfind("o=", 0) == 0) {
        d.overhead = std::atoi(field.c_str() + 2);
      } else if (field == "l=0" || field == "l=1") {
        d.loader = field[2] - '0';
      } else if (field == "c=0" || field == "c=1") {
        d.copy = field[2] - '0';
      } else if (field == "kv=fp8") {
        d.fp8 = true;
      } else if (field == "fk=0" || field == "fk=1" || field == "fk=2") {
        d.fp8_kernel = field[3] - '0';
      } else if (field.rfind("pf=", 0) == 0) {
        d.prefetch = std::atoi(field.c_str() + 3);
        if (d.prefetch < 0) return false;
      } else if (field.rfind("g=", 0) == 0) {
        d.merge_group = std::atoi(field.c_str() + 2);
        if (d.merge_group < 1) return false;
      } else if (field != "default") {
        return false;
      }
    }
    out->push_back(d);
  }
  return !out->empty();
}

// How the plan's split requests merge (the first request's splits): "-" for none, "n: one"
// for one level, "n: g x k" for k groups of g (kernels/decode_schedule.h's decode_merge_group).
std::string merge_shape(const kernels::cuda::DecodePlan& plan) {
  const int n = plan.batch_size > 0 ? plan.num_partials / plan.batch_size : 0;
  if (n < 2) return "-";
  const int g = kernels::decode_merge_group(n, plan.merge_group);
  return std::to_string(n) +
         (g >= n ? ": one" : ": " + std::to_string(g) + " x " + std::to_string((n + g - 1) / g));
}

// The decode tuning of a variant: the flags' with its fields pinned.
kernels::DecodeTuning variant_tuning(const DecodeVariant& v) {
  kernels::DecodeTuning t = g_tuning.decode;
  if (v.slots > 0) t.slots = v.slots;
  if (v.overhead > 0) t.overhead = v.overhead;
  if (v.loader >= 0)
    t.loader = v.loader == 0 ? kernels::DecodeLoader::kCpAsync : kernels::DecodeLoader::kTmaTile;
  if (v.copy >= 0)
    t.copy = v.copy == 0 ? kernels::DecodeStageCopy::kTmaBoxes : kernels::DecodeStageCopy::kCpAsync;
  if (v.fp8_kernel >= 0)
    t.fp8_kernel = v.fp8_kernel == 0   ? kernels::DecodeFp8Kernel::kConvertTile
                   : v.fp8_kernel == 1 ? kernels::DecodeFp8Kernel::kRegisters
                                       : kernels::DecodeFp8Kernel::kRegistersDeep;
  return t;
}

// "16,128,..." page sizes in 1..256 (--page-sizes, --decode); false on a malformed list.
bool parse_page_sizes(const char* list, std::vector<int>* out) {
  for (const char* s = list; *s;) {
    char* end = nullptr;
    const long v = std::strtol(s, &end, 10);
    if (end == s || v < 1 || v > 256) return false;
    out->push_back(int(v));
    s = *end == ',' ? end + 1 : end;
  }
  return true;
}

// "B:KV:HQ[:HK],..." (e.g. 1:32768:32, 64:32768:4:1) selects shapes of the decode table (HK
// default 8); false on a malformed list.
// BATCH:KV_LEN:HQ[:HK[:HEAD_DIM]] items (kv heads kHk, head_dim kD by default).
bool parse_decode_shapes(const char* list, std::vector<std::array<int, 5>>* out) {
  for (const char* s = list; *s;) {
    std::array<int, 5> v{0, 0, 0, kHk, kD};
    for (int i = 0; i < 5; ++i) {
      char* end = nullptr;
      const long x = std::strtol(s, &end, 10);
      if (end == s || x < 1 || x > (1 << 24)) return false;
      v[i] = int(x);
      s = end;
      if (i == 4 || *s != ':') break;
      ++s;
    }
    if (v[4] != 64 && v[4] != 128 && v[4] != 256) return false;
    out->push_back(v);
    if (*s == ',')
      ++s;
    else if (*s)
      return false;
  }
  return !out->empty();
}

void decode_table(const std::vector<DecodeVariant>& variants, const std::vector<int>& page_sizes,
                  const std::vector<std::array<int, 5>>& only, cudaStream_t stream) {
  // (batch, kv_len, q heads): Llama-3.1-8B's 32 q heads, plus batch 1 at 32K with 8 and 64 q
  // heads (GQA 1 and 8: the same KV bytes with 1/4 and 2x the arithmetic, which shows whether
  // the kernel is bound by its compute).
  struct Shape {
    int batch, kv_len, hq, hk = kHk, d = kD;
  };
  std::vector<Shape> shapes = {
      {1, 1024, kHq},   {1, 4096, kHq},   {1, 32768, kHq}, {1, 131072, kHq}, {1, 1048576, kHq},
      {8, 4096, kHq},   {32, 4096, kHq},  {64, 4096, kHq}, {8, 32768, kHq},  {16, 32768, kHq},
      {32, 32768, kHq}, {64, 32768, kHq}, {1, 32768, 8},   {1, 32768, 64}};
  if (!only.empty()) {
    shapes.clear();
    for (const auto& v : only) shapes.push_back({v[0], v[1], v[2], v[3], v[4]});
  }
  std::printf(
      "# decode table: pages shuffled; isolated = median single launch, stream = 20 "
      "back-to-back / 20, host = CPU time per decode_run call\n");
  std::printf(
      "| batch | kv_len | q heads | kv heads x head_dim | page | variant | chunk | CTAs | merge | "
      "isolated ms "
      "| GB/s | stream ms | GB/s | host us |\n");
  std::printf(
      "| ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | --- | ---: | ---: | ---: | ---: "
      "| ---: |\n");
  for (int page : page_sizes)
    for (auto [batch, kv_len, hq, hk, head_dim] : shapes) {
      const int pages_per = (kv_len + page - 1) / page;
      const double kv_bytes = double(batch) * kv_len * hk * head_dim * 2 * 2;
      const int reps = int(std::clamp(std::ceil(512e6 / kv_bytes), 1.0, 32.0));
      const int64_t pool = int64_t(reps) * batch * pages_per;
      void* q = random_bf16(int64_t(batch) * hq * head_dim, 4);
      void* k = random_bf16(pool * page * hk * head_dim, 5);
      void* v = random_bf16(pool * page * hk * head_dim, 6);
      void* o = nullptr;
      float* l = nullptr;
      LONGCTX_CUDA_CHECK(cudaMalloc(&o, int64_t(batch) * hq * head_dim * 2));
      LONGCTX_CUDA_CHECK(cudaMalloc(&l, int64_t(batch) * hq * 4));
      std::vector<int32_t> kvp(batch + 1), ids(pool), last(batch, kv_len - (pages_per - 1) * page);
      for (int b = 0; b <= batch; ++b) kvp[b] = b * pages_per;
      std::iota(ids.begin(), ids.end(), 0);
      std::shuffle(ids.begin(), ids.end(), std::mt19937(7));  // a fragmented cache
      int32_t* d_ids = upload(ids);  // copy r = ids[r * batch * pages_per, ...)
      kernels::DecodeParams p;
      p.q = q;
      p.k_cache = k;
      p.v_cache = v;
      p.o = o;
      p.lse = l;
      p.kv_indptr = upload(kvp);
      p.kv_last_page_len = upload(last);
      p.batch_size = batch;
      p.num_qo_heads = hq;
      p.num_kv_heads = hk;
      p.head_dim = head_dim;
      p.page_size = page;
      p.dtype = DType::kBF16;
      p.sm_scale = 1.f / std::sqrt(float(head_dim));
      const size_t ws_bytes = kernels::cuda::decode_workspace_bytes(batch, hq, hk, head_dim);
      void* ws = nullptr;
      LONGCTX_CUDA_CHECK(cudaMalloc(&ws, ws_bytes));
      // FP8 variants: codes of one value (the kernel's time does not depend on them) and
      // per-(page, kv head) scales, in buffers of their own.
      void *k8 = nullptr, *v8 = nullptr;
      float* scales = nullptr;
      const kernels::DecodeParams p16 = p;
      for (const DecodeVariant& var : variants) {
        const kernels::KvCacheFormat format =
            var.fp8 ? kernels::KvCacheFormat::kFp8E4M3 : kernels::KvCacheFormat::kDtype;
        p = p16;
        double bytes = kv_bytes;
        if (var.fp8) {
          const int64_t codes = pool * page * hk * head_dim;
          if (k8 == nullptr) {
            LONGCTX_CUDA_CHECK(cudaMalloc(&k8, codes));
            LONGCTX_CUDA_CHECK(cudaMalloc(&v8, codes));
            LONGCTX_CUDA_CHECK(cudaMemset(k8, 0x30, codes));  // 0.5 in E4M3
            LONGCTX_CUDA_CHECK(cudaMemset(v8, 0x38, codes));  // 1.0
            scales = upload(std::vector<float>(pool * hk, 0.0625f));
          }
          p.k_cache = k8;
          p.v_cache = v8;
          p.kv_format = format;
          p.k_scale = scales;
          p.v_scale = scales;
          bytes = kv_bytes / 2 + double(batch) * pages_per * hk * 8;
        }
        auto plan = kernels::cuda::decode_plan(kvp.data(), last.data(), batch, page, hq, hk,
                                               head_dim, ws, ws_bytes, stream, 0, 256, {},
                                               variant_tuning(var), 0, format);
        if (var.merge_group > 0) plan.merge_group = var.merge_group;
        if (var.prefetch >= 0) plan.prefetch_tokens = var.prefetch;
        if (var.loader >= 0 && plan.loader != var.loader)
          std::fprintf(stderr, "variant %s: the plan took loader %d instead\n", var.name.c_str(),
                       plan.loader);
        int rep = 0;
        auto launch = [&] {
          p.kv_indices = d_ids + int64_t(rep) * batch * pages_per;
          rep = (rep + 1) % reps;
          kernels::cuda::decode_run(p, plan, stream);
        };
        const auto [iso, burst] =
            bench::time_isolated_and_stream(launch, stream_timer(stream), 50, 9);
        // The host's share of an isolated launch: CPU time per decode_run call, 100 queued.
        LONGCTX_CUDA_CHECK(cudaStreamSynchronize(stream));
        const auto h0 = std::chrono::steady_clock::now();
        for (int i = 0; i < 100; ++i) launch();
        const double host_us =
            std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - h0)
                .count() /
            100;
        LONGCTX_CUDA_CHECK(cudaStreamSynchronize(stream));
        std::printf(
            "| %d | %d | %d | %d x %d | %d | %s | %d | %d | %s | %.4f | %.0f | %.4f | %.0f | %.1f "
            "|\n",
            batch, kv_len, hq, hk, head_dim, page, var.name.c_str(), plan.chunk_tokens,
            plan.num_work_items * hk, merge_shape(plan).c_str(), iso, bytes / (iso * 1e6), burst,
            bytes / (burst * 1e6), host_us);
        std::fflush(stdout);
#ifdef LONGCTX_TIMELINE_PROBE
        // One launch alone, then the last of 20 back to back (its CTAs start while the previous
        // launch drains: programmatic dependent launch).
        for (int launches : {1, 20}) {
          LONGCTX_CUDA_CHECK(cudaStreamSynchronize(stream));
          kernels::cuda::decode_timeline_reset();
          for (int i = 0; i < launches; ++i) launch();
          std::printf("#   %s, the last of %d launch(es):\n", var.name.c_str(), launches);
          kernels::cuda::decode_timeline_print(kernels::cuda::decode_grid_ctas(plan));
        }
#endif
      }
      for (void* x : {q, k, v, o, static_cast<void*>(l), ws, (void*)p.kv_indptr, (void*)d_ids,
                      (void*)p.kv_last_page_len, k8, v8, static_cast<void*>(scales)})
        cudaFree(x);
    }
}

// One --prefill spec: HEAD_DIM:S[:PAGE[:HQ:HK]] (causal, S queries over S keys).
struct PrefillSpec {
  int d = 0, n = 0, page = 16, hq = kHq, hk = kHk;
};
bool parse_prefill_spec(const std::string& text, PrefillSpec* sp) {
  PrefillSpec s;
  if (std::sscanf(text.c_str(), "%d:%d:%d:%d:%d", &s.d, &s.n, &s.page, &s.hq, &s.hk) < 2 ||
      (s.d != 64 && s.d != 128 && s.d != 256) || s.n < 1 || s.page < 1 || s.page > 256 ||
      s.hq < 1 || s.hk < 1 || s.hq % s.hk != 0)
    return false;
  *sp = s;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  // The kernel tuning flags first (--NAME VALUE), then the mode.
  while (argc >= 2 && std::strncmp(argv[1], "--", 2) == 0) {
    const std::string name = argv[1] + 2;
    if (name == "help") {
      std::printf("kernel tuning flags (before the mode):\n%s",
                  kernels::kernel_tuning_flags_help().c_str());
      return 0;
    }
    if (!kernels::is_kernel_tuning_flag(name)) break;
    std::string error;
    if (argc < 3 || !kernels::parse_kernel_tuning_flag(name, argv[2], &g_tuning, &error)) {
      std::fprintf(stderr, "%s\n",
                   argc < 3 ? ("--" + name + ": a value is missing").c_str() : error.c_str());
      return 2;
    }
    argv[2] = argv[0];
    argv += 2;
    argc -= 2;
  }
  kernels::cuda::set_pdl_allowed(0, g_tuning.pdl);
  cudaStream_t stream;
  LONGCTX_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaDeviceProp prop;
  LONGCTX_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("# bench_attention on %s (%d SMs); 32 q / 8 kv heads, head_dim 128, bf16\n",
              prop.name, prop.multiProcessorCount);
  if (argc == 3 && std::strcmp(argv[1], "--page-sizes") == 0) {
    std::vector<int> pages;
    if (!parse_page_sizes(argv[2], &pages)) {
      std::fprintf(stderr, "--page-sizes: want a comma-separated list of 1..256, got %s\n",
                   argv[2]);
      return 2;
    }
    page_size_sweep(pages, stream);
    cudaStreamDestroy(stream);
    return 0;
  }
  if (argc >= 2 && std::strcmp(argv[1], "--decode") == 0) {
    std::vector<DecodeVariant> variants;
    if (!parse_variants(argc >= 3 ? argv[2] : "default", &variants)) {
      std::fprintf(stderr, "--decode: want variants like default,s=2,s=3/o=64,l=1,l=0, got %s\n",
                   argv[2]);
      return 2;
    }
    std::vector<int> pages;
    if (!parse_page_sizes(argc >= 4 ? argv[3] : "128", &pages)) {
      std::fprintf(stderr, "--decode: want page sizes 1..256, got %s\n", argv[3]);
      return 2;
    }
    std::vector<std::array<int, 5>> only;
    if (argc >= 5 && !parse_decode_shapes(argv[4], &only)) {
      std::fprintf(
          stderr, "--decode: want shapes like 1:32768:32,64:32768:4:1,32:131072:16:2:256, got %s\n",
          argv[4]);
      return 2;
    }
    decode_table(variants, pages, only, stream);
    cudaStreamDestroy(stream);
    return 0;
  }
  if (argc == 3 &&
      (std::strcmp(argv[1], "--prefill") == 0 || std::strcmp(argv[1], "--prefill-kernels") == 0)) {
    const bool both = std::strcmp(argv[1], "--prefill-kernels") == 0;
    std::vector<PrefillSpec> specs;
    std::stringstream ss(argv[2]);
    for (std::string item; std::getline(ss, item, ',');) {
      specs.emplace_back();
      if (!parse_prefill_spec(item, &specs.back())) {
        std::fprintf(stderr,
                     "%s: want HEAD_DIM:S[:PAGE[:HQ:HK]],... (64, 128 or 256, S >= 1, page "
                     "1..256, HK divides HQ), got %s\n",
                     argv[1], item.c_str());
        return 2;
      }
    }
    // --prefill-kernels: each spec on the Hopper kernel, then on the mma.sync one (the other
    // tuning flags apply to both).
    const kernels::PrefillTuning tuning = g_tuning.prefill;
    for (const PrefillSpec& sp : specs) {
      for (kernels::PrefillKernel kernel :
           {kernels::PrefillKernel::kSm90, kernels::PrefillKernel::kFa2}) {
        if (!both && kernel != tuning.kernel) continue;
        g_tuning.prefill.kernel = kernel;
        const bool sm90 = kernels::cuda::paged_prefill_sm90_path(sp.d, g_tuning.prefill);
        const std::string name = "prefill causal S=" + std::to_string(sp.n) + " " +
                                 std::to_string(sp.hq) + "/" + std::to_string(sp.hk) + "x" +
                                 std::to_string(sp.d) + " (page " + std::to_string(sp.page) + ")" +
                                 (both ? (sm90 ? " [sm90]" : " [mma.sync]") : "");
        BenchKv kv;
        kv.hq = sp.hq;
        kv.hk = sp.hk;
        bench_prefill(name.c_str(), sp.n, sp.n, kernels::MaskMode::kCausal, false, sp.page, stream,
                      sp.d, kv);
      }
      g_tuning.prefill = tuning;
    }
    cudaStreamDestroy(stream);
    return 0;
  }
  if (argc == 3 && std::strcmp(argv[1], "--prefill-fp8") == 0) {
    std::vector<int> lengths;
    std::stringstream ss(argv[2]);
    for (std::string item; std::getline(ss, item, ',');) {
      const int n = std::atoi(item.c_str());
      if (n < 1) {
        std::fprintf(stderr, "--prefill-fp8: want lengths like 32768,131072, got %s\n", argv[2]);
        return 2;
      }
      lengths.push_back(n);
    }
    prefill_fp8_table(lengths, stream);
    cudaStreamDestroy(stream);
    return 0;
  }
  if (argc == 3 && std::strcmp(argv[1], "--chunk") == 0) {
    int d = 0, q = 0, kv = 0, page = 128;
    if (std::sscanf(argv[2], "%d:%d:%d:%d", &d, &q, &kv, &page) < 3 ||
        (d != 64 && d != 128 && d != 256) || q < 1 || kv < q || page < 1 || page > 256) {
      std::fprintf(
          stderr,
          "--chunk: want HEAD_DIM:Q:KV[:PAGE] (64, 128 or 256, 1 <= Q <= KV, page 1..256), "
          "got %s\n",
          argv[2]);
      return 2;
    }
    const std::string name = "chunk q=" + std::to_string(q) + " kv=" + std::to_string(kv) +
                             " head_dim " + std::to_string(d) + " non-causal +lse (page " +
                             std::to_string(page) + ")";
    bench_prefill(name.c_str(), q, kv, kernels::MaskMode::kNone, true, page, stream, d);
    cudaStreamDestroy(stream);
    return 0;
  }
  if (argc == 2 && std::strcmp(argv[1], "--read") == 0) {
    bench::read_table(stream, stream_timer(stream));
    cudaStreamDestroy(stream);
    return 0;
  }
  if (argc == 3 && std::strcmp(argv[1], "--loaders") == 0) {
    std::vector<bench::LoaderSpec> specs;
    std::stringstream ss(argv[2]);
    for (std::string item; std::getline(ss, item, ',');) {
      specs.emplace_back();
      if (!bench::parse_loader_spec(item, &specs.back())) {
        std::fprintf(stderr, "--loaders: bad spec %s (see loader_ceiling.h)\n", item.c_str());
        return 2;
      }
    }
    bench::loader_table(specs, stream, stream_timer(stream));
    cudaStreamDestroy(stream);
    return 0;
  }
  if (argc == 2 && std::strcmp(argv[1], "--block-causal") == 0) {  // a profiler's target
    for (int64_t block : {64, 128}) bench_block_causal(32768, 1500, block, stream);
    cudaStreamDestroy(stream);
    return 0;
  }
  if (argc != 1) {
    std::fprintf(
        stderr,
        "usage: bench_attention [TUNING FLAGS (--help)] [--page-sizes 16,32,64,128,256 | --decode "
        "[default,s=N/o=M,..."
        " [PAGES [B:KV:HQ[:HK],...]]] | --prefill[-kernels] HEAD_DIM:S[:PAGE[:HQ:HK]],... |"
        " --chunk HEAD_DIM:Q:KV[:PAGE] | --prefill-fp8 S,S,... | --block-causal | --read | "
        "--loaders "
        "KIND:TILE:STAGES:CTAS,...]\n");
    return 2;
  }
  using kernels::MaskMode;
  bench_prefill("prefill causal S=8192 (page 16)", 8192, 8192, MaskMode::kCausal, false, 16,
                stream);
  bench_prefill("prefill causal S=32768 (page 16)", 32768, 32768, MaskMode::kCausal, false, 16,
                stream);
  bench_prefill("prefill causal S=8192 (page 128)", 8192, 8192, MaskMode::kCausal, false, 128,
                stream);
  bench_prefill("prefill causal S=32768 (page 128)", 32768, 32768, MaskMode::kCausal, false, 128,
                stream);
  bench_prefill("chunk q=2048 kv=30720 non-causal +lse (page 16)", 2048, 30720, MaskMode::kNone,
                true, 16, stream);
  bench_prefill("chunk q=2048 kv=30720 non-causal +lse (page 128)", 2048, 30720, MaskMode::kNone,
                true, 128, stream);
  // A short chunk over a long history: 8 row tiles x 8 kv heads, 64 long units.
  bench_prefill("chunk q=256 kv=262144 non-causal +lse (page 128)", 256, 262144, MaskMode::kNone,
                true, 128, stream);
  // 20 row tiles x 8 kv heads = 160 units: 1.2 rounds on 132 SMs.
  bench_prefill("chunk q=640 kv=30720 non-causal +lse (page 128)", 640, 30720, MaskMode::kNone,
                true, 128, stream);
  for (int page : {16, 128})  // Llama-3.2-1B class heads: 32 q / 8 kv of head_dim 64
    for (int n : {8192, 32768}) {
      const std::string name = "prefill causal S=" + std::to_string(n) + " head_dim 64 (page " +
                               std::to_string(page) + ")";
      bench_prefill(name.c_str(), n, n, MaskMode::kCausal, false, page, stream, 64);
    }
  bench_prefill("chunk q=2048 kv=30720 head_dim 64 non-causal +lse (page 128)", 2048, 30720,
                MaskMode::kNone, true, 128, stream, 64);
  for (int b : {1, 16, 64}) bench_decode(b, 32768, 16, stream);
  bench_decode(1, 32768, 128, stream);
  for (int64_t block : {64, 128}) bench_block_causal(32768, 1500, block, stream);
  cudaStreamDestroy(stream);
  return 0;
}
