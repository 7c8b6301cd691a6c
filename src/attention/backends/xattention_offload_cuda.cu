#include <algorithm>

#include "attention/backends/xattention_offload_cuda.h"
#include "kernels/cuda/xattention.h"
#include "longctx/core/cuda_check.h"
#include "longctx/core/error.h"

namespace longctx {

using kernels::MaskMode;
using kernels::PagedPrefillParams;

XAttnOffloadCuda::XAttnOffloadCuda(const XAttnOffloadConfig& c, const XAttnOffloadMemory& memory,
                                   sparse::SparsePolicyCuda& policy)
    : c_(c), mem_(memory), policy_(policy), words_(c.xattn.device) {
  LONGCTX_CHECK(c.head_dim == 64 || c.head_dim == 128, ErrorCode::kUnsupported,
                "--sparse-policy {} with KV offload: head_dim {} (the GPU path takes 64 or 128)",
                sparse_policy_name(c.xattn.options.policy), c.head_dim);
  LONGCTX_CHECK(c.num_buffers >= 1 && c.staging_blocks > 0, ErrorCode::kInvalidArgument,
                "xattention offload: {} staging buffers of {} blocks", c.num_buffers,
                c.staging_blocks);
  // Page ids are int32 and count K and V pages of every block from a layer's base.
  LONGCTX_CHECK(
      2 * (c.num_layers * c.num_gpu_blocks + c.num_buffers * c.staging_blocks) < (int64_t(1) << 31),
      ErrorCode::kUnsupported,
      "xattention offload: {} GPU cache blocks x {} layers and {} staged blocks exceed "
      "the kernels' int32 page ids",
      c.num_gpu_blocks, c.num_layers, c.num_buffers * c.staging_blocks);
  const int64_t es = static_cast<int64_t>(dtype_size(c.dtype));
  page_bytes_ = c.block_size * c.num_kv_heads * c.head_dim * es;
  block_bytes_ = 2 * page_bytes_;
  for (int i = 0; i < c.num_buffers; ++i) {
    ready_.emplace_back(c.xattn.device);
    free_.emplace_back(c.xattn.device);
  }
  v_bytes_ = Tensor::zeros({1}, DType::kI64, c.xattn.device);
}

int64_t XAttnOffloadCuda::staged_block(int64_t layer, int64_t slot) const {
  const int64_t buffer = layer % c_.num_buffers;
  return (c_.num_layers - layer) * c_.num_gpu_blocks + buffer * c_.staging_blocks + slot;
}

bool XAttnOffloadCuda::fits(const ForwardBatch& batch, std::span<const int32_t> block_loc) const {
  int64_t host = 0;
  for (int64_t s = 0; s < batch.num_seqs(); ++s) {
    const int64_t nb = (batch.kv_lens[s] + c_.block_size - 1) / c_.block_size;
    for (int64_t j = 0; j < nb; ++j) host += block_loc[batch.block_table_indptr[s] + j] < 0;
  }
  return host <= c_.staging_blocks;
}

void XAttnOffloadCuda::plan(const ForwardBatch& batch, std::span<const int32_t> block_loc,
                            cudaStream_t compute, const Stream& h2d) {
  batch_ = static_cast<int>(batch.num_seqs());
  total_q_ = static_cast<int>(batch.num_tokens());
  const int64_t bs = c_.block_size;
  // Per sequence its first ceil(kv_len / bs) table entries: GPU blocks as they are, host blocks
  // to the next staging slot (a block shared by two sequences is staged twice).
  std::vector<int32_t> loc, kv_indptr = {0}, last(batch_), q_lens(batch_), items;
  runs_.clear();
  int32_t slots = 0;
  for (int b = 0; b < batch_; ++b) {
    const int64_t kv = batch.kv_lens[b], nb = (kv + bs - 1) / bs;
    for (int64_t j = 0; j < nb; ++j) {
      const int32_t l = block_loc[batch.block_table_indptr[b] + j];
      if (l >= 0) {
        loc.push_back(l);
        continue;
      }
      // The sparse reader calls fits() before it takes a step here.
      LONGCTX_CHECK(slots < c_.staging_blocks, ErrorCode::kInternal,
                    "xattention offload: a step past the staging buffer");
      const int32_t host = -l - 1, slot = slots++;
      loc.push_back(-slot - 1);
      items.insert(items.end(), {b, static_cast<int32_t>(j), host, slot});
      if (!runs_.empty() && runs_.back().host + runs_.back().count == host &&
          runs_.back().slot + runs_.back().count == slot)
        ++runs_.back().count;
      else
        runs_.push_back({host, slot, 1});
    }
    kv_indptr.push_back(static_cast<int32_t>(loc.size()));
    last[b] = kv == 0 ? 0 : static_cast<int32_t>((kv - 1) % bs + 1);
    q_lens[b] = static_cast<int32_t>(batch.q_len(b));
  }
  entries_ = static_cast<int64_t>(loc.size());
  num_items_ = static_cast<int>(items.size() / 4);

  words_.begin();
  tables_at_ = words_.put(nullptr, 0);
  for (int64_t layer = 0; layer < c_.num_layers; ++layer)  // doubled ids: page 2b is K, 2b+1 V
    for (int32_t l : loc)
      words_.push(static_cast<int32_t>(2 * (l >= 0 ? l : staged_block(layer, -l - 1))));
  qo_at_ = words_.put(batch.qo_indptr);
  kv_indptr_at_ = words_.put(kv_indptr);
  last_at_ = words_.put(last);
  q_lens_at_ = words_.put(q_lens);
  kv_lens_at_ = words_.put(batch.kv_lens);
  items_at_ = words_.put(items);
  words_.upload(compute);

  const int group = static_cast<int>(c_.xattn.num_qo_heads / c_.num_kv_heads);
  const size_t ws = kernels::cuda::paged_prefill_workspace_bytes(batch_, total_q_, group);
  if (workspace_.numel() < static_cast<int64_t>(ws))
    workspace_ =
        Tensor::empty({static_cast<int64_t>(ws * 5 / 4 + 256)}, DType::kU8, c_.xattn.device);
  prefill_ = kernels::cuda::paged_prefill_plan(
      batch.qo_indptr.data(), batch.kv_lens.data(), batch_, static_cast<int>(c_.xattn.num_qo_heads),
      static_cast<int>(c_.num_kv_heads), static_cast<int>(c_.head_dim), MaskMode::kCausal,
      workspace_.data_ptr(), static_cast<size_t>(workspace_.numel()), compute, c_.prefill_tuning);
  const bool selects = policy_.plan(batch, {}, {}, compute);
  LONGCTX_CHECK(selects, ErrorCode::kInternal, "xattention offload: a step without a prefill");
  for (int64_t layer = 0; layer < std::min<int64_t>(c_.num_buffers, c_.num_layers); ++layer)
    load_keys(layer, h2d);
}

void XAttnOffloadCuda::load_keys(int64_t layer, const Stream& h2d) {
  const int64_t buffer = layer % c_.num_buffers;
  h2d.wait(free_[buffer]);
  const size_t pitch = static_cast<size_t>(block_bytes_);
  for (const KeyRun& r : runs_) {
    char* dst = mem_.gpu + (layer * c_.num_gpu_blocks + staged_block(layer, r.slot)) * block_bytes_;
    const char* src = mem_.host + (layer * c_.num_host_blocks + r.host) * block_bytes_;
    LONGCTX_CUDA_CHECK(cudaMemcpy2DAsync(dst, pitch, src, pitch, static_cast<size_t>(page_bytes_),
                                         r.count, cudaMemcpyHostToDevice,
                                         static_cast<cudaStream_t>(h2d.handle())));
    k_bytes_ += r.count * page_bytes_;
  }
  ready_[buffer].record(h2d);
}

Tensor XAttnOffloadCuda::attend(int64_t layer, const Tensor& q, cudaStream_t compute,
                                const Stream& h2d) {
  const Tensor qc = q.contiguous();
  Tensor out =
      Tensor::empty({q.size(0), c_.xattn.num_qo_heads * c_.head_dim}, c_.dtype, c_.xattn.device);
  const int64_t buffer = layer % c_.num_buffers;
  LONGCTX_CUDA_CHECK(
      cudaStreamWaitEvent(compute, static_cast<cudaEvent_t>(ready_[buffer].handle()), 0));
  char* base = mem_.gpu + layer * c_.num_gpu_blocks * block_bytes_;  // the layer's cache
  PagedPrefillParams p;
  p.q = qc.data_ptr();
  p.k_cache = base;
  p.v_cache = base + page_bytes_;
  p.o = out.data_ptr();
  p.qo_indptr = dev(qo_at_);
  p.kv_indptr = dev(kv_indptr_at_);
  p.kv_indices = dev(tables_at_ + layer * entries_);
  p.kv_last_page_len = dev(last_at_);
  p.batch_size = batch_;
  p.num_qo_heads = static_cast<int>(c_.xattn.num_qo_heads);
  p.num_kv_heads = static_cast<int>(c_.num_kv_heads);
  p.head_dim = static_cast<int>(c_.head_dim);
  p.page_size = static_cast<int>(c_.block_size);
  p.dtype = c_.dtype;
  p.mask_mode = MaskMode::kCausal;
  p.sm_scale = c_.xattn.sm_scale;
  policy_.select_prefill(p, compute);  // e.g. the estimate over GPU and staged keys; the mask

  kernels::XAttnGatherParams g;
  g.block_mask = p.block_mask;
  g.mask_indptr = p.block_mask_indptr;
  g.q_lens = dev(q_lens_at_);
  g.kv_lens = dev(kv_lens_at_);
  g.items = dev(items_at_);
  g.num_items = num_items_;
  g.src = mem_.host_dev + layer * c_.num_host_blocks * block_bytes_ + page_bytes_;
  g.dst = base + page_bytes_;
  g.block_stride = block_bytes_;
  g.dst_block_offset = staged_block(layer, 0);
  g.block_size = p.page_size;
  g.num_qo_heads = p.num_qo_heads;
  g.num_kv_heads = p.num_kv_heads;
  g.head_dim = p.head_dim;
  g.dtype = c_.dtype;
  g.bytes_copied = reinterpret_cast<unsigned long long*>(v_bytes_.data_ptr());
  kernels::cuda::xattn_gather_run(g, compute);

  kernels::cuda::paged_prefill_run(p, prefill_, compute);
  free_[buffer].record_on(compute);
  if (layer + c_.num_buffers < c_.num_layers) load_keys(layer + c_.num_buffers, h2d);
  return out;
}

int64_t XAttnOffloadCuda::host_bytes_read() const {
  int64_t v = 0;
  LONGCTX_CUDA_CHECK(cudaMemcpy(&v, v_bytes_.data_ptr(), sizeof(v), cudaMemcpyDeviceToHost));
  return k_bytes_ + v;
}

}  // namespace longctx
