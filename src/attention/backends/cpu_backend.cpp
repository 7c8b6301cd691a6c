#include "attention/backends/cpu_backend.h"

#include <cstring>

#include "longctx/core/error.h"
#include "ops/attention.h"

namespace longctx {

CpuAttentionBackend::CpuAttentionBackend(std::vector<KVCache*> caches, float sm_scale,
                                         std::vector<int64_t> layer_windows)
    : caches_(std::move(caches)), sm_scale_(sm_scale), layer_windows_(std::move(layer_windows)) {
  for (KVCache* c : caches_)
    LONGCTX_CHECK(c != nullptr, ErrorCode::kInvalidArgument, "CpuAttentionBackend: null cache");
}

void CpuAttentionBackend::plan(const ForwardBatch& batch) {
  planned_ = false;
  const int64_t num_seqs = batch.num_seqs();
  LONGCTX_CHECK(num_seqs == static_cast<int64_t>(caches_.size()), ErrorCode::kInvalidArgument,
                "CPU attention: the batch has {} sequences but {} caches were given", num_seqs,
                caches_.size());
  segments_.assign(num_seqs, {});
  for (int64_t s = 0; s < num_seqs; ++s) {
    KVCache& c = *caches_[s];
    Segment& g = segments_[s];
    g.begin = batch.qo_indptr[s];
    g.n = batch.q_len(s);
    g.start = batch.kv_lens[s] - g.n;
    LONGCTX_CHECK(g.start == c.length(), ErrorCode::kInvalidArgument,
                  "CPU attention: sequence {} has {} cached tokens but the batch says {}", s,
                  c.length(), g.start);
    LONGCTX_CHECK(c.length() + g.n <= c.capacity(), ErrorCode::kOutOfRange,
                  "forward: {} new tokens do not fit the KV cache ({} of {} slots used)", g.n,
                  c.length(), c.capacity());
  }
  // A sequence starting afresh starts from zero states (a forward that failed midway may have
  // written some).
  for (int64_t s = 0; s < num_seqs; ++s) {
    KVCache& c = *caches_[s];
    if (segments_[s].start != 0 || !c.has_state()) continue;
    for (int64_t l = 0; l < c.num_layers(); ++l) {
      if (!c.recurrent_state(l).defined()) continue;
      std::memset(c.recurrent_state(l).data_ptr(), 0, c.recurrent_state(l).nbytes());
      std::memset(c.conv_state(l).data_ptr(), 0, c.conv_state(l).nbytes());
    }
  }
  // Slots past length() are free, so writing the new tokens' positions appends nothing yet.
  for (int64_t s = 0; s < num_seqs; ++s) {
    const Segment& g = segments_[s];
    std::memcpy(caches_[s]->positions().data<int64_t>() + g.start, batch.positions.data() + g.begin,
                g.n * sizeof(int64_t));
  }
  positions_ = Tensor::from_blob(const_cast<int64_t*>(batch.positions.data()), {batch.num_tokens()},
                                 DType::kI64);
  planned_ = true;
}

LinearLayerStates CpuAttentionBackend::linear_states(int64_t layer) {
  LONGCTX_CHECK(planned_, ErrorCode::kInternal, "CPU attention: linear_states before plan");
  LinearLayerStates st;
  for (KVCache* c : caches_) {
    LONGCTX_CHECK(layer >= 0 && layer < c->num_layers() && c->recurrent_state(layer).defined(),
                  ErrorCode::kInvalidArgument,
                  "CPU attention: layer {} keeps no linear-attention state in this cache", layer);
    st.recurrent.push_back(c->recurrent_state(layer));
    st.conv.push_back(c->conv_state(layer));
  }
  return st;
}

void CpuAttentionBackend::store_kv(int64_t layer, const Tensor& k, const Tensor& v) {
  LONGCTX_CHECK(planned_, ErrorCode::kInternal, "CPU attention: store_kv before plan");
  for (size_t s = 0; s < segments_.size(); ++s) {
    const Segment& g = segments_[s];
    KVCache& c = *caches_[s];
    LONGCTX_CHECK(layer >= 0 && layer < c.num_layers(), ErrorCode::kInvalidArgument,
                  "CPU attention: layer {} of a {}-layer cache", layer, c.num_layers());
    c.k(layer).slice(0, g.start, g.start + g.n).copy_from(k.slice(0, g.begin, g.begin + g.n));
    c.v(layer).slice(0, g.start, g.start + g.n).copy_from(v.slice(0, g.begin, g.begin + g.n));
  }
}

Tensor CpuAttentionBackend::attend(int64_t layer, const Tensor& q) {
  LONGCTX_CHECK(planned_, ErrorCode::kInternal, "CPU attention: attend before plan");
  const int64_t t = q.size(0);
  Tensor out = Tensor::empty(q.shape(), DType::kF32);
  for (size_t s = 0; s < segments_.size(); ++s) {
    const Segment& g = segments_[s];
    KVCache& c = *caches_[s];
    ops::AttentionArgs a;
    a.q = q.slice(0, g.begin, g.begin + g.n).contiguous();
    a.k = c.k(layer);
    a.v = c.v(layer);
    a.q_positions = positions_.slice(0, g.begin, g.begin + g.n);
    a.k_positions = c.positions();
    a.kv_len = g.start + g.n;
    a.scale = sm_scale_;
    a.window = layer < static_cast<int64_t>(layer_windows_.size()) ? layer_windows_[layer] : 0;
    a.out = out.slice(0, g.begin, g.begin + g.n);
    ops::attention(a);
  }
  return out.view({t, -1});
}

void CpuAttentionBackend::commit() {
  LONGCTX_CHECK(planned_, ErrorCode::kInternal, "CPU attention: commit before plan");
  for (size_t s = 0; s < segments_.size(); ++s) caches_[s]->advance(segments_[s].n);
  planned_ = false;
}

}  // namespace longctx
