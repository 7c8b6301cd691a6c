// The CPU simulation's sparse reader (offload_sparse.h): the registry's CPU policy (attention/
// sparse) over the simulated device's memory, asked before anything is read. A decode step of a
// decode policy (quest, streaming) reads only the pages its lists name, host pages from the host
// pool in place (so a sparse step that forgot a write-back's ticket reads stale keys here too),
// and attends them as the resident CPU engine does (attend_selected_pages); a step with a prefill
// under a prefill policy (xattention, streaming) reads per sequence the keys of every block (host
// blocks in place), asks the policy for the chunk's mask and reads the values only of the blocks
// some head keeps; the masked attention is the resident CPU engine's
// (kernels::cpu::paged_prefill_ref with the policy's mask), the plan the CUDA reader runs
// (xattention_offload_cuda.h). Over an FP8 cache (decode policies that read it: quest) the
// policy's metadata comes from the GPU cache's blocks as stored (fp8_keys_written) and the
// selected pages are read dequantized (code x their block's scale), host pages in place.
#include "attention/backends/offload_sparse_cpu.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "attention/backends/cpu_paged_backend.h"
#include "attention/sparse/page_reuse.h"
#include "attention/sparse/sparse_policy.h"
#include "kernels/cpu/attention_ref.h"
#include "kernels/quest_params.h"
#include "longctx/core/error.h"

namespace longctx {

namespace {

using kernels::MaskMode;
using kernels::PagedPrefillParams;

class CpuOffloadSparse final : public OffloadSparseReader {
 public:
  CpuOffloadSparse(const OffloadDeviceConfig& c, CpuOffloadMemory memory,
                   std::unique_ptr<sparse::SparsePolicy> policy)
      : c_(c),
        g_(c.geometry),
        mem_(std::move(memory)),
        policy_(std::move(policy)),
        page_(c.page_elems()),
        row_(c.num_kv_heads * c.head_dim) {
    for (auto& r : rows_) r.resize(static_cast<size_t>(row_));
  }

  bool takes_step(const ForwardBatch& batch, std::span<const int32_t>) const override {
    bool prefill = false;
    for (int64_t s = 0; s < batch.num_seqs(); ++s) prefill = prefill || batch.q_len(s) > 1;
    return policy_->selects(prefill ? sparse::Phase::kPrefill : sparse::Phase::kDecode);
  }

  void plan(const ForwardBatch& batch, const OffloadStepPlan& plan,
            std::span<const int32_t> block_loc, std::span<const KVBlockCopy> copies) override {
    for (const KVBlockCopy& cp : copies) policy_->on_block_copied(cp.src, cp.dst);
    batch_ = &batch;
    plan_ = &plan;
    block_loc_.assign(block_loc.begin(), block_loc.end());
    // Every step: a sequence keeps its pages only over consecutive decode rows read here.
    if (sparse::PageReuse* reuse = policy_->page_reuse()) reuse->begin_step(batch);
    // Host pages are read in place: after write-backs of them still in flight.
    if (!block_loc.empty() && plan.load_wait_ticket) mem_.land_write_backs(plan.load_wait_ticket);
  }

  void on_keys_stored(int64_t layer, const Tensor& k) override {
    if (c_.fp8()) {  // the keys as the GPU cache's blocks hold them (plan_->slots: where)
      const std::vector<int64_t>& cache_slots = plan_->slots;
      const int64_t bs = g_.block_size;
      fp8_keys_written(*policy_, layer, batch_->slot_mapping, bs, row_,
                       [&](size_t t, int64_t rows, float* dst) {
                         const int32_t g = static_cast<int32_t>(cache_slots[t] / bs);
                         dequantize_fp8_rows(codes(layer, g, 0), scales(layer, g, 0), rows,
                                             c_.num_kv_heads, c_.head_dim, dst);
                       });
      return;
    }
    const Tensor kc = k.strides()[1] == k.size(2) ? k : k.contiguous();
    policy_->on_keys_written(layer, kc.data<float>(), kc.strides()[0], batch_->slot_mapping.data(),
                             kc.size(0));
  }

