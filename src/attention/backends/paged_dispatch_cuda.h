// Planning and launching the paged kernels for the resident paged backend and the CUDA offload
// device: one place that turns a call (its host index arrays) into the chosen kernel's plan
// (paged_dispatch.h chooses) under the backend's KernelTuning, and launches it.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "attention/backends/paged_dispatch.h"
#include "kernels/attention_params.h"
#include "kernels/cuda/decode.h"
#include "kernels/cuda/prefill.h"
#include "kernels/fp8_stage_params.h"
#include "longctx/kernels/kernel_tuning.h"

namespace longctx {

// One attention call's kernel and plan (plans point into the caller's workspace).
struct PagedCallPlan {
  PagedKernel kernel = PagedKernel::kGeneric;
  int total_q = 0;  // qo_indptr[batch]: the generic kernel's rows
  kernels::cuda::PrefillPlan prefill;
  kernels::cuda::DecodePlan decode;
  // A staged FP8 prefill (kernels/fp8_stage_params.h): run() converts the call's pages into the
  // staging pool (stage_pages > 0), then runs the 16-bit kernel over it.
  int64_t stage_pages = 0;
  void* stage = nullptr;  // the pool (PagedCallInput::fp8_stage)
};

// A call's host index arrays.
struct PagedCallInput {
  const int32_t* qo_indptr = nullptr;      // [batch + 1]
  const int32_t* kv_indptr = nullptr;      // [batch + 1] into the call's pages
  const int32_t* last_page_len = nullptr;  // [batch]
  const int32_t* kv_lens = nullptr;        // [batch]
  int batch = 0;
  bool block_sparse = false;  // PagedCallQueries::block_sparse
  kernels::MaskMode mask = kernels::MaskMode::kCausal;
  int num_padding = 0;  // CUDA-graph padding sequences at the end (kernels::cuda::DecodeGraphMode)
  int window = 0;       // sliding window (PagedPrefillParams::window); run() gets the same
  // FP8 caches: the staging pool (device, fp8_stage_bytes of the dispatcher) a prefill call is
  // staged in when its pages fit; null: the in-kernel conversion. Calls run in stream order may
  // share one pool (each run() converts before its kernel reads).
  void* fp8_stage = nullptr;
  size_t fp8_stage_bytes = 0;
};

class PagedDispatcher {
 public:
  // On CUDA device `device`; applies tuning.pdl there (kernels/cuda/pdl.h). Throws
  // Error(kUnsupported) when no kernel takes the shape.
  PagedDispatcher(const PagedShape& shape, const kernels::KernelTuning& tuning, int device);

  const PagedShape& shape() const { return shape_; }
  const kernels::KernelTuning& tuning() const { return tuning_; }
  // Which planned kernels serve the shape (paged_planned_kernels); the constructor checked that
  // the generic kernel takes the shape where they do not.
  const PlannedKernels& planned_kernels() const { return planned_; }
  PagedKernel kernel_for(const PagedCallQueries& queries) const {
    return choose_paged_kernel(planned_, queries, tuning_.decode.max_q_len);
  }
  // The kernel of a call with these host query rows (qo_indptr [batch + 1]).
  PagedKernel kernel_for(const int32_t* qo_indptr, int batch, kernels::MaskMode mask,
                         int window) const {
    return kernel_for(paged_call_queries(qo_indptr, batch, mask, window));
  }

  // Workspace of a decode call of up to max_batch sequences of up to max_q_len queries (0
  // without the planned kernels); 0 = the most the tuning sends to the decode.
  size_t decode_workspace_bytes(int max_batch, int max_q_len = 0) const;
  // Workspace of a prefill call with these totals: its work list, and with `split` the room for
  // the Hopper kernel's stream-K split (0 without the planned kernels).
  size_t prefill_workspace_bytes(int max_batch, int64_t max_q, bool split) const;
  // Workspace of a call of `kernel` (the prefill's without the split).
  size_t workspace_bytes(PagedKernel kernel, int batch, int64_t total_q) const;
  // The FP8 staging pool for prefill calls of up to max_call_pages pages under the tuning's cap
  // (PrefillTuning::fp8_stage_mib); 0 for a 16-bit cache, without the planned prefill, or cap 0.
  size_t fp8_stage_bytes(int64_t max_call_pages) const;

  // The call's kernel and plan; the plans' copies are enqueued on `stream` into `workspace`
  // (the prefill takes the split where the bytes give it room).
  PagedCallPlan plan(const PagedCallInput& in, void* workspace, size_t workspace_bytes,
                     cudaStream_t stream) const;

  // Launches the call (a staged FP8 prefill: the conversion, then the 16-bit kernel over the
  // pool with kv_indices 0..n-1 and kv_contiguous). params: the shape fields, device index arrays
  // (batch_size, qo_indptr, kv_indptr, kv_indices, kv_last_page_len), the plan's window, q, the
  // caches and o (or o_f32), lse optional. q_token_stride: the decode kernel's q rows apart (0:
  // contiguous); the others read a contiguous q.
  void run(const PagedCallPlan& call, const kernels::PagedPrefillParams& params,
           int64_t q_token_stride, cudaStream_t stream) const;

  // CTAs of a decode call's grid (what a CUDA graph's decode node is set to); 0 for others.
  static int64_t decode_grid(const PagedCallPlan& call);
  // True when `func` (a graph kernel node's function) is one of the split-KV decode's kernels.
  static bool is_decode_kernel(const void* func);

 private:
  PagedShape shape_;
  kernels::KernelTuning tuning_;
  PlannedKernels planned_;
};

}  // namespace longctx
