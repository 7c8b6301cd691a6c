// Quest's decode path on the GPU (docs/sparse.md): the CUDA twin of the quest policy
// (attention/sparse/quest.cpp) and, without metadata or scores, the page-list decode of the
// streaming policy (its select kernel then writes the forced pages only). The registry builds it
// for the resident paged backend and the CUDA offload's sparse reader. Per step, plan() stages the
// pages the new tokens touch and, on a decode step (every sequence one new token), each sequence's
// block table twice: as metadata ids (the engine's block ids) and as where its keys are
// (QuestGatherParams::block_loc). Per layer:
//   on_keys_stored()  after the keys are stored: the touched pages' key min / max;
//   attend_decode()   select (per KV head, or head-averaged) -> gather the chosen pages' K / V
//                     into a compact buffer (host pages read in place over the link; with page
//                     reuse, pages the sequence kept last step from its kept slot, then this
//                     step's kept) -> the split-KV decode kernel (head_dim 64 / 128; the generic
//                     kernel otherwise) over it, one page per sequence.
// Nothing after plan() reads host memory or synchronizes. How many pages each sequence reads
// follows from its length alone (quest_count), so the decode plan is made on the host in plan().
// CUDA graphs (engine/cuda_graphs.h): a decode step's arrays sit at word offsets fixed for the
// object's life (quest_decode_layout, in a buffer that never moves), a graph-shaped batch
// (ForwardBatch::fixed_launch_shapes) gets a metadata launch of a fixed entry count per batch size
// (fillers of rows 0 after the touched pages) and a compact-decode plan whose padding sequences
// leave the real ones' split as it is (DecodeGraphMode), so every launch of the layers depends on
// the batch size alone but the split-KV decode's grid (decode_grid(), which the backend's
// GraphLaunches set before each replay).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "attention/backends/staged_words.h"
#include "attention/sparse/sparse_policy_cuda.h"
#include "kernels/cpu/quest_cpu.h"
#include "kernels/cuda/decode.h"
#include "kernels/quest_params.h"
#include "longctx/attention/forward_batch.h"
#include "longctx/core/stream.h"
#include "longctx/core/tensor.h"
#include "longctx/kv/block_copy.h"

namespace longctx {

struct QuestCudaConfig {
  kernels::QuestBudget budget;  // pages, budget, sink, window
  bool per_head = true;         // per KV head lists, else head-averaged
  // Quest scores pages from their key min / max; without (streaming) no metadata is kept and the
  // budget leaves no page past the forced ones (plan() checks it).
  bool scored = true;
  int64_t num_layers = 0, num_blocks = 0, block_size = 0;  // num_blocks: the engine's block ids
  int64_t num_qo_heads = 0, num_kv_heads = 0, head_dim = 0;
  DType dtype = DType::kBF16;  // of q, the metadata and the compact buffers; of K / V unless FP8
  // FP8 K / V: the metadata from the dequantized keys (every page of a touched block up to the
  // touched one: a scale raise re-encodes the block's earlier rows), the gather dequantizes.
  kernels::KvCacheFormat kv_format = kernels::KvCacheFormat::kDtype;
  float sm_scale = 0.f;
  Device device = Device::cuda();
  int64_t max_seqs = 0, max_model_len = 0;
  kernels::KernelTuning tuning;  // the decode's plan; attention kGeneric: the generic kernel
  // Page reuse across decode steps (docs/sparse.md): how many of a decode step's sequences (the
  // first ones) keep their pages in kept slots; 0: off.
  int64_t reuse_seqs = 0;
};

// The config of a page-list decode policy's twin from the registry's.
QuestCudaConfig quest_cuda_config(const sparse::SparseCudaConfig& c,
                                  const kernels::QuestBudget& budget, bool scored);

class QuestCuda final : public sparse::SparsePolicyCuda {
 public:
  // Throws Error(kInvalidArgument) for a page size that does not divide the block or a bad
  // budget, Error(kOutOfMemory) when the buffers cannot be had.
  explicit QuestCuda(const QuestCudaConfig& c);

  // Before the step's first store_kv. cache_slots [T]: where store_kv writes each new token
  // (cache block * block_size + offset); block_loc: per batch.block_tables entry its
  // QuestGatherParams::block_loc code, empty when this step is not a Quest decode step.
  // Returns whether it is a decode step the policy attends (block_loc given).
  bool plan(const ForwardBatch& batch, std::span<const int64_t> cache_slots,
            std::span<const int32_t> block_loc, cudaStream_t stream) override;

