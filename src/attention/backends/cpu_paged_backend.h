// The CPU reference backend over a paged KV pool: the same block tables and slot mapping as
// the GPU's paged backend, so the engine (block manager, prefix cache, preemption) runs one way
// on both. K/V are f32 in a CPU PagedKVPool, or FP8 E4M3 with per-block scales (written through
// the KV store reference, kernels/kv_format.h); attention gathers each sequence's keys and values
// from its blocks (FP8: dequantized to fp32) and runs ops::attention (fp32, causal by position).
// With a sparse policy (attention/sparse), a decode row reads only the pages the policy selects per
// KV head, and a prefill chunk runs the block-sparse reference with the policy's mask; Full selects
// nothing, so the dense path runs unchanged. Over an FP8 pool a decode policy (quest) sees the
// keys as the cache holds them (dequantized, fp8_keys_written) and the selected pages are read
// dequantized.
//
// KV groups (attention/kv_groups.h): a layer reads and writes through its group: the group's
// block tables and slots in the batch, its pool layer, and a sliding layer only the blocks of
// its window (keys at positions > q_pos - window). A linear-attention layer (a state group)
// reads and updates its sequences' slots of a StatePool.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <span>
#include <utility>
#include <vector>

#include "attention/sparse/sparse_policy.h"
#include "kv/paged_kv_pool.h"
#include "kv/state_pool.h"
#include "longctx/attention/forward_batch.h"
#include "longctx/attention/kv_groups.h"
#include "longctx/core/dtype.h"

namespace longctx {

class CpuPagedBackend final : public AttentionBackend {
 public:
  // `pool` (on the CPU, f32 or FP8), `policy` (optional; its metadata follows the pool's writes,
  // over FP8 from the dequantized keys; with an FP8 pool only one whose registry line reads_fp8
  // and that selects no prefill: Error(kUnsupported) naming it otherwise) and
  // `groups` (optional: null is one full group, pool layer = model layer) must outlive the
  // backend. A sparse policy needs one full group.
  // `states` (optional) holds the state groups' slots (linear attention).
  CpuPagedBackend(PagedKVPool& pool, float sm_scale, sparse::SparsePolicy* policy = nullptr,
                  const KvGroups* groups = nullptr, StatePool* states = nullptr);

  // Checks the block tables and slots against the pool (check_paged_batch).
  void plan(const ForwardBatch& batch) override;
  void store_kv(int64_t layer, const Tensor& k, const Tensor& v) override;
  Tensor attend(int64_t layer, const Tensor& q) override;
  // Each sequence's state slot of the layer's state group (zeroed in plan() for a sequence
  // starting at its first token).
  LinearLayerStates linear_states(int64_t layer) override;

 private:
  // Sequence s's row of out [T, Hq, d] from the pages `sel` lists per KV head.
  void attend_selected(int64_t layer, const Tensor& q, int64_t s,
                       const sparse::DecodeSelection& sel, Tensor& out) const;
  // Sequence s's rows through the block-sparse reference under `mask`.
  void attend_masked(int64_t layer, const Tensor& q, int64_t s, const sparse::PrefillMask& mask,
                     Tensor& out) const;

