// XAttention's prefill path on the GPU (docs/sparse.md), for the resident paged backend. Per
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
#include "kernels/attention_params.h"
#include "kernels/cuda/xattention.h"
#include "longctx/core/stream.h"
#include "longctx/core/tensor.h"
#include "longctx/attention/sparse_options.h"
#include "longctx/models/forward_batch.h"

namespace longctx {

struct XAttnCudaConfig {
  SparseOptions options;  // policy "xattention"
  int64_t num_qo_heads = 0, num_kv_heads = 0;
  float sm_scale = 0.f;
  Device device = Device::cuda();
  int64_t max_tokens = 0, max_seqs = 0, max_seq_len = 0;  // per step
};

class XAttnCuda {
 public:
  // Throws Error(kUnsupported) for a stride the kernels do not take, Error(kOutOfMemory) when
  // the buffers cannot be had.
  explicit XAttnCuda(const XAttnCudaConfig& c);

  // Before the step's attention. Returns whether the step selects (some sequence prefills).
  bool plan(const ForwardBatch& batch, cudaStream_t stream);
  // After the layer's keys are stored: p (the dense prefill params, with q, k_cache and the page
  // table set) gets the step's block mask.
  void select(kernels::PagedPrefillParams& p, cudaStream_t stream);

  // Key blocks the masks kept and that causal attention would have read, so far; synchronizes.
  struct Counters {
    int64_t kept = 0, causal = 0;
  };
  Counters counters() const;

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