  // After layer `layer`'s keys were stored: keys.k's block b at element b * keys.block_stride
  // (FP8: with its scales).
  void on_keys_stored(int64_t layer, const sparse::PageMemory& keys, cudaStream_t stream) override;
  // Copy-on-write of whole blocks: their metadata follows.
  void copy_blocks(std::span<const KVBlockCopy> copies, cudaStream_t stream) override;

  using Memory = sparse::PageMemory;
  // q [batch, Hq, d] (contiguous, the cache's dtype); writes o [batch, Hq, d] or, with o_f32,
  // fp32. mem[1] may be empty when no code names it.
  void attend_decode(int64_t layer, const void* q, void* o, float* o_f32, const Memory (&mem)[2],
                     cudaStream_t stream) override;

  // CTAs of the last decode step's compact split-KV decode (0: no such step, or the generic
  // kernel, whose grid follows the batch size alone).
  int64_t decode_grid() const override;

  // K and V bytes the gathers read from memory 1 (the host pool) so far; synchronizes.
  int64_t memory1_bytes_read() const override;
  // (page, KV head) pairs the gathers copied from kept slots so far; synchronizes.
  int64_t pages_reused() const override;
  void set_phase_recorder(PhaseRecorder* recorder) override { recorder_ = recorder; }

 private:
  const int32_t* dev(int64_t offset) const { return step_words_->device_at(offset); }
  bool fp8() const { return c_.kv_format == kernels::KvCacheFormat::kFp8E4M3; }
  // Metadata entries one decoding token touches at most (FP8: its block's pages up to its own).
  int64_t touched_per_token() const { return fp8() ? pages_per_block_ : 1; }
  void* meta_layer(int64_t layer) const;

  QuestCudaConfig c_;
  kernels::QuestBudget budget_;
  int64_t pages_per_block_ = 0, max_pages_ = 0, max_selected_ = 0, meta_block_bytes_ = 0;
  bool generic_ = false;  // head_dim other than 64 / 128: the generic paged kernel
  Tensor meta_;           // [layers][blocks][pages_per_block][Hkv][2][d] cache dtype (scored only)
  Tensor scores_;         // [max_seqs][Hkv][max_pages] f32 (scored only)
  Tensor selected_;       // [max_seqs][Hkv][max_selected] i32
  Tensor compact_k_, compact_v_;  // [max_seqs][max_selected * page][Hkv][d] cache dtype
  Tensor decode_ws_;              // the compact decode's plan
  Tensor memory1_pages_;          // [1] u64: pages the gathers read from memory 1
  // Page reuse (reuse_seqs > 0): per layer the kept slots' rows and lists (QuestKeepParams).
  Tensor kept_k_, kept_v_;           // [layers][reuse_seqs][max_selected * page][Hkv][d] dtype
  Tensor kept_pages_, kept_blocks_;  // [layers][reuse_seqs][Hkv][max_selected] i32
  Tensor reused_pages_;              // [1] u64: pages the gathers copied from kept slots
  kernels::cpu::QuestReuseSlots reuse_slots_{0};
  std::vector<int32_t> reuse_read_, reuse_write_;  // the step's slots ([S] each)
  StagedWords words_;                              // other steps' touched pages
  kernels::cpu::QuestDecodeLayout layout_;
  // Decode steps' pages, tables and compact-decode arrays, at layout_'s offsets (fixed capacity:
  // the addresses a captured graph reads).
  std::unique_ptr<StagedWords> decode_words_;
  const StagedWords* step_words_ = &words_;  // the last plan()'s
  int64_t pages_at_ = 0, num_pages_ = 0;     // the touched pages [num_pages_][4]
  int64_t indptr_at_ = 0, tables_at_ = 0, loc_at_ = 0, lens_at_ = 0;
  int64_t dec_indptr_at_ = 0, dec_indices_at_ = 0, dec_last_at_ = 0, qo_at_ = 0;
  int64_t reuse_read_at_ = 0, reuse_write_at_ = 0;
  int batch_ = 0;
  bool decode_ = false;
  kernels::cuda::DecodePlan decode_plan_;
  PhaseRecorder* recorder_ = nullptr;  // a measurement mode's (phase_profile.h), else null
};

}  // namespace longctx