  Tensor attend(int64_t layer, const Tensor& q) override {
    const ForwardBatch& b = *batch_;
    const int64_t q_row = c_.num_qo_heads * c_.head_dim, bs = g_.block_size;
    const Tensor qc = q.contiguous();
    Tensor o = Tensor::empty({q.size(0), q_row}, DType::kF32);
    for (int64_t s = 0; s < b.num_seqs(); ++s) {
      const float* qs = qc.data<float>() + b.qo_indptr[s] * q_row;
      float* os = o.data<float>() + b.qo_indptr[s] * q_row;
      if (b.q_len(s) > 1 || !policy_->selects(sparse::Phase::kDecode)) {
        attend_prefill(layer, s, qs, os);
        continue;
      }
      // A decode row: the policy's pages (every page when it selects nothing), read where they
      // are.
      const int32_t* table = b.block_tables.data() + b.block_table_indptr[s];
      const int32_t* loc = block_loc_.data() + b.block_table_indptr[s];
      const int64_t kv_len = b.kv_lens[s];
      sparse::DecodeSelection sel = policy_->select_decode(layer, qs, {table, kv_len, nullptr});
      const bool policy_all = sel.all();
      if (sel.all()) {
        sel.page_tokens = bs;
        sel.per_kv_head.assign(c_.num_kv_heads, {});
        for (auto& l : sel.per_kv_head)
          for (int32_t j = 0; j * bs < kv_len; ++j) l.push_back(j);
      }
      // A page of one KV head: K and V (FP8: codes and their two scales).
      const int64_t page_bytes = c_.fp8()
                                     ? 2 * (sel.page_tokens * c_.head_dim + int64_t(sizeof(float)))
                                     : 2 * sel.page_tokens * c_.head_dim * int64_t(sizeof(float));
      sparse::PageReuse* reuse = policy_->page_reuse();
      if (reuse != nullptr && !policy_all) {
        // Through the compact buffer: kept pages copied, the others read where they are.
        const int64_t before = reuse->memory1_pages(), pt = sel.page_tokens;
        kernels::QuestGatherParams g = memory(layer);
        g.block_loc = loc;
        const sparse::PageReuse::Compact cb = reuse->gather(layer, s, sel, table, g);
        host_bytes_read_ += (reuse->memory1_pages() - before) * page_bytes;
        attend_selected_pages(
            qs, sel, kv_len, c_.num_qo_heads, c_.num_kv_heads, c_.head_dim, c_.sm_scale,
            [&](int64_t h, int64_t i, int64_t j, int half) -> const float* {
              return (half == 0 ? cb.k : cb.v) +
                     ((i * pt + j % pt) * c_.num_kv_heads + h) * c_.head_dim;
            },
            os);
        continue;
      }
      for (const auto& l : sel.per_kv_head)
        for (int32_t page : l)
          if (loc[page * sel.page_tokens / bs] < 0) host_bytes_read_ += page_bytes;
      int64_t held[2] = {-1, -1};  // FP8: the key whose row rows_[half] holds
      attend_selected_pages(
          qs, sel, kv_len, c_.num_qo_heads, c_.num_kv_heads, c_.head_dim, c_.sm_scale,
          [&](int64_t h, int64_t, int64_t j, int half) -> const float* {
            const int64_t head = h * c_.head_dim;
            if (!c_.fp8()) return block(layer, loc[j / bs]) + half * page_ + (j % bs) * row_ + head;
            if (held[half] != j)
              dequantize_fp8_rows(codes(layer, loc[j / bs], half) + (j % bs) * row_,
                                  scales(layer, loc[j / bs], half), 1, c_.num_kv_heads, c_.head_dim,
                                  rows_[half].data());
            held[half] = j;
            return rows_[half].data() + head;
          },
          os);
    }
    return o;
  }

  int64_t host_bytes_read() const override { return host_bytes_read_; }
  int64_t pages_reused() const override {
    const sparse::PageReuse* reuse = policy_->page_reuse();
    return reuse != nullptr ? reuse->reused_pages() : 0;
  }

