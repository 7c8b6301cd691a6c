// The CPU reference backend over a paged KV pool: the same block tables and slot mapping as
// the GPU's paged backend, so the engine (block manager, prefix cache, preemption) runs one way
// on both. K/V are f32 in a CPU PagedKVPool; attention gathers each sequence's keys and values
// from its blocks and runs ops::attention (fp32, causal by position). With a sparse policy
// (kv/sparse), a decode row reads only the blocks the policy selects per KV head, and a prefill
// chunk runs the block-sparse reference with the policy's mask; Full selects nothing, so the
// dense path runs unchanged.
#pragma once

#include <cstdint>

#include "kv/paged_kv_pool.h"
#include "attention/sparse/sparse_policy.h"
#include "longctx/models/forward_batch.h"

namespace longctx {

class CpuPagedBackend final : public AttentionBackend {
 public:
  // `pool` (on the CPU, f32) and `policy` (optional; its metadata follows the pool's writes) must
  // outlive the backend.
  CpuPagedBackend(PagedKVPool& pool, float sm_scale, sparse::SparsePolicy* policy = nullptr);

  // Checks the block tables and slots against the pool (check_paged_batch).
  void plan(const ForwardBatch& batch) override;
  void store_kv(int64_t layer, const Tensor& k, const Tensor& v) override;
  Tensor attend(int64_t layer, const Tensor& q) override;

 private:
  // Sequence s's rows of out [T, Hq, d] from the blocks `sel` lists per KV head.
  void attend_selected(int64_t layer, const Tensor& q, int64_t s,
                       const sparse::DecodeSelection& sel, Tensor& out) const;
  // Sequence s's rows through the block-sparse reference under `mask`.
  void attend_masked(int64_t layer, const Tensor& q, int64_t s, const sparse::PrefillMask& mask,
                     Tensor& out) const;

  PagedKVPool& pool_;
  float sm_scale_ = 0.f;
  sparse::SparsePolicy* policy_ = nullptr;
  const ForwardBatch* batch_ = nullptr;  // the planned batch (outlives the forward)
};

// Copies every layer's K and V of block src into block dst of a CPU pool.
void copy_kv_block_cpu(PagedKVPool& pool, int32_t src, int32_t dst);

}  // namespace longctx
