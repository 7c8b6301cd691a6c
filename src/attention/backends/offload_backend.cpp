#include "attention/backends/offload_backend.h"

#include <algorithm>
#include <limits>

#include "attention/backends/paged_backend.h"
#include "attention/backends/phase_profile.h"
#include "longctx/core/error.h"

namespace longctx {

OffloadAttentionBackend::OffloadAttentionBackend(const OffloadGeometry& geometry,
                                                 OffloadDeviceParts device)
    : planner_(geometry), device_(std::move(device.ring)), sparse_(std::move(device.sparse)) {
  LONGCTX_CHECK(device_ != nullptr, ErrorCode::kInvalidArgument, "KV offload: no device");
}

void OffloadAttentionBackend::set_window_groups(
    const KvGroups& groups, AttentionBackend& resident, int64_t window_base,
    std::function<void(std::span<const KVBlockCopy>)> copy_window_blocks) {
  LONGCTX_CHECK(
      groups.size() > 1 && groups.offloadable() && !groups.has_kind(KvGroupKind::kState) &&
          groups_ == nullptr &&
          static_cast<int64_t>(groups[0].layers.size()) == planner_.geometry().num_layers &&
          window_base == planner_.geometry().num_host_blocks && copy_window_blocks,
      ErrorCode::kInvalidArgument,
      "KV offload over KV groups needs one full group of {} layers, then sliding "
      "groups, and the window pool's ids after the host pool's {} blocks (got {}; "
      "window ids from {})",
      planner_.geometry().num_layers, planner_.geometry().num_host_blocks, groups.summary(),
      window_base);
  groups_ = &groups;
  resident_ = &resident;
  window_base_ = window_base;
  copy_window_blocks_ = std::move(copy_window_blocks);
}

void OffloadAttentionBackend::set_state_groups(const KvGroups& groups, StatePool& states) {
  LONGCTX_CHECK(
      groups.size() > 1 && groups.offloadable() && groups.has_kind(KvGroupKind::kState) &&
          groups_ == nullptr &&
          static_cast<int64_t>(groups[0].layers.size()) == planner_.geometry().num_layers,
      ErrorCode::kInvalidArgument,
      "KV offload over state groups needs one full group of {} layers, then linear-attention "
      "state groups (got {})",
      planner_.geometry().num_layers, groups.summary());
  groups_ = &groups;
  states_ = &states;
}

void OffloadAttentionBackend::set_copies(std::span<const KVBlockCopy> copies) {
  copies_.clear();
  std::vector<KVBlockCopy> window;
  for (const KVBlockCopy& c : copies) {
    if (groups_ != nullptr && c.src >= window_base_) {
      LONGCTX_CHECK(c.dst >= window_base_, ErrorCode::kInternal,
                    "KV offload: a copy from window block {} to host block {}", c.src, c.dst);
      window.push_back(
          {static_cast<int32_t>(c.src - window_base_), static_cast<int32_t>(c.dst - window_base_)});
    } else {
      copies_.push_back(c);
    }
  }
  // Copy-on-write runs before the step reads anything; the resident pool needs no planning.
  if (!window.empty()) copy_window_blocks_(window);
}

std::function<void()> OffloadAttentionBackend::import_block(int32_t host,
                                                            std::span<const std::byte> bytes) {
  check_block_bytes(bytes.size());
  const uint64_t wait = planner_.import_host(host);
  return device_->import_block(host, bytes, wait);
}

std::function<void()> OffloadAttentionBackend::export_block(int32_t host,
                                                            std::span<std::byte> out) {
  check_block_bytes(out.size());
  const int32_t gpu = planner_.full_gpu_block(host);
  const uint64_t ticket = gpu >= 0 ? planner_.note_export(gpu) : 0;
  return device_->export_block(host, gpu, ticket, out, planner_.host_ticket(host));
}

void OffloadAttentionBackend::check_block_bytes(size_t bytes) const {
  const int64_t want = layer_block_bytes_ * planner_.geometry().num_layers;
  LONGCTX_CHECK(want > 0 && static_cast<int64_t>(bytes) == want, ErrorCode::kInternal,
                "KV offload: a block's bytes are {} ({} layers of {}), got {}", want,
                planner_.geometry().num_layers, layer_block_bytes_, bytes);
}

int64_t OffloadAttentionBackend::offload_layer(int64_t layer) const {
  if (groups_ == nullptr) return layer;
  LONGCTX_CHECK(layer >= 0 && layer < groups_->num_layers(), ErrorCode::kInvalidArgument,
                "KV offload: layer {} of a model of {} layers", layer, groups_->num_layers());
  return groups_->group_of(layer) == 0 ? groups_->pool_layer(layer) : -1;
}

void OffloadAttentionBackend::make_window_batch(const ForwardBatch& batch) {
  LONGCTX_CHECK(batch.num_groups() == groups_->size(), ErrorCode::kInvalidArgument,
                "KV offload: the batch has tables of {} KV groups, the model {}",
                batch.num_groups(), groups_->size());
  ForwardBatch& w = window_batch_;
  w.input_ids = batch.input_ids;
  w.positions = batch.positions;
  w.qo_indptr = batch.qo_indptr;
  w.kv_lens = batch.kv_lens;
  w.logits_indices = batch.logits_indices;
  w.seq_ids = batch.seq_ids;
  w.fixed_launch_shapes = batch.fixed_launch_shapes;
  w.num_padding_seqs = batch.num_padding_seqs;
  w.group_tables.resize(groups_->size() - 2);
  const int64_t bs = planner_.geometry().block_size, slot_base = window_base_ * bs;
  for (int64_t g = 1; g < groups_->size(); ++g) {
    const BlockTablesView v = batch.tables(g);
    std::vector<int32_t>& indptr =
        g == 1 ? w.block_table_indptr : w.group_tables[g - 2].block_table_indptr;
    std::vector<int32_t>& tables = g == 1 ? w.block_tables : w.group_tables[g - 2].block_tables;
    std::vector<int64_t>& slots = g == 1 ? w.slot_mapping : w.group_tables[g - 2].slot_mapping;
    indptr.assign(v.block_table_indptr.begin(), v.block_table_indptr.end());
    // Window ids to the resident pool's; a dropped entry (kNoBlock, -1) stays. The resident
    // backend checks the rest (inside its pool, slots equal to the tables').
    tables.resize(v.block_tables.size());
    for (size_t i = 0; i < tables.size(); ++i) {
      const int32_t id = v.block_tables[i];
      LONGCTX_CHECK(id < 0 || id >= window_base_, ErrorCode::kInvalidArgument,
                    "KV offload: sliding KV group {} names host block {} (its blocks come from "
                    "the window pool, ids from {})",
                    g, id, window_base_);
      tables[i] = id < 0 ? id : static_cast<int32_t>(id - window_base_);
    }
    slots.resize(v.slot_mapping.size());
    for (size_t i = 0; i < slots.size(); ++i) slots[i] = v.slot_mapping[i] - slot_base;
  }
}

void OffloadAttentionBackend::plan(const ForwardBatch& batch) {
  const OffloadGeometry& g = planner_.geometry();
  LONGCTX_CHECK(!step_open_, ErrorCode::kInternal,
                "KV offload: a plan before the last graph-shaped step ended (end_graph_step)");
  LONGCTX_CHECK(!batch.fixed_launch_shapes || (groups_ == nullptr && sparse_ != nullptr),
                ErrorCode::kUnsupported,
                "KV offload: graph-shaped steps (CUDA graphs) need a one-group model and a decode "
                "policy (quest)");
  planned_ = false;
  batch_ = nullptr;
  if (resident_ != nullptr) {
    // The resident groups first: their checks throw before the planner changes anything.
    make_window_batch(batch);
    resident_->plan(window_batch_);
  }
  if (states_ != nullptr)  // the full group's tables in host ids, a state group's in slots
    check_group_batch(batch, *groups_, g.block_size, g.num_host_blocks, states_->num_slots());
  PagedBackendLimits limits;
  limits.max_tokens = std::numeric_limits<int32_t>::max();
  limits.max_seqs = std::numeric_limits<int32_t>::max();
  limits.max_blocks = std::numeric_limits<int32_t>::max();
  check_paged_batch(batch, g.block_size, g.num_host_blocks, limits);
  plan_ = planner_.plan(batch, copies_, [this](uint64_t t) { return device_->ticket_done(t); });
  // The sparse reader is asked where the planner put the step's blocks, before anything loads.
  std::vector<int32_t> loc;
  if (sparse_ != nullptr)
    for (int32_t host : batch.block_tables) {
      const int32_t gpu = planner_.gpu_block(host);
      loc.push_back(gpu >= 0 ? gpu : -host - 1);
    }
  sparse_step_ = sparse_ != nullptr && sparse_->takes_step(batch, loc);
  graph_step_ = batch.fixed_launch_shapes;
  // (The engine graphs decode steps only, which a decode policy's reader always takes.)
  LONGCTX_CHECK(!graph_step_ || sparse_step_, ErrorCode::kInternal,
                "KV offload: a graph-shaped step the sparse reader does not take");
  if (sparse_step_) plan_.items.clear();  // the reader reads the host blocks it needs itself
  device_->begin_step(plan_);
  if (recorder_ != nullptr) recorder_->mark(AttentionPhase::kPlanOffload);
  if (sparse_ != nullptr) {
    if (!sparse_step_) loc.clear();
    sparse_->plan(batch, plan_, loc, copies_);
    if (recorder_ != nullptr) recorder_->mark(AttentionPhase::kPlanSparse);
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
  // A graph-shaped step's write-backs are not the graph's: end_graph_step issues them after the
  // forward, which a replay runs without calling attend() here.
  step_open_ = graph_step_;
  if (states_ != nullptr) {
    reset_new_sequence_states(batch, groups_, states_);
    batch_ = &batch;
  }
}

LinearLayerStates OffloadAttentionBackend::linear_states(int64_t layer) {
  LONGCTX_CHECK(batch_ != nullptr, ErrorCode::kInvalidArgument,
                "KV offload: linear_states before plan, or a model without state groups");
  return paged_linear_states(*batch_, groups_, states_, layer, "KV offload");
}

void OffloadAttentionBackend::set_phase_recorder(PhaseRecorder* recorder) {
  recorder_ = recorder;
  if (sparse_ != nullptr) sparse_->set_phase_recorder(recorder);
}

void OffloadAttentionBackend::issue_load(int64_t g) {
  const int64_t items = static_cast<int64_t>(plan_.items.size());
  const int64_t layer = g / items, item = g % items;
  device_->load_slot(g % planner_.geometry().num_slots, layer, item, plan_.load_wait_ticket);
  const int64_t blocks = plan_.items[item].num_slot_blocks;
  stats_.ring_blocks_loaded += blocks;
  stats_.host_bytes_loaded += blocks * layer_block_bytes_;
}

void OffloadAttentionBackend::store_kv(int64_t model_layer, const Tensor& k, const Tensor& v) {
  // (A sliding layer after the last full one comes after the offload step ended.)
  const int64_t layer = offload_layer(model_layer);
  if (layer < 0) {
    LONGCTX_CHECK(resident_ != nullptr, ErrorCode::kInvalidArgument,
                  "KV offload: layer {} keeps a linear-attention state, not K/V", model_layer);
    resident_->store_kv(model_layer, k, v);
    return;
  }
  LONGCTX_CHECK(planned_, ErrorCode::kInternal, "KV offload: store_kv before plan");
  device_->store_kv(layer, k, v);
  if (sparse_ != nullptr) sparse_->on_keys_stored(layer, k);
}

Tensor OffloadAttentionBackend::attend(int64_t model_layer, const Tensor& q) {
  const OffloadGeometry& g = planner_.geometry();
  const int64_t layer = offload_layer(model_layer);
  if (layer < 0) {
    LONGCTX_CHECK(resident_ != nullptr, ErrorCode::kInvalidArgument,
                  "KV offload: layer {} keeps a linear-attention state, not K/V", model_layer);
    return resident_->attend(model_layer, q);
  }
  LONGCTX_CHECK(planned_ && layer == next_layer_, ErrorCode::kInternal,
                "KV offload: attend(layer {}) out of order (expected layer {})", layer,
                next_layer_);
  Tensor o;
  if (sparse_step_) {
    o = sparse_->attend(layer, q);
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
    if (!graph_step_) device_->end_step();  // a graph's step ends in end_graph_step
    planned_ = false;
  }
  return o;
}

void OffloadAttentionBackend::begin_graph_capture() {
  if (sparse_ != nullptr) sparse_->begin_graph_capture();
}

std::unique_ptr<GraphLaunches> OffloadAttentionBackend::end_graph_capture() {
  return sparse_ != nullptr ? sparse_->end_graph_capture() : nullptr;
}

void OffloadAttentionBackend::end_graph_step() {
  if (!step_open_) return;
  step_open_ = false;
  device_->end_step();
}

}  // namespace longctx
