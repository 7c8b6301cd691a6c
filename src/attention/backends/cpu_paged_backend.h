// The CPU reference backend over a paged KV pool: the same block tables and slot mapping as
// the GPU's paged backend, so the engine (block manager, prefix cache, preemption) runs one way
// on both. K/V are f32 in a CPU PagedKVPool; attention gathers each sequence's keys and values
// from its blocks and runs ops::attention (fp32, causal by position).
#pragma once

#include <cstdint>

#include "kv/paged_kv_pool.h"
#include "longctx/models/forward_batch.h"

namespace longctx {

class CpuPagedBackend final : public AttentionBackend {
 public:
  // `pool` (on the CPU, f32) must outlive the backend.
  CpuPagedBackend(PagedKVPool& pool, float sm_scale);

  // Checks the block tables and slots against the pool (check_paged_batch).
  void plan(const ForwardBatch& batch) override;
  void store_kv(int64_t layer, const Tensor& k, const Tensor& v) override;
  Tensor attend(int64_t layer, const Tensor& q) override;

 private:
  PagedKVPool& pool_;
  float sm_scale_ = 0.f;
  const ForwardBatch* batch_ = nullptr;  // the planned batch (outlives the forward)
};

// Copies every layer's K and V of block src into block dst of a CPU pool.
void copy_kv_block_cpu(PagedKVPool& pool, int32_t src, int32_t dst);

}  // namespace longctx
