#include <algorithm>
#include <limits>

#include "attention/backends/xattention_cuda.h"
#include "kernels/cpu/xattention_cpu.h"
#include "longctx/core/cuda_check.h"
#include "longctx/core/device_memory.h"
#include "longctx/core/error.h"

namespace longctx {

XAttnCuda::XAttnCuda(const XAttnCudaConfig& c) : c_(c), words_(c.device) {
  LONGCTX_CHECK(c.num_qo_heads > 0 && c.num_kv_heads > 0 && c.num_qo_heads % c.num_kv_heads == 0 &&
                    c.max_tokens > 0 && c.max_seqs > 0 && c.max_seq_len > 0,
                ErrorCode::kInvalidArgument, "xattention: bad step limits");
  kernels::cpu::check_xattn_options(static_cast<int>(c.options.stride), c.options.threshold);
  LONGCTX_CHECK(kernels::cuda::xattn_stride_supported(static_cast<int>(c.options.stride)),
                ErrorCode::kUnsupported,
                "--xattn-stride {} on the GPU: the estimate kernel takes 2, 4, 8 or 16",
                c.options.stride);
  LONGCTX_CHECK(c.max_seq_len <= kernels::cuda::kXAttnMaxKvLen, ErrorCode::kUnsupported,
                "xattention on the GPU: sequences of {} keys; the selection takes up to {}",
                c.max_seq_len, kernels::cuda::kXAttnMaxKvLen);
  const kernels::XAttnBuffers sizes = kernels::xattn_buffers(
      c.num_qo_heads, c.options.stride, c.max_tokens, c.max_seqs, c.max_seq_len);
  try {
    lse_ = Tensor::empty({sizes.lse_elems}, DType::kF32, c.device);
    mask_ = Tensor::empty({sizes.mask_elems}, DType::kU8, c.device);
    counters_ = Tensor::zeros({2}, DType::kI64, c.device);
  } catch (const Error& e) {
    LONGCTX_THROW(ErrorCode::kOutOfMemory,
                  "xattention: cannot allocate {} of GPU memory for the estimate and the masks "
                  "(lower --max-num-batched-tokens, --max-num-seqs or --max-model-len): {}",
                  format_bytes(sizes.bytes()), e.what());
  }
}

bool XAttnCuda::plan(const ForwardBatch& batch, std::span<const int64_t>, std::span<const int32_t>,
                     cudaStream_t stream) {
  batch_ = static_cast<int>(batch.num_seqs());
  bool prefill = false;
  for (int b = 0; b < batch_; ++b) prefill = prefill || batch.q_len(b) > 1;
  if (!prefill) return false;
  words_.begin();
  plan_ = kernels::cuda::xattn_plan(batch.qo_indptr.data(), batch.kv_lens.data(), batch_,
                                    static_cast<int>(c_.num_qo_heads),
                                    static_cast<int>(c_.num_kv_heads),
                                    static_cast<int>(c_.options.stride), c_.options.xattn_min_len);
  LONGCTX_CHECK(
      plan_.lse_indptr.back() <= lse_.numel() && plan_.mask_indptr.back() <= mask_.numel(),
      ErrorCode::kInternal, "xattention: a step past the planned limits");
  std::vector<int32_t> q_lens(batch_);
  for (int b = 0; b < batch_; ++b) q_lens[b] = static_cast<int32_t>(batch.q_len(b));
  est_at_ = words_.put(plan_.estimate_items);
  sel_at_ = words_.put(plan_.select_items);
  lse_indptr_at_ = words_.put_bytes(plan_.lse_indptr.data(), plan_.lse_indptr.size() * 8);
  mask_indptr_at_ = words_.put_bytes(plan_.mask_indptr.data(), plan_.mask_indptr.size() * 8);
  q_lens_at_ = words_.put(q_lens);
  kv_lens_at_ = words_.put(batch.kv_lens);
  words_.upload(stream);
  return true;
}

void XAttnCuda::select_prefill(kernels::PagedPrefillParams& p, cudaStream_t stream) {
  const int32_t* w = words_.device_at(0);
  const auto* lse_indptr = reinterpret_cast<const int64_t*>(w + lse_indptr_at_);
  const auto* mask_indptr = reinterpret_cast<const int64_t*>(w + mask_indptr_at_);
  kernels::XAttnEstimateParams e =
      kernels::xattn_estimate_params(p, static_cast<int>(c_.options.stride));
  e.block_lse = lse_.data<float>();
  e.lse_indptr = lse_indptr;
  e.work_items = w + est_at_;
  e.num_work_items = static_cast<int>(plan_.estimate_items.size() / 2);
  kernels::cuda::xattn_estimate_run(e, stream);

  kernels::XAttnSelectParams s;
  s.block_lse = e.block_lse;
  s.lse_indptr = lse_indptr;
  s.block_mask = mask_.data<uint8_t>();
  s.mask_indptr = mask_indptr;
  s.q_lens = w + q_lens_at_;
  s.kv_lens = w + kv_lens_at_;
  s.work_items = w + sel_at_;
  s.num_work_items = static_cast<int>(plan_.select_items.size() / 2);
  s.counters = reinterpret_cast<unsigned long long*>(counters_.data_ptr());
  s.batch_size = p.batch_size;
  s.num_qo_heads = p.num_qo_heads;
  s.heads_per_mask = c_.options.xattn_per_kv_head ? p.num_qo_heads / p.num_kv_heads : 1;
  s.dense_tail = static_cast<int>(
      std::min<int64_t>(c_.options.xattn_dense_tail, std::numeric_limits<int32_t>::max()));
  s.min_kv_len = static_cast<int>(
      std::min<int64_t>(c_.options.xattn_min_len, std::numeric_limits<int32_t>::max()));
  s.stride = e.stride;
  s.threshold = c_.options.threshold;
  kernels::cuda::xattn_select_run(s, plan_.max_k_blocks, stream);

  p.block_mask = s.block_mask;
  p.block_mask_indptr = mask_indptr;
  p.block_mask_heads = p.num_qo_heads;
}

SparsePrefillCounters XAttnCuda::prefill_counters() const {
  int64_t v[2] = {0, 0};
  LONGCTX_CUDA_CHECK(cudaMemcpy(v, counters_.data_ptr(), sizeof(v), cudaMemcpyDeviceToHost));
  return {v[0], v[1]};
}

}  // namespace longctx
