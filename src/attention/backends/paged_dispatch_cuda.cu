#include <algorithm>

#include "attention/backends/paged_dispatch_cuda.h"
#include "kernels/cuda/fp8_stage.h"
#include "kernels/cuda/paged_generic.h"
#include "kernels/cuda/pdl.h"
#include "longctx/core/cuda_check.h"
#include "longctx/core/error.h"

namespace longctx {

namespace {

kernels::PagedPrefillParams shape_params(const PagedShape& s) {
  kernels::PagedPrefillParams p;
  p.num_qo_heads = s.num_qo_heads;
  p.num_kv_heads = s.num_kv_heads;
  p.head_dim = s.head_dim;
  p.page_size = s.page_size;
  p.dtype = s.dtype;
  p.kv_format = s.kv_format;
  p.mask_mode = kernels::MaskMode::kCausal;
  p.sm_scale = s.sm_scale;
  return p;
}

}  // namespace

PagedDispatcher::PagedDispatcher(const PagedShape& shape, const kernels::KernelTuning& tuning,
                                 int device)
    : shape_(shape), tuning_(tuning), planned_(paged_planned_kernels(shape, tuning)) {
  LONGCTX_CHECK((planned_.decode && planned_.prefill) ||
                    kernels::cuda::paged_generic_supported(shape_params(shape)),
                ErrorCode::kUnsupported,
                "paged attention: no kernel for head_dim {} with {} q / {} kv heads, page size {}",
                shape.head_dim, shape.num_qo_heads, shape.num_kv_heads, shape.page_size);
  kernels::cuda::set_pdl_allowed(device, tuning.pdl);
}

size_t PagedDispatcher::decode_workspace_bytes(int max_batch, int max_q_len) const {
  if (!planned_.decode) return 0;
  const int most = std::clamp(tuning_.decode.max_q_len, 1, kernels::kDecodeMaxQLen);
  return kernels::cuda::decode_workspace_bytes(max_batch, shape_.num_qo_heads, shape_.num_kv_heads,
                                               shape_.head_dim, /*num_sms=*/0,
                                               max_q_len > 0 ? std::min(max_q_len, most) : most);
}

size_t PagedDispatcher::prefill_workspace_bytes(int max_batch, int64_t max_q, bool split) const {
  if (!planned_.prefill) return 0;
  size_t bytes = kernels::cuda::paged_prefill_workspace_bytes(
      max_batch, max_q, shape_.num_qo_heads / shape_.num_kv_heads);
  if (split) bytes += kernels::cuda::paged_prefill_split_workspace_bytes(shape_.head_dim);
  return bytes;
}

size_t PagedDispatcher::workspace_bytes(PagedKernel kernel, int batch, int64_t total_q) const {
  switch (kernel) {
    case PagedKernel::kDecode:  // the call's most queries are at most total_q
      return decode_workspace_bytes(batch, int(std::clamp<int64_t>(total_q, 1, 1 << 20)));
    case PagedKernel::kPrefill:
      return prefill_workspace_bytes(batch, total_q, /*split=*/false);
    case PagedKernel::kGeneric:
      break;
  }
  return 0;
}

size_t PagedDispatcher::fp8_stage_bytes(int64_t max_call_pages) const {
  return paged_fp8_stage_bytes(shape_, planned_, tuning_, max_call_pages);
}

PagedCallPlan PagedDispatcher::plan(const PagedCallInput& in, void* workspace,
                                    size_t workspace_bytes, cudaStream_t stream) const {
  PagedCallPlan call;
  PagedCallQueries queries = paged_call_queries(in.qo_indptr, in.batch, in.mask, in.window);
  queries.block_sparse = in.block_sparse;
  call.kernel = kernel_for(queries);
  call.total_q = in.batch > 0 ? in.qo_indptr[in.batch] : 0;
  if (call.kernel == PagedKernel::kDecode) {
    kernels::cuda::DecodeGraphMode graph;
    graph.num_padding = in.num_padding;
    // A verify step's rows, or a step where some sequence has none (one query each otherwise:
    // the plan of today's decode steps).
    kernels::DecodeQueries rows;
    if (queries.max_q_len > 1 || call.total_q != in.batch) rows.qo_indptr = in.qo_indptr;
    rows.causal = in.mask == kernels::MaskMode::kCausal;
    call.decode = kernels::cuda::decode_plan(
        in.kv_indptr, in.last_page_len, in.batch, shape_.page_size, shape_.num_qo_heads,
        shape_.num_kv_heads, shape_.head_dim, workspace, workspace_bytes, stream, /*num_sms=*/0,
        /*min_chunk_tokens=*/256, graph, tuning_.decode, in.window, shape_.kv_format, rows);
  } else if (call.kernel == PagedKernel::kPrefill) {
    // The stream-K split's cost model knows no window (its pieces are cut from key 0). FP8 and
    // 16-bit caches take the same kernel (paged_prefill_run: the Hopper kernel on sm_90).
    kernels::PrefillTuning prefill = tuning_.prefill;
    if (in.window > 0) prefill.split = kernels::PrefillSplitMode::kNever;
    call.prefill = kernels::cuda::paged_prefill_plan(
        in.qo_indptr, in.kv_lens, in.batch, shape_.num_qo_heads, shape_.num_kv_heads,
        shape_.head_dim, in.mask, workspace, workspace_bytes, stream, prefill);
    const int64_t pages = in.batch > 0 ? in.kv_indptr[in.batch] : 0;
    if (in.fp8_stage != nullptr &&
        paged_fp8_staged(shape_, call.kernel, pages, in.fp8_stage_bytes)) {
      call.stage_pages = pages;
      call.stage = in.fp8_stage;
    }
  }
  return call;
}

void PagedDispatcher::run(const PagedCallPlan& call, const kernels::PagedPrefillParams& p,
                          int64_t q_token_stride, cudaStream_t stream) const {
  switch (call.kernel) {
    case PagedKernel::kDecode: {
      kernels::DecodeParams d;
      d.q = p.q;
      d.q_token_stride = q_token_stride;
      d.k_cache = p.k_cache;
      d.v_cache = p.v_cache;
      d.o = p.o;
      d.o_f32 = p.o_f32;
      d.lse = p.lse;
      d.kv_indptr = p.kv_indptr;
      d.kv_indices = p.kv_indices;
      d.kv_last_page_len = p.kv_last_page_len;
      d.batch_size = p.batch_size;
      d.num_qo_heads = p.num_qo_heads;
      d.num_kv_heads = p.num_kv_heads;
      d.head_dim = p.head_dim;
      d.page_size = p.page_size;
      d.dtype = p.dtype;
      d.kv_format = p.kv_format;
      d.k_scale = p.k_scale;
      d.v_scale = p.v_scale;
      d.sm_scale = p.sm_scale;
      d.window = p.window;
      // Not read on the device (the plan's work list holds the rows); names a verify step.
      d.qo_indptr = p.qo_indptr;
      d.causal = call.decode.causal;
      kernels::cuda::decode_run(d, call.decode, stream);
      return;
    }
    case PagedKernel::kPrefill:
      if (call.stage_pages > 0) {
        kernels::cuda::paged_prefill_run(
            kernels::cuda::fp8_stage_prefill(p, call.stage_pages, call.stage, stream), call.prefill,
            stream);
        return;
      }
      kernels::cuda::paged_prefill_run(p, call.prefill, stream);
      return;
    case PagedKernel::kGeneric:
      kernels::cuda::paged_generic_run(p, call.total_q, stream);
      return;
  }
}

int64_t PagedDispatcher::decode_grid(const PagedCallPlan& call) {
  return call.kernel == PagedKernel::kDecode ? kernels::cuda::decode_grid_ctas(call.decode) : 0;
}

bool PagedDispatcher::is_decode_kernel(const void* func) {
  return kernels::cuda::is_decode_kernel(func);
}

}  // namespace longctx