  PagedKVPool& pool_;
  const KvGroups* groups_ = nullptr;  // null or single_full(): the one-table path
  float sm_scale_ = 0.f;
  sparse::SparsePolicy* policy_ = nullptr;
  const ForwardBatch* batch_ = nullptr;  // the planned batch (outlives the forward)
  StatePool* states_ = nullptr;          // the state groups' slots (null: no state group)
};

// One decode row over the pages `sel` lists per KV head (online softmax in fp32, keys in order):
// q [Hq, d], out [Hq, d]; row(h, i, j, half) is key j's K (half 0) or V (half 1) of KV head h
// [d], key j being in page i of h's list. The resident backend and the simulated offload's sparse
// reader share it, so their outputs are equal.
template <typename RowFn>
void attend_selected_pages(const float* q, const sparse::DecodeSelection& sel, int64_t kv_len,
                           int64_t hq, int64_t hkv, int64_t d, float sm_scale, RowFn&& row,
                           float* out) {
  const int64_t group = hq / hkv, pt = sel.page_tokens;
  std::vector<float> acc(d);
  for (int64_t h = 0; h < hkv; ++h) {
    for (int64_t g = h * group; g < (h + 1) * group; ++g) {
      const float* qr = q + g * d;
      float mx = -INFINITY, sum = 0.f;
      std::fill(acc.begin(), acc.end(), 0.f);
      for (size_t i = 0; i < sel.per_kv_head[h].size(); ++i) {
        const int64_t page = sel.per_kv_head[h][i];
        for (int64_t j = page * pt; j < std::min(kv_len, (page + 1) * pt); ++j) {
          const float* k = row(h, int64_t(i), j, 0);
          const float* v = row(h, int64_t(i), j, 1);
          float dot = 0.f;
          for (int64_t e = 0; e < d; ++e) dot += qr[e] * k[e];
          const float sc = dot * sm_scale, nmx = std::max(mx, sc);
          const float rescale = std::exp(mx - nmx), w = std::exp(sc - nmx);
          sum = sum * rescale + w;
          for (int64_t e = 0; e < d; ++e) acc[e] = acc[e] * rescale + w * v[e];
          mx = nmx;
        }
      }
      float* o = out + g * d;
      for (int64_t e = 0; e < d; ++e) o[e] = sum > 0.f ? acc[e] / sum : 0.f;
    }
  }
}

// n rows [n, Hkv, d] of FP8 codes of one block, K or V, dequantized into f32 out: code x the
// block's scale of its KV head (scale [Hkv]).
inline void dequantize_fp8_rows(const uint8_t* codes, const float* scale, int64_t n, int64_t hkv,
                                int64_t d, float* out) {
  for (int64_t t = 0; t < n; ++t)
    for (int64_t h = 0; h < hkv; ++h)
      for (int64_t e = 0; e < d; ++e) {
        const int64_t i = (t * hkv + h) * d + e;
        out[i] = fp8e4m3_to_f32(codes[i]) * scale[h];
      }
}

// A decode policy's metadata over an FP8 cache: after a store of new rows at `slots` (block *
// block_size + offset; < 0: padding), every touched block's keys from offset 0 up to its highest
// new row, as the cache holds them now, go through on_keys_written (which starts a page afresh at
// its first row): a row that raised a block's scale re-encoded the block's earlier rows, so its
// earlier pages are recomputed too (the GPU's QuestCuda recomputes the same pages).
// read(t, rows, dst): rows [0, rows) of the block of new token t, dequantized into dst
// [rows, Hkv, d]. The resident backend and the simulated offload's sparse reader share it.
template <typename ReadFn>
void fp8_keys_written(sparse::SparsePolicy& policy, int64_t layer, std::span<const int64_t> slots,
                      int64_t block_size, int64_t row_elems, ReadFn&& read) {
  std::map<int64_t, std::pair<size_t, int64_t>> blocks;  // block -> (a new token in it, rows)
  for (size_t t = 0; t < slots.size(); ++t) {
    if (slots[t] < 0) continue;
    auto& [token, rows] = blocks.try_emplace(slots[t] / block_size, t, 0).first->second;
    rows = std::max(rows, slots[t] % block_size + 1);
  }
  std::vector<float> keys;
  std::vector<int64_t> rows_slots;
  for (const auto& [block, tr] : blocks) {
    const auto [token, rows] = tr;
    keys.resize(static_cast<size_t>(rows * row_elems));
    rows_slots.resize(static_cast<size_t>(rows));
    read(token, rows, keys.data());
    for (int64_t r = 0; r < rows; ++r) rows_slots[r] = block * block_size + r;
    policy.on_keys_written(layer, keys.data(), row_elems, rows_slots.data(), rows);
  }
}

// Copies every layer's K and V of block src into block dst of a CPU pool.
void copy_kv_block_cpu(PagedKVPool& pool, int32_t src, int32_t dst);

}  // namespace longctx
