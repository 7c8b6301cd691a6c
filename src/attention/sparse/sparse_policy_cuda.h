// The CUDA twin of a sparse policy (sparse_policy.h; CUDA builds only): the same selection as
// the CPU reference, on the device, with no host round trip after plan(). The registry's
// make_cuda builds it; the resident paged backend and the CUDA offload's sparse reader
// (offload_sparse_cuda.cu) drive it:
//   plan()            once per step, before the first store_kv;
//   on_keys_stored()  per layer after the store (metadata);
//   decode policies   attend_decode(): the select kernel writes per (sequence, KV head) the
//                     ascending logical pages the CPU reference lists (kernels/quest_params.h:
//                     selected[b][Hkv][max_selected]), then the gather of those pages (from the
//                     GPU cache or, with offload, the pinned host pool in place) and the split-KV
//                     decode over them;
//   prefill policies  select_prefill(): the layer's block mask (PrefillMask's layout, per q head)
//                     for the block-sparse prefill.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <span>

#include "attention/backends/paged_backend.h"
#include "attention/sparse/sparse_policy.h"
#include "kernels/attention_params.h"
#include "longctx/attention/forward_batch.h"
#include "longctx/core/device.h"
#include "longctx/core/dtype.h"
#include "longctx/kernels/kernel_tuning.h"
#include "longctx/kv/block_copy.h"

namespace longctx {
class PhaseRecorder;  // attention/backends/phase_profile.h
}  // namespace longctx

namespace longctx::sparse {

struct SparseCudaConfig {
  SparseOptions options;
  // num_blocks: the engine's block ids (the metadata's; with offload the host blocks).
  int64_t num_layers = 0, num_blocks = 0, block_size = 0;
  int64_t num_qo_heads = 0, num_kv_heads = 0, head_dim = 0;
  DType dtype = DType::kBF16;  // of q, and of K / V unless FP8
  // FP8 E4M3 K / V (codes + per-block scales): a policy whose def reads_fp8 reads them.
  kernels::KvCacheFormat kv_format = kernels::KvCacheFormat::kDtype;
  float sm_scale = 0.f;
  Device device = Device::cuda();
  int64_t max_tokens = 0, max_seqs = 0, max_seq_len = 0;  // per step; keys per sequence
  kernels::KernelTuning tuning;  // the decode's and the block-sparse prefill's kernel choices
};

// One of the two memories a decode's block_loc codes name (QuestGatherParams): K and V of block
// b at element b * block_stride; an FP8 cache's block b scales of KV head h at
// k_scale / v_scale[b * scale_block_stride + h].
struct PageMemory {
  const void* k = nullptr;
  const void* v = nullptr;
  int64_t block_stride = 0;
  const float* k_scale = nullptr;
  const float* v_scale = nullptr;
  int64_t scale_block_stride = 0;
};

class SparsePolicyCuda {
 public:
  virtual ~SparsePolicyCuda() = default;

  // Before the step's first store_kv. cache_slots [T]: where store_kv writes each new token
  // (cache block * block_size + offset); block_loc: per batch.block_tables entry its
  // QuestGatherParams::block_loc code on a decode step the backend lets the policy attend (every
  // sequence one query; a graph-shaped batch only under a policy whose PolicyDef::decode_graphs
  // is set, which then keeps every address and launch shape a function of the batch size but
  // decode_grid()), empty otherwise. Returns whether the policy selects this
  // step: a decode policy given block_loc, a prefill policy on a step with a prefill.
  virtual bool plan(const ForwardBatch& batch, std::span<const int64_t> cache_slots,
                    std::span<const int32_t> block_loc, cudaStream_t stream) = 0;
  // Copy-on-write of whole blocks: metadata follows.
  virtual void copy_blocks(std::span<const KVBlockCopy> /*copies*/, cudaStream_t /*stream*/) {}
  // After layer `layer`'s keys were stored: keys.k's block b at element b * keys.block_stride
  // (FP8: with its scales; keys.v unused).
  virtual void on_keys_stored(int64_t /*layer*/, const PageMemory& /*keys*/,
                              cudaStream_t /*stream*/) {}
  // A decode step plan() selected: q [batch, Hq, d] contiguous in the cache's dtype; writes o
  // [batch, Hq, d] or, with o_f32, fp32. mem[1] may be empty when no code names it.
  virtual void attend_decode(int64_t layer, const void* q, void* o, float* o_f32,
                             const PageMemory (&mem)[2], cudaStream_t stream);
  // A prefill step plan() selected: p (the dense prefill params, q, k_cache and the page table
  // set) gets the layer's block mask.
  virtual void select_prefill(kernels::PagedPrefillParams& p, cudaStream_t stream);

  // CTAs of the split-KV decode kernel the last decode step's attend_decode launches last in each
  // layer (0: none, or a kernel whose grid follows the batch size alone). A CUDA graph captured
  // over one decode step replays a later one of the same batch size once its decode kernel nodes
  // get this grid (the resident backend's GraphLaunches).
  virtual int64_t decode_grid() const { return 0; }
  // K and V bytes the decode gathers read from memory 1 (the host pool) so far; synchronizes.
  virtual int64_t memory1_bytes_read() const { return 0; }
  // (page, KV head) pairs the decode gathers copied from kept pages instead of reading them
  // (SparseOptions::quest_reuse) so far; synchronizes.
  virtual int64_t pages_reused() const { return 0; }
  // Key blocks the prefill masks kept and causal attention would have read; synchronizes.
  virtual SparsePrefillCounters prefill_counters() const { return {}; }
  // A measurement mode (attention/backends/phase_profile.h): attend_decode marks its select,
  // gather and decode there (null: off).
  virtual void set_phase_recorder(PhaseRecorder* /*recorder*/) {}
};

// The CUDA twin of options.policy (nullptr for full); Error(kUnsupported) when the policy has
// none.
std::unique_ptr<SparsePolicyCuda> make_sparse_policy_cuda(const SparseCudaConfig& config);

}  // namespace longctx::sparse