 private:
  // One sequence of a step with a prefill under a prefill policy: K of every block (what an
  // estimate may read), the policy's mask, V of the blocks the mask keeps, masked causal
  // attention into o. Decode rows of a policy that does not select decodes attend every block.
  void attend_prefill(int64_t layer, int64_t s, const float* qs, float* os) {
    const ForwardBatch& b = *batch_;
    const int64_t bs = g_.block_size, q_row = c_.num_qo_heads * c_.head_dim;
    const int64_t kv_len = b.kv_lens[s], n = b.q_len(s);
    const int32_t nb = static_cast<int32_t>((kv_len + bs - 1) / bs);
    const int32_t* loc = block_loc_.data() + b.block_table_indptr[s];
    std::vector<int32_t> blocks(nb);
    for (int32_t j = 0; j < nb; ++j) blocks[j] = j;
    // [nb, bs, Hkv, d] each: the sequence's blocks in table order (rows past kv_len unread).
    std::vector<float> k(static_cast<size_t>(nb * page_)), v(k.size());
    for (int32_t j = 0; j < nb; ++j) read_half(layer, loc[j], 0, k.data() + j * page_);
    sparse::PrefillMask mask;
    if (n > 1)
      mask = policy_->select_prefill(layer, qs, q_row, n, {blocks.data(), kv_len, k.data()});
    for (int32_t j = 0; j < nb; ++j)
      if (mask.all() || mask_keeps(mask, j * bs, std::min<int64_t>((j + 1) * bs, kv_len)))
        read_half(layer, loc[j], 1, v.data() + j * page_);
    const std::vector<int32_t> qo = {0, static_cast<int32_t>(n)}, kv_indptr = {0, nb},
                               last = {last_page_len(kv_len)};
    const int64_t mask_indptr[2] = {0, static_cast<int64_t>(mask.mask.size())};
    PagedPrefillParams p;
    p.q = qs;
    p.k_cache = k.data();
    p.v_cache = v.data();
    p.o = os;
    p.lse = nullptr;
    p.qo_indptr = qo.data();
    p.kv_indptr = kv_indptr.data();
    p.kv_indices = blocks.data();
    p.kv_last_page_len = last.data();
    p.batch_size = 1;
    p.num_qo_heads = static_cast<int>(c_.num_qo_heads);
    p.num_kv_heads = static_cast<int>(c_.num_kv_heads);
    p.head_dim = static_cast<int>(c_.head_dim);
    p.page_size = static_cast<int>(bs);
    p.dtype = DType::kF32;
    p.mask_mode = MaskMode::kCausal;
    p.sm_scale = c_.sm_scale;
    if (!mask.all()) {
      p.block_mask = mask.mask.data();
      p.block_mask_indptr = mask_indptr;
      p.block_mask_heads = static_cast<int>(c_.num_qo_heads);  // PrefillMask: per q head
    }
    kernels::cpu::paged_prefill_ref(p);
  }

