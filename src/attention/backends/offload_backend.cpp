#include "attention/backends/offload_backend.h"

#include <algorithm>
#include <limits>

#include "attention/backends/paged_backend.h"
#include "longctx/core/error.h"
#include "longctx/core/logging.h"

namespace longctx {

OffloadAttentionBackend::OffloadAttentionBackend(const OffloadGeometry& geometry,
                                                 std::unique_ptr<OffloadDevice> device)
    : planner_(geometry), device_(std::move(device)) {
  LONGCTX_CHECK(device_ != nullptr, ErrorCode::kInvalidArgument, "KV offload: no device");
}

void OffloadAttentionBackend::set_copies(std::span<const KVBlockCopy> copies) {
  copies_.assign(copies.begin(), copies.end());
}

void OffloadAttentionBackend::plan(const ForwardBatch& batch) {
  const OffloadGeometry& g = planner_.geometry();
  planned_ = false;
  PagedBackendLimits limits;
  limits.max_tokens = std::numeric_limits<int32_t>::max();
  limits.max_seqs = std::numeric_limits<int32_t>::max();
  limits.max_blocks = std::numeric_limits<int32_t>::max();
  check_paged_batch(batch, g.block_size, g.num_host_blocks, limits);
  plan_ = planner_.plan(batch, copies_, [this](uint64_t t) { return device_->ticket_done(t); });
  std::vector<int32_t> loc;
  if (device_->sparse())
    for (int32_t host : batch.block_tables) {
      const int32_t gpu = planner_.gpu_block(host);
      loc.push_back(gpu >= 0 ? gpu : -host - 1);
    }
  sparse_step_ = device_->sparse() && device_->sparse_step(batch, loc);
  if (sparse_step_) plan_.items.clear();  // the device reads the selected host pages in place
  device_->begin_step(plan_);
  if (device_->sparse()) {
    if (!sparse_step_) loc.clear();
    device_->plan_sparse(batch, loc, copies_);
  }
  copies_.clear();
  total_loads_ = g.num_layers * static_cast<int64_t>(plan_.items.size());
  next_load_ = 0;
  next_layer_ = 0;
  while (next_load_ < std::min<int64_t>(g.num_slots, total_loads_)) issue_load(next_load_++);
  ++stats_.steps;
  stats_.blocks_reloaded += static_cast<int64_t>(plan_.loads.size());
  stats_.blocks_written_back +=
      static_cast<int64_t>(plan_.write_backs.size() + plan_.evict_write_backs.size());
  stats_.host_bytes_written +=
      static_cast<int64_t>(plan_.write_backs.size() + plan_.evict_write_backs.size()) *
      g.num_layers * layer_block_bytes_;
  stats_.host_bytes_loaded +=
      static_cast<int64_t>(plan_.loads.size()) * g.num_layers * layer_block_bytes_;
  planned_ = true;
}

XAttnStaging xattn_offload_staging(const OffloadGeometry& g, int64_t max_model_len) {
  const int64_t tokens = max_model_len > 0 ? max_model_len : g.num_host_blocks * g.block_size;
  return {std::min<int64_t>((tokens + g.block_size - 1) / g.block_size, g.num_host_blocks),
          std::min<int64_t>(2, g.num_layers), tokens};
}

void warn_xattn_staging_full() {
  LONGCTX_LOG_WARN(
      "xattention with KV offload: a step's host blocks exceed the GPU staging (one "
      "max_model_len sequence); such steps run dense attention through the ring");
}

Tensor OffloadDevice::attend_sparse(int64_t, const Tensor&) {
  LONGCTX_THROW(ErrorCode::kInternal, "KV offload: this device has no sparse policy");
}

void OffloadAttentionBackend::issue_load(int64_t g) {
  const int64_t items = static_cast<int64_t>(plan_.items.size());
  const int64_t layer = g / items, item = g % items;
  device_->load_slot(g % planner_.geometry().num_slots, layer, item, plan_.load_wait_ticket);
  const int64_t blocks = plan_.items[item].num_slot_blocks;
  stats_.ring_blocks_loaded += blocks;
  stats_.host_bytes_loaded += blocks * layer_block_bytes_;
}

void OffloadAttentionBackend::store_kv(int64_t layer, const Tensor& k, const Tensor& v) {
  LONGCTX_CHECK(planned_, ErrorCode::kInternal, "KV offload: store_kv before plan");
  device_->store_kv(layer, k, v);
}

Tensor OffloadAttentionBackend::attend(int64_t layer, const Tensor& q) {
  const OffloadGeometry& g = planner_.geometry();
  LONGCTX_CHECK(planned_ && layer == next_layer_, ErrorCode::kInternal,
                "KV offload: attend(layer {}) out of order (expected layer {})", layer,
                next_layer_);
  Tensor o;
  if (sparse_step_) {
    o = device_->attend_sparse(layer, q);
  } else {
    device_->attend_resident(layer, q);
    const int64_t items = static_cast<int64_t>(plan_.items.size());
    for (int64_t t = 0; t < items; ++t) {
      const int64_t item = layer * items + t;
      device_->attend_slot(item % g.num_slots, layer, t, q);
      if (next_load_ < total_loads_) issue_load(next_load_++);
    }
    o = device_->finish_layer(layer, q);
  }
  if (++next_layer_ == g.num_layers) {
    device_->end_step();
    planned_ = false;
  }
  return o;
}

}  // namespace longctx
