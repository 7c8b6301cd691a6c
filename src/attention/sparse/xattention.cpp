// XAttention (prefill): the estimate and selection of kernels/xattention_params.h (strided
// antidiagonal scores, a softmax per query group, block masses, per q head the fewest blocks
// reaching the threshold after the sink and the diagonal), through their CPU references, the same
// code the CUDA kernels are tested against. CUDA twin: XAttnCuda (attention/backends/
// xattention_cuda.h: the estimate and selection kernels), staged over host keys with offload.
#include <algorithm>
#include <vector>

#include "attention/sparse/policies.h"
#include "kernels/cpu/xattention_cpu.h"
#include "kernels/xattention_params.h"
#ifdef LONGCTX_WITH_CUDA
#include "attention/backends/xattention_cuda.h"
#endif

namespace longctx::sparse {

namespace {

class XAttentionPolicy final : public SparsePolicy {
 public:
  XAttentionPolicy(const SparseOptions& o, const KvShape& s) : o_(o), s_(s) {
    kernels::cpu::check_xattn_options(static_cast<int>(o.stride), o.threshold);
  }

  SparsePolicyKind kind() const override { return SparsePolicyKind::kXAttention; }

  PrefillMask select_prefill(int64_t, const float* q, int64_t q_stride, int64_t n,
                             const SeqKeys& keys) override {
    const int64_t kv_len = keys.kv_len, k_blocks = kernels::xattn_blocks(kv_len);
    if (kernels::xattn_dense(n, kv_len, o_.xattn_min_len)) return {};
    const int32_t pages = static_cast<int32_t>((kv_len + s_.block_size - 1) / s_.block_size);
    const int32_t qo[2] = {0, static_cast<int32_t>(n)}, kv_indptr[2] = {0, pages};
    const int32_t last = static_cast<int32_t>(kv_len - (pages - 1) * s_.block_size);
    const int32_t q_lens[1] = {qo[1]}, kv_lens[1] = {static_cast<int32_t>(kv_len)};
    const int64_t lse_indptr[2] = {0,
                                   kernels::xattn_lse_elems(n, kv_len, s_.num_qo_heads, o_.stride)};
    const int64_t mask_indptr[2] = {0, kernels::xattn_mask_elems(n, kv_len, s_.num_qo_heads)};
    std::vector<float> lse(static_cast<size_t>(lse_indptr[1]));

    kernels::XAttnEstimateParams e;
    e.q = q;
    e.q_row_stride = q_stride;
    e.k_cache = keys.pool_k;
    e.qo_indptr = qo;
    e.kv_indptr = kv_indptr;
    e.kv_indices = keys.blocks;
    e.kv_last_page_len = &last;
    e.block_lse = lse.data();
    e.lse_indptr = lse_indptr;
    e.batch_size = 1;
    e.num_qo_heads = static_cast<int>(s_.num_qo_heads);
    e.num_kv_heads = static_cast<int>(s_.num_kv_heads);
    e.head_dim = static_cast<int>(s_.head_dim);
    e.page_size = static_cast<int>(s_.block_size);
    e.stride = static_cast<int>(o_.stride);
    e.dtype = DType::kF32;
    e.sm_scale = s_.sm_scale;
    kernels::cpu::xattn_estimate(e);

    PrefillMask m;
    m.q_blocks = kernels::xattn_blocks(n);
    m.k_blocks = k_blocks;
    m.mask.resize(static_cast<size_t>(mask_indptr[1]));
    kernels::XAttnSelectParams sel;
    sel.block_lse = lse.data();
    sel.lse_indptr = lse_indptr;
    sel.block_mask = m.mask.data();
    sel.mask_indptr = mask_indptr;
    sel.q_lens = q_lens;
    sel.kv_lens = kv_lens;
    sel.batch_size = 1;
    sel.num_qo_heads = e.num_qo_heads;
    sel.heads_per_mask = o_.xattn_per_kv_head ? e.num_qo_heads / e.num_kv_heads : 1;
    sel.dense_tail = static_cast<int>(std::min<int64_t>(o_.xattn_dense_tail, n));
    sel.stride = e.stride;
    sel.threshold = o_.threshold;
    kernels::cpu::xattn_select(sel);
    return m;
  }

 private:
  SparseOptions o_;
  KvShape s_;
};

std::unique_ptr<SparsePolicy> make_cpu(const SparseOptions& options, const KvShape& shape) {
  return std::make_unique<XAttentionPolicy>(options, shape);
}

SparseGpuBytes gpu_bytes(const SparseOptions& o, const SparseGpuShape& s) {
  return {
      0, kernels::xattn_buffers(s.num_qo_heads, o.stride, s.max_tokens, s.max_seqs, s.max_model_len)
             .bytes()};
}

#ifdef LONGCTX_WITH_CUDA
std::unique_ptr<SparsePolicyCuda> make_cuda(const SparseCudaConfig& c) {
  return std::make_unique<XAttnCuda>(c);
}
#endif

}  // namespace

extern const PolicyDef kXAttentionPolicy{
    .kind = SparsePolicyKind::kXAttention,
    .name = "xattention",
    .prefill = true,
    .offload_staging = true,  // the estimate reads every key: host keys are staged on the GPU
    .make_cpu = make_cpu,
#ifdef LONGCTX_WITH_CUDA
    .make_cuda = make_cuda,
#endif
    .gpu_bytes = gpu_bytes,
};

}  // namespace longctx::sparse
