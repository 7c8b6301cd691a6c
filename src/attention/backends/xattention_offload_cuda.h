// A prefill policy over an offloaded KV cache on the GPU (docs/sparse.md), for the CUDA offload
// device's sparse reader (offload_sparse_cuda.cu): XAttention's (whose estimate reads every key),
// and streaming's (the same plan, its mask from the lengths alone): the policy's CUDA twin
// (sparse_policy_cuda.h) selects. A step with a prefill is attended here instead of through the
// ring; per layer:
//   keys    K of every host block of the step's sequences, copied (one strided copy per run of
//           consecutive host blocks, on the copy stream) into a staging buffer on the GPU: the
//           next layers' keys load while this layer computes (two buffers);
//   select  the policy's twin (XAttnCuda: the estimate and the selection) over one page table that
//   names GPU cache
//           blocks and staged blocks alike (the staging follows the cache's last layer in one
//           allocation, so a staged block is a page index past the layer's cache);
//   values  V of the staged blocks that some q head of a KV head keeps for some query block,
//           that head's rows only, read from the pinned host pool in place by a gather kernel
//           (kernels/cuda/xattention.h) that reads the mask on the device: no host round trip;
//   attend  the block-sparse causal prefill over the page table and the mask.
// So the link carries K of every host block and V of the kept ones, where the dense ring carries
// K and V of all. The output equals the resident XAttention's (same kernels, same page contents).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "attention/backends/xattention_cuda.h"
#include "kernels/cuda/prefill.h"
#include "longctx/attention/forward_batch.h"
#include "longctx/core/stream.h"
#include "longctx/core/tensor.h"

namespace longctx {

struct XAttnOffloadConfig {
  XAttnCudaConfig xattn;  // the policy's config: heads, scale, device and step limits
  int64_t num_layers = 0, num_gpu_blocks = 0, num_host_blocks = 0, block_size = 0;
  int64_t num_kv_heads = 0, head_dim = 0;
  DType dtype = DType::kBF16;
  kernels::PrefillTuning prefill_tuning;  // the block-sparse prefill's plan
  int64_t staging_blocks = 0;             // per buffer
  int num_buffers = 2;
};

// The offload device's memory, in its layout (offload_device_cuda.cu): K and V of a block of a
// layer adjacent (block_bytes), layer-major; the staging buffers follow the GPU cache's last
// layer in the same allocation.
struct XAttnOffloadMemory {
  char* gpu = nullptr;             // [layers * gpu blocks + buffers * staging blocks] blocks
  const char* host = nullptr;      // [layers * host blocks] blocks, pinned
  const char* host_dev = nullptr;  // host's device address
};

class XAttnOffloadCuda {
 public:
  // Throws Error(kUnsupported) for a head_dim or page size the kernels do not take. `policy` (a
  // prefill policy's twin, owned by the sparse reader) outlives this.
  XAttnOffloadCuda(const XAttnOffloadConfig& c, const XAttnOffloadMemory& memory,
                   sparse::SparsePolicyCuda& policy);

  // Whether the step's host blocks (block_loc entries < 0) fit one staging buffer.
  bool fits(const ForwardBatch& batch, std::span<const int32_t> block_loc) const;
  // Before the layers (after the caller made `compute` and `h2d` wait for write-backs of the
  // host blocks): page tables, gather list, plans; the first layers' keys start loading on h2d.
  void plan(const ForwardBatch& batch, std::span<const int32_t> block_loc, cudaStream_t compute,
            const Stream& h2d);
  // The layer's output [T, Hq * head_dim] in q's dtype.
  Tensor attend(int64_t layer, const Tensor& q, cudaStream_t compute, const Stream& h2d);

  // Host bytes read so far: K copied and V gathered (synchronizes).
  int64_t host_bytes_read() const;
  SparsePrefillCounters counters() const { return policy_.prefill_counters(); }

 private:
  struct KeyRun {
    int32_t host = 0, slot = 0, count = 0;
  };
  void load_keys(int64_t layer, const Stream& h2d);
  int64_t staged_block(int64_t layer, int64_t slot) const;  // block index from the layer's base
  const int32_t* dev(int64_t word) const { return words_.device_at(word); }

  XAttnOffloadConfig c_;
  XAttnOffloadMemory mem_;
  sparse::SparsePolicyCuda& policy_;
  int64_t block_bytes_ = 0, page_bytes_ = 0;  // K and V of a block of a layer; K alone
  std::vector<Event> ready_, free_;           // [buffers] keys loaded / last reader done
  StagedWords words_;                         // the step's page tables and work lists
  Tensor workspace_;                          // [bytes] u8: the prefill plan
  Tensor v_bytes_;                            // [1] u64: V bytes gathered
  kernels::cuda::PrefillPlan prefill_;
  std::vector<KeyRun> runs_;
  int64_t entries_ = 0;  // page-table entries per layer
  int64_t tables_at_ = 0, qo_at_ = 0, kv_indptr_at_ = 0, last_at_ = 0, q_lens_at_ = 0,
          kv_lens_at_ = 0, items_at_ = 0;
  int num_items_ = 0, batch_ = 0, total_q_ = 0;
  int64_t k_bytes_ = 0;  // K bytes copied so far
};

}  // namespace longctx