  // The gather's two memories for `layer` (QuestGatherParams: the GPU cache, the host pool).
  kernels::QuestGatherParams memory(int64_t layer) const {
    kernels::QuestGatherParams g;
    const int64_t blocks[2] = {g_.num_gpu_blocks, g_.num_host_blocks};
    for (int m = 0; m < 2; ++m) {
      const int64_t first = layer * blocks[m] * 2 * page_;  // elements (FP8: bytes)
      const void* base = m == 0 ? mem_.gpu : mem_.host;
      if (c_.fp8()) {
        g.k_base[m] = static_cast<const uint8_t*>(base) + first;
        g.v_base[m] = static_cast<const uint8_t*>(base) + first + page_;
        const float* sc =
            (m == 0 ? mem_.gpu_scales : mem_.host_scales) + layer * blocks[m] * 2 * c_.num_kv_heads;
        g.k_scale[m] = sc;
        g.v_scale[m] = sc + c_.num_kv_heads;
        g.scale_block_stride[m] = 2 * c_.num_kv_heads;
      } else {
        g.k_base[m] = static_cast<const float*>(base) + first;
        g.v_base[m] = static_cast<const float*>(base) + first + page_;
      }
      g.block_stride[m] = 2 * page_;
    }
    if (c_.fp8()) g.kv_format = kernels::KvCacheFormat::kFp8E4M3;
    return g;
  }
  // Block `loc` of `layer` (GPU block g >= 0, or host block h as -h - 1): its index among the
  // memory's [layers][blocks] blocks and that memory.
  int64_t index(int64_t layer, int32_t loc) const {
    return loc >= 0 ? layer * g_.num_gpu_blocks + loc : layer * g_.num_host_blocks + (-loc - 1);
  }
  // f32: the block's [K, V][bs, Hkv, d].
  const float* block(int64_t layer, int32_t loc) const {
    return static_cast<const float*>(loc >= 0 ? mem_.gpu : mem_.host) +
           index(layer, loc) * 2 * page_;
  }
  // FP8: the codes [bs, Hkv, d] of the block's K (half 0) or V, and its scales [Hkv].
  const uint8_t* codes(int64_t layer, int32_t loc, int half) const {
    return static_cast<const uint8_t*>(loc >= 0 ? mem_.gpu : mem_.host) +
           (index(layer, loc) * 2 + half) * page_;
  }
  const float* scales(int64_t layer, int32_t loc, int half) const {
    return (loc >= 0 ? mem_.gpu_scales : mem_.host_scales) +
           (index(layer, loc) * 2 + half) * c_.num_kv_heads;
  }
  // K (half 0) or V (half 1) of a sequence's block at `loc` (host blocks are read in place and
  // counted).
  void read_half(int64_t layer, int32_t loc, int half, float* dst) {
    std::memcpy(dst, block(layer, loc) + half * page_, page_ * sizeof(float));
    if (loc < 0) host_bytes_read_ += page_ * static_cast<int64_t>(sizeof(float));
  }
  // Whether some q head and query block of `mask` keeps a key in [begin, end).
  static bool mask_keeps(const sparse::PrefillMask& mask, int64_t begin, int64_t end) {
    const int64_t kb0 = begin / kernels::kSparseBlock, kb1 = (end - 1) / kernels::kSparseBlock;
    const int64_t rows = static_cast<int64_t>(mask.mask.size()) / mask.k_blocks;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t kb = kb0; kb <= kb1 && kb < mask.k_blocks; ++kb)
        if (mask.mask[r * mask.k_blocks + kb]) return true;
    return false;
  }
  int32_t last_page_len(int64_t kv_len) const {
    return kv_len == 0 ? 0 : static_cast<int32_t>((kv_len - 1) % g_.block_size + 1);
  }

  OffloadDeviceConfig c_;
  OffloadGeometry g_;
  CpuOffloadMemory mem_;
  std::unique_ptr<sparse::SparsePolicy> policy_;
  int64_t page_ = 0;                       // elements of a block's K (or V) of one layer
  int64_t row_ = 0;                        // elements of a key's row (Hkv * d)
  std::vector<float> rows_[2];             // FP8: a K and a V row [Hkv, d] dequantized
  const OffloadStepPlan* plan_ = nullptr;  // the step's (its cache slots)
  int64_t host_bytes_read_ = 0;            // host K / V bytes read in place
  std::vector<int32_t> block_loc_;         // a step the reader takes: its block locations
  const ForwardBatch* batch_ = nullptr;
};

}  // namespace

std::unique_ptr<OffloadSparseReader> make_cpu_offload_sparse(const OffloadDeviceConfig& c,
                                                             CpuOffloadMemory memory) {
  if (!sparse::selects(c.sparse, sparse::Phase::kPrefill) &&
      !sparse::selects(c.sparse, sparse::Phase::kDecode))
    return nullptr;
  LONGCTX_CHECK(!c.fp8() || (sparse::policy_def(c.sparse.policy).reads_fp8 &&
                             !sparse::selects(c.sparse, sparse::Phase::kPrefill)),
                ErrorCode::kUnsupported,
                "KV offload (CPU): --sparse-policy {} over an FP8 KV cache is not simulated (FP8 "
                "runs dense and with quest; use --kv-cache-dtype bf16 with it)",
                sparse_policy_name(c.sparse.policy));
  sparse::KvShape shape;
  shape.num_layers = c.geometry.num_layers;
  shape.num_blocks = c.geometry.num_host_blocks;  // the engine's block ids: the metadata's
  shape.block_size = c.geometry.block_size;
  shape.num_qo_heads = c.num_qo_heads;
  shape.num_kv_heads = c.num_kv_heads;
  shape.head_dim = c.head_dim;
  shape.sm_scale = c.sm_scale;
  return std::make_unique<CpuOffloadSparse>(c, std::move(memory),
                                            sparse::make_sparse_policy(c.sparse, shape));
}

}  // namespace longctx
