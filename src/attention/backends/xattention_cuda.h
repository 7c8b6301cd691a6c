// XAttention's prefill path on the GPU (docs/sparse.md): the CUDA twin of the xattention policy
// (attention/sparse/xattention.cpp), built by the registry for the resident paged backend and
// the CUDA offload's sparse reader (xattention_offload_cuda.h stages host keys for it). Per
// step, plan() makes the estimate's and the selection's work lists on the host (from the query
// and key lengths alone) and stages them; per layer, select() runs the estimate over the step's
// queries and the paged keys (stored already: the chunk sees itself) and the selection, and
// points the prefill params at the mask, so the block-sparse prefill kernel reads only the kept
// key blocks. Sequences with one query (decodes mixed into the step) or at most two key blocks
// get the dense causal mask, as on the CPU. Nothing after plan() reads host memory or
// synchronizes.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "attention/backends/staged_words.h"
#include "attention/sparse/sparse_policy_cuda.h"
#include "kernels/attention_params.h"
#include "kernels/cuda/xattention.h"
#include "longctx/attention/forward_batch.h"
#include "longctx/core/stream.h"
#include "longctx/core/tensor.h"

namespace longctx {

// The options, heads, scale, device and step limits (the registry's config; XAttnCuda reads no
// cache shape beyond the heads).
using XAttnCudaConfig = sparse::SparseCudaConfig;

class XAttnCuda final : public sparse::SparsePolicyCuda {
 public:
  // Throws Error(kUnsupported) for a stride the kernels do not take, Error(kOutOfMemory) when
  // the buffers cannot be had.
  explicit XAttnCuda(const XAttnCudaConfig& c);

  // Before the step's attention. Returns whether the step selects (some sequence prefills);
  // cache_slots and block_loc are not read.
  bool plan(const ForwardBatch& batch, std::span<const int64_t> cache_slots,
            std::span<const int32_t> block_loc, cudaStream_t stream) override;
  // After the layer's keys are stored: p (the dense prefill params, with q, k_cache and the page
  // table set) gets the step's block mask.
  void select_prefill(kernels::PagedPrefillParams& p, cudaStream_t stream) override;

  // Key blocks the masks kept and that causal attention would have read, so far; synchronizes.
  SparsePrefillCounters prefill_counters() const override;

 private:
  XAttnCudaConfig c_;
  Tensor lse_;         // [lse elements] f32: the estimate's block log-sum-exps
  Tensor mask_;        // [mask elements] u8
  Tensor counters_;    // [2] u64
  StagedWords words_;  // the step's plan arrays
  kernels::cuda::XAttnPlan plan_;
  int64_t est_at_ = 0, sel_at_ = 0, lse_indptr_at_ = 0, mask_indptr_at_ = 0, q_lens_at_ = 0,
          kv_lens_at_ = 0;
  int batch_ = 0;
};

}  // namespace longctx
