#include "attention/backends/cpu_paged_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <span>

#include "attention/backends/paged_backend.h"
#include "attention/sparse/page_reuse.h"
#include "kernels/cpu/attention_ref.h"
#include "kernels/cpu/kv_store_cpu.h"
#include "longctx/core/error.h"
#include "ops/attention.h"

namespace longctx {

namespace {

// Row `slot` of a pool tensor [blocks, block_size, Hkv, d] as [Hkv, d] floats.
float* slot_row(const Tensor& pool_kv, int64_t slot) {
  const int64_t row = pool_kv.size(2) * pool_kv.size(3);
  return pool_kv.data<float>() + slot * row;
}

// FP8 pool: K and V rows through the KV store, which encodes them and keeps the blocks' scales.
void store_fp8(const PagedKVPool& pool, int64_t pl, const Tensor& k, const Tensor& v,
               std::span<const int64_t> slots) {
  const PagedKVPoolConfig& c = pool.config();
  for (const Tensor* x : {&k, &v})
    LONGCTX_CHECK(x->dtype() == DType::kF32 && x->rank() == 3 && x->size(1) == c.num_kv_heads &&
                      x->size(2) == c.head_dim && x->size(0) == int64_t(slots.size()),
                  ErrorCode::kInvalidArgument,
                  "CPU paged attention: K/V {} do not match the FP8 pool ({} KV heads of {}) and "
                  "{} slots",
                  x->str(), c.num_kv_heads, c.head_dim, slots.size());
  // The store reads heads head_dim apart (a view of fused QKV is; other strides are copied).
  auto rows = [](const Tensor& x) {
    return x.strides()[2] == 1 && x.strides()[1] == x.size(2) ? x : x.contiguous();
  };
  const Tensor kr = rows(k), vr = rows(v);
  kernels::KvStoreParams p;
  p.k = kr.data<float>();
  p.v = vr.data<float>();
  p.k_token_stride = kr.strides()[0];
  p.v_token_stride = vr.strides()[0];
  p.k_cache = pool.k(pl).data_ptr();
  p.v_cache = pool.v(pl).data_ptr();
  p.slot_mapping = slots.data();
  p.num_tokens = static_cast<int>(slots.size());
  p.num_kv_heads = static_cast<int>(c.num_kv_heads);
  p.head_dim = static_cast<int>(c.head_dim);
  p.page_size = static_cast<int>(c.block_size);
  p.num_pages = static_cast<int>(c.num_blocks);
  p.dtype = DType::kF32;
  p.kv_format = kernels::KvCacheFormat::kFp8E4M3;
  p.k_scale = pool.k_scale(pl).data<float>();
  p.v_scale = pool.v_scale(pl).data<float>();
  kernels::cpu::kv_store(p);
}

// Rows [first, first + len) of pool layer pl's block `block`, K (half 0) or V (half 1), into f32
// rows [len, Hkv, d] at out: copied, or dequantized (code x its block and head's scale) when FP8.
void read_rows(const PagedKVPool& pool, int64_t pl, int half, int64_t block, int64_t first,
               int64_t len, float* out) {
  const int64_t hkv = pool.config().num_kv_heads, d = pool.config().head_dim, row = hkv * d;
  const int64_t slot = block * pool.block_size() + first;
  const Tensor& cache = half == 0 ? pool.k(pl) : pool.v(pl);
  if (!pool.config().fp8()) {
    std::memcpy(out, slot_row(cache, slot), len * row * sizeof(float));
    return;
  }
  const float* scale =
      (half == 0 ? pool.k_scale(pl) : pool.v_scale(pl)).data<float>() + block * hkv;
  dequantize_fp8_rows(static_cast<const uint8_t*>(cache.data_ptr()) + slot * row, scale, len, hkv,
                      d, out);
}

// Keys [first, first + len) of a block into k and values into v (read_rows).
void gather_block(const PagedKVPool& pool, int64_t pl, int64_t block, int64_t first, int64_t len,
                  float* k, float* v) {
  read_rows(pool, pl, 0, block, first, len, k);
  read_rows(pool, pl, 1, block, first, len, v);
}

void store(const Tensor& pool_kv, const Tensor& x, std::span<const int64_t> slots) {
  // x [T, Hkv, d] f32 with a contiguous last dimension (may be a strided view of fused QKV).
  const int64_t hkv = x.size(1), d = x.size(2);
  LONGCTX_CHECK(x.dtype() == DType::kF32 && x.strides()[2] == 1 && hkv == pool_kv.size(2) &&
                    d == pool_kv.size(3),
                ErrorCode::kInvalidArgument, "CPU paged attention: K/V {} do not match the pool {}",
                x.str(), pool_kv.str());
  for (size_t t = 0; t < slots.size(); ++t) {
    float* dst = slot_row(pool_kv, slots[t]);
    for (int64_t h = 0; h < hkv; ++h) {
      const float* src = x.data<float>() + t * x.strides()[0] + h * x.strides()[1];
      std::memcpy(dst + h * d, src, d * sizeof(float));
    }
  }
}

}  // namespace

CpuPagedBackend::CpuPagedBackend(PagedKVPool& pool, float sm_scale, sparse::SparsePolicy* policy,
                                 const KvGroups* groups, StatePool* states)
    : pool_(pool), groups_(groups), sm_scale_(sm_scale), policy_(policy), states_(states) {
  LONGCTX_CHECK(
      pool.config().device.is_cpu() && (pool.config().dtype == DType::kF32 || pool.config().fp8()),
      ErrorCode::kInvalidArgument, "CPU paged attention needs an f32 or FP8 E4M3 pool on the CPU");
  if (pool.config().fp8() && policy_ != nullptr) {
    // A policy that reads FP8 (quest) keeps its metadata from the dequantized keys and its
    // decode rows read the selected pages dequantized; the prefill masks' references read f32
    // pool keys.
    const bool decode = policy_->selects(sparse::Phase::kDecode),
               prefill = policy_->selects(sparse::Phase::kPrefill);
    LONGCTX_CHECK(
        (!decode && !prefill) || (sparse::policy_def(policy_->kind()).reads_fp8 && !prefill),
        ErrorCode::kUnsupported,
        "CPU paged attention: --sparse-policy {} over an FP8 KV cache is not run (FP8 "
        "runs dense and with quest; use --kv-cache-dtype bf16 with it)",
        policy_->name());
    if (!decode) policy_ = nullptr;
  }
  if (groups_ != nullptr && groups_->single_full()) groups_ = nullptr;
  LONGCTX_CHECK(groups_ == nullptr ||
                    (policy_ == nullptr && pool.config().num_layers == groups_->pool_layers()),
                ErrorCode::kInvalidArgument,
                "CPU paged attention over {} KV groups needs a pool of {} layers ({}) and no "
                "sparse policy",
                groups_ != nullptr ? groups_->size() : 1,
                groups_ != nullptr ? groups_->pool_layers() : 0, pool.config().num_layers);
}

void CpuPagedBackend::plan(const ForwardBatch& batch) {
  batch_ = nullptr;
  PagedBackendLimits limits;
  limits.max_tokens = std::numeric_limits<int32_t>::max();
  limits.max_seqs = std::numeric_limits<int32_t>::max();
  limits.max_blocks = std::numeric_limits<int32_t>::max();
  if (groups_ == nullptr)
    check_paged_batch(batch, pool_.block_size(), pool_.num_blocks(), limits);
  else
    check_group_batch(batch, *groups_, pool_.block_size(), pool_.num_blocks(),
                      states_ != nullptr ? states_->num_slots() : 0);
  reset_new_sequence_states(batch, groups_, states_);
  batch_ = &batch;
  if (policy_ != nullptr && policy_->page_reuse() != nullptr)
    policy_->page_reuse()->begin_step(batch);
}

LinearLayerStates CpuPagedBackend::linear_states(int64_t layer) {
  LONGCTX_CHECK(batch_ != nullptr, ErrorCode::kInternal,
                "CPU paged attention: linear_states before plan");
  return paged_linear_states(*batch_, groups_, states_, layer, "CPU paged attention");
}

void CpuPagedBackend::store_kv(int64_t layer, const Tensor& k, const Tensor& v) {
  LONGCTX_CHECK(batch_ != nullptr, ErrorCode::kInternal, "CPU paged attention: store before plan");
  if (pool_.config().fp8()) {
    const int64_t pl = groups_ != nullptr ? groups_->pool_layer(layer) : layer;
    const std::span<const int64_t> slots =
        groups_ != nullptr ? batch_->tables(groups_->group_of(layer)).slot_mapping
                           : std::span<const int64_t>(batch_->slot_mapping);
    store_fp8(pool_, pl, k, v, slots);
    if (policy_ != nullptr)  // (one full group: pool layer = layer)
      fp8_keys_written(*policy_, layer, slots, pool_.block_size(),
                       pool_.config().num_kv_heads * pool_.config().head_dim,
                       [&](size_t t, int64_t rows, float* dst) {
                         read_rows(pool_, pl, 0, slots[t] / pool_.block_size(), 0, rows, dst);
                       });
    return;
  }
  if (groups_ != nullptr) {  // the layer's group: its slots, its pool layer
    const BlockTablesView t = batch_->tables(groups_->group_of(layer));
    store(pool_.k(groups_->pool_layer(layer)), k, t.slot_mapping);
    store(pool_.v(groups_->pool_layer(layer)), v, t.slot_mapping);
    return;
  }
  store(pool_.k(layer), k, batch_->slot_mapping);
  store(pool_.v(layer), v, batch_->slot_mapping);
  if (policy_ != nullptr) {
    const Tensor kc = k.strides()[1] == k.size(2) ? k : k.contiguous();
    policy_->on_keys_written(layer, kc.data<float>(), kc.strides()[0], batch_->slot_mapping.data(),
                             kc.size(0));
  }
}

Tensor CpuPagedBackend::attend(int64_t layer, const Tensor& q) {
  LONGCTX_CHECK(batch_ != nullptr, ErrorCode::kInternal, "CPU paged attention: attend before plan");
  const ForwardBatch& b = *batch_;
  const int64_t bs = pool_.block_size(), hkv = pool_.config().num_kv_heads,
                d = pool_.config().head_dim, row = hkv * d;
  // The layer's group: its tables, its pool layer and its window (one full group: the layer's
  // own pool layer, everything visible).
  const int64_t group = groups_ != nullptr ? groups_->group_of(layer) : 0;
  const int64_t pl = groups_ != nullptr ? groups_->pool_layer(layer) : layer;
  const int64_t window = groups_ != nullptr ? groups_->window_of(layer) : 0;
  const BlockTablesView tables = b.tables(group);
  Tensor out = Tensor::empty(q.shape(), DType::kF32);
  const Tensor qc = policy_ != nullptr ? q.contiguous() : q;
  const int64_t q_row = q.size(1) * q.size(2);
  for (int64_t s = 0; s < b.num_seqs(); ++s) {
    const int64_t kv_len = b.kv_lens[s], q0 = b.qo_indptr[s], n = b.q_len(s);
    if (policy_ != nullptr) {
      // (decode policies over FP8 read their metadata only: no f32 keys to give)
      const sparse::SeqKeys keys{b.block_tables.data() + b.block_table_indptr[s], kv_len,
                                 pool_.config().fp8() ? nullptr : pool_.k(layer).data<float>()};
      const float* qs = qc.data<float>() + q0 * q_row;
      if (n == 1 && policy_->selects(sparse::Phase::kDecode)) {
        const sparse::DecodeSelection sel = policy_->select_decode(layer, qs, keys);
        if (!sel.all()) {
          attend_selected(layer, qc, s, sel, out);
          continue;
        }
      } else if (n > 1 && policy_->selects(sparse::Phase::kPrefill)) {
        const sparse::PrefillMask mask = policy_->select_prefill(layer, qs, q_row, n, keys);
        if (!mask.all()) {
          attend_masked(layer, qc, s, mask, out);
          continue;
        }
      }
    }
    // Gather the sequence's keys and values out of its blocks, in token order: from the block
    // of the first key the first new token's window holds (a sliding group dropped the ones
    // before), else from the start.
    const int64_t first = kv_len - n;
    const int64_t j0 = window > 0 ? std::max<int64_t>(0, first - window + 1) / bs * bs : 0;
    Tensor k = Tensor::empty({kv_len - j0, hkv, d}, DType::kF32);
    Tensor v = Tensor::empty({kv_len - j0, hkv, d}, DType::kF32);
    Tensor kpos = Tensor::empty({kv_len - j0}, DType::kI64);
    const int32_t* table = tables.block_tables.data() + tables.block_table_indptr[s];
    for (int64_t j = j0; j < kv_len; j += bs) {
      const int64_t len = std::min(bs, kv_len - j);
      gather_block(pool_, pl, table[j / bs], 0, len, k.data<float>() + (j - j0) * row,
                   v.data<float>() + (j - j0) * row);
    }
    for (int64_t j = j0; j < kv_len; ++j) kpos.data<int64_t>()[j - j0] = j;
    ops::AttentionArgs a;
    a.q = q.slice(0, q0, q0 + n).contiguous();
    a.k = k;
    a.v = v;
    a.q_positions =
        Tensor::from_blob(const_cast<int64_t*>(b.positions.data() + q0), {n}, DType::kI64);
    a.k_positions = kpos;
    a.kv_len = kv_len - j0;
    a.scale = sm_scale_;
    a.window = window;
    a.out = out.slice(0, q0, q0 + n);
    ops::attention(a);
  }
  return out.view({q.size(0), -1});
}

void CpuPagedBackend::attend_selected(int64_t layer, const Tensor& q, int64_t s,
                                      const sparse::DecodeSelection& sel, Tensor& out) const {
  const ForwardBatch& b = *batch_;
  const int64_t bs = pool_.block_size(), hkv = pool_.config().num_kv_heads,
                d = pool_.config().head_dim, hq = q.size(1);
  const int64_t t = b.qo_indptr[s];
  const int32_t* table = b.block_tables.data() + b.block_table_indptr[s];
  const Tensor* kv[2] = {&pool_.k(layer), &pool_.v(layer)};
  if (sparse::PageReuse* reuse = policy_->page_reuse()) {
    // The pages gathered into a compact buffer (kept ones copied): page i of h at rows i * pt.
    kernels::QuestGatherParams g;
    g.k_base[0] = pool_.k(layer).data_ptr();
    g.v_base[0] = pool_.v(layer).data_ptr();
    g.block_stride[0] = bs * hkv * d;
    g.block_loc = table;
    if (pool_.config().fp8()) {
      g.kv_format = kernels::KvCacheFormat::kFp8E4M3;
      g.k_scale[0] = pool_.k_scale(layer).data<float>();
      g.v_scale[0] = pool_.v_scale(layer).data<float>();
      g.scale_block_stride[0] = hkv;
    }
    const sparse::PageReuse::Compact c = reuse->gather(layer, s, sel, table, g);
    const int64_t pt = sel.page_tokens;
    attend_selected_pages(
        q.data<float>() + t * hq * d, sel, b.kv_lens[s], hq, hkv, d, sm_scale_,
        [&](int64_t h, int64_t i, int64_t j, int half) -> const float* {
          return (half == 0 ? c.k : c.v) + ((i * pt + j % pt) * hkv + h) * d;
        },
        out.data<float>() + t * hq * d);
    return;
  }
  // FP8: key j's row dequantized into rows[half] (kept while the next call asks for the same j).
  std::vector<float> rows[2] = {std::vector<float>(hkv * d), std::vector<float>(hkv * d)};
  int64_t held[2] = {-1, -1};
  attend_selected_pages(
      q.data<float>() + t * hq * d, sel, b.kv_lens[s], hq, hkv, d, sm_scale_,
      [&](int64_t h, int64_t, int64_t j, int half) -> const float* {
        if (!pool_.config().fp8())
          return slot_row(*kv[half], int64_t(table[j / bs]) * bs + j % bs) + h * d;
        if (held[half] != j)
          read_rows(pool_, layer, half, table[j / bs], j % bs, 1, rows[half].data());
        held[half] = j;
        return rows[half].data() + h * d;
      },
      out.data<float>() + t * hq * d);
}

void CpuPagedBackend::attend_masked(int64_t layer, const Tensor& q, int64_t s,
                                    const sparse::PrefillMask& mask, Tensor& out) const {
  const ForwardBatch& b = *batch_;
  const int64_t bs = pool_.block_size(), kv_len = b.kv_lens[s];
  const int32_t q0 = b.qo_indptr[s], n = b.q_len(s);
  const int32_t pages = static_cast<int32_t>((kv_len + bs - 1) / bs);
  const int32_t qo[2] = {0, n}, kv_indptr[2] = {0, pages};
  const int32_t last = static_cast<int32_t>(kv_len - int64_t(pages - 1) * bs);
  const int64_t mask_indptr[2] = {0, static_cast<int64_t>(mask.mask.size())};
  kernels::PagedPrefillParams p;
  p.q = q.data<float>() + int64_t(q0) * q.size(1) * q.size(2);
  p.k_cache = pool_.k(layer).data<float>();
  p.v_cache = pool_.v(layer).data<float>();
  p.o = out.data<float>() + int64_t(q0) * q.size(1) * q.size(2);
  p.qo_indptr = qo;
  p.kv_indptr = kv_indptr;
  p.kv_indices = b.block_tables.data() + b.block_table_indptr[s];
  p.kv_last_page_len = &last;
  p.block_mask = mask.mask.data();
  p.block_mask_indptr = mask_indptr;
  p.block_mask_heads = static_cast<int>(q.size(1));  // PrefillMask: one mask per q head
  p.batch_size = 1;
  p.num_qo_heads = static_cast<int>(q.size(1));
  p.num_kv_heads = static_cast<int>(pool_.config().num_kv_heads);
  p.head_dim = static_cast<int>(pool_.config().head_dim);
  p.page_size = static_cast<int>(bs);
  p.dtype = DType::kF32;
  p.mask_mode = kernels::MaskMode::kCausal;
  p.sm_scale = sm_scale_;
  kernels::cpu::paged_prefill_ref(p);
}

void copy_kv_block_cpu(PagedKVPool& pool, int32_t src, int32_t dst) {
  LONGCTX_CHECK(src >= 0 && src < pool.num_blocks() && dst >= 0 && dst < pool.num_blocks(),
                ErrorCode::kInvalidArgument, "KV block copy {} -> {} outside a pool of {} blocks",
                src, dst, pool.num_blocks());
  for (int64_t l = 0; l < pool.config().num_layers; ++l) {
    pool.k(l).select(0, dst).copy_from(pool.k(l).select(0, src));
    pool.v(l).select(0, dst).copy_from(pool.v(l).select(0, src));
    if (pool.config().fp8()) {
      pool.k_scale(l).select(0, dst).copy_from(pool.k_scale(l).select(0, src));
      pool.v_scale(l).select(0, dst).copy_from(pool.v_scale(l).select(0, src));
    }
  }
}

}  // namespace longctx
