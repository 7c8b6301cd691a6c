// The paged-kernel choice, one for the resident paged backend (paged_backend.cu) and the CUDA
// offload device (offload_device_cuda.cu): which kernel reads a call's K/V (the split-KV decode,
// the paged prefill or the generic kernel), and, through the KernelTuning they hold, which tiling,
// loader and split the kernels' plans take. The choice is host code (this file, tested on the
// CPU); planning and launching are paged_dispatch_cuda.h.
#pragma once

#include <cstdint>

#include "kernels/attention_params.h"
#include "kernels/kv_format.h"
#include "longctx/core/dtype.h"
#include "longctx/kernels/kernel_tuning.h"

namespace longctx {

enum class PagedKernel : uint8_t {
  kDecode,   // split-KV decode (kernels/cuda/decode.h): every sequence a few queries at most
  kPrefill,  // paged prefill (kernels/cuda/prefill.h): Hopper or mma.sync, PrefillTuning's
  kGeneric,  // the generic kernel (kernels/cuda/paged_generic.h): any head_dim 8..256, no plan
};

// What every call of one backend shares.
struct PagedShape {
  int num_qo_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int page_size = 0;           // tokens per page (the engine's block size)
  DType dtype = DType::kBF16;  // of q and o (and of a 16-bit cache)
  // kFp8E4M3: the caches hold FP8 codes with per (page, KV head) scales (kernels/kv_format.h).
  kernels::KvCacheFormat kv_format = kernels::KvCacheFormat::kDtype;
  float sm_scale = 0.f;
};

// Which planned kernels serve a shape; calls the planned kernels do not take run the generic one.
struct PlannedKernels {
  // The split-KV decode and the paged prefill (Hopper or mma.sync): both serve head_dim 64, 128
  // and 256 today (FP8 caches: 64 and 128).
  bool decode = false;
  bool prefill = false;
};

// The planned kernels for `shape`: bf16 / f16, an integral GQA ratio, pages of 1..256 tokens,
// sm_scale > 0 (the prefill's paged_prefill_supported) and the head_dims above; none when
// tuning.attention is kGeneric.
PlannedKernels paged_planned_kernels(const PagedShape& shape, const kernels::KernelTuning& tuning);

// What the kernel choice needs of one call's queries.
struct PagedCallQueries {
  int max_q_len = 1;  // the most queries of one sequence (0 or 1: a decode step)
  kernels::MaskMode mask = kernels::MaskMode::kCausal;
  int window = 0;  // sliding window (0: none)
  // A prefill policy's block mask applies (the paged prefill reads it; the decode does not).
  bool block_sparse = false;
};
// From a call's host qo_indptr [batch + 1].
PagedCallQueries paged_call_queries(const int32_t* qo_indptr, int batch, kernels::MaskMode mask,
                                    int window);

// The kernel of one call. A decode step (every sequence at most one query) takes the split-KV
// decode where it serves the shape, else the generic kernel (never the prefill: it does not split
// a sequence's keys over CTAs). A verify step (at most decode_max_q_len queries per sequence,
// the decode's causal-tail rule or no mask without a window, where the decode serves the shape)
// takes the split-KV decode too: the prefill gives each (head, query tile) one CTA over all the
// keys. Other calls take the paged prefill where it serves the shape, else the generic kernel.
// decode_max_q_len: DecodeTuning::max_q_len (1: verify steps take the prefill).
PagedKernel choose_paged_kernel(const PlannedKernels& planned, const PagedCallQueries& queries,
                                int decode_max_q_len);

// FP8 caches, the staged prefill (kernels/fp8_stage_params.h; docs/fp8_kv.md "Staged prefill"):
// the staging pool a backend allocates for prefill calls of up to max_call_pages pages, capped
// by tuning.prefill.fp8_stage_mib (0: a 16-bit cache, no planned prefill, or cap 0).
size_t paged_fp8_stage_bytes(const PagedShape& shape, const PlannedKernels& planned,
                             const kernels::KernelTuning& tuning, int64_t max_call_pages);
// Whether a call of `kernel` reading call_pages pages is staged in a pool of pool_bytes: FP8
// prefill calls whose pages fit; the others (decode steps: reading FP8 is their gain; prefill
// calls over the cap: the fallback) read the codes in the kernel.
bool paged_fp8_staged(const PagedShape& shape, PagedKernel kernel, int64_t call_pages,
                      size_t pool_bytes);

}  // namespace longctx
