#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "attention/backends/decode_graph_nodes.h"
#include "attention/backends/paged_backend.h"
#include "attention/backends/paged_dispatch_cuda.h"
#include "attention/sparse/sparse_policy_cuda.h"
#include "core/cuda_stream.h"
#include "kernels/cuda/kv_store.h"
#include "longctx/core/cuda_check.h"
#include "longctx/core/error.h"
#include "longctx/core/stream.h"

namespace longctx {

namespace {

using kernels::KvStoreParams;
using kernels::MaskMode;
using kernels::PagedPrefillParams;

// Offsets (in int32 words) of one KV group's index arrays inside the one staging buffer (groups
// follow each other from `base`).
struct IndexLayout {
  int64_t qo_indptr = 0, kv_indptr = 0, kv_indices = 0, last_page_len = 0, slots = 0, total = 0;
  IndexLayout(int64_t max_tokens, int64_t max_seqs, int64_t max_blocks, int64_t base = 0) {
    auto align = [](int64_t x) { return (x + 3) / 4 * 4; };  // 16-byte aligned arrays
    qo_indptr = base;
    kv_indptr = align(qo_indptr + max_seqs + 1);
    kv_indices = align(kv_indptr + max_seqs + 1);
    last_page_len = align(kv_indices + max_blocks);
    slots = align(last_page_len + max_seqs);  // int64 slots: 2 words each
    total = slots + 2 * max_tokens;
  }
};

// One KV group's step: where its index arrays sit, its window and its kernel's plan.
struct GroupStep {
  IndexLayout layout;
  int window = 0;            // keys a query sees (0: all)
  size_t workspace_off = 0;  // its part of the workspace (bytes)
  PagedCallPlan call;
  PagedPrefillParams params;  // index arrays and shape; q, o and the caches set per layer
};

class PagedAttentionBackend final : public AttentionBackend {
 public:
  PagedAttentionBackend(const PagedKVPool& pool, int64_t num_qo_heads, float sm_scale,
                        const PagedBackendLimits& limits, const SparseOptions& sparse,
                        const kernels::KernelTuning& tuning, const KvGroups* groups,
                        StatePool* states)
      : pool_(pool),
        device_(pool.config().device),
        num_qo_heads_(static_cast<int>(num_qo_heads)),
        sm_scale_(sm_scale),
        limits_(limits),
        states_(states),
        done_(device_) {
    const PagedKVPoolConfig& c = pool.config();
    if (groups != nullptr && !groups->single_full()) groups_ = *groups;
    const bool has_state = groups_ && groups_->has_kind(KvGroupKind::kState);
    LONGCTX_CHECK(!groups_ || groups_->pool_layers() == c.num_layers, ErrorCode::kInvalidArgument,
                  "paged attention over KV groups ({}) needs a pool of {} layers (has {})",
                  groups_ ? groups_->summary() : "", groups_ ? groups_->pool_layers() : 0,
                  c.num_layers);
    LONGCTX_CHECK(!has_state || (states_ != nullptr && states_->device() == c.device),
                  ErrorCode::kInvalidArgument,
                  "paged attention over KV groups ({}) with a per-sequence state group needs a "
                  "state pool on {}",
                  groups_ ? groups_->summary() : "", c.device.str());
    if (!has_state) states_ = nullptr;
    if (states_ != nullptr) {
      // Each linear-attention layer's recurrent and conv pointer arrays, [2 * layer + kind][S]
      // for a step of S sequences: fixed addresses for a batch size (what a graph replays).
      state_layer_.assign(groups_->num_layers(), -1);
      int64_t n = 0;
      for (int64_t i = 0; i < groups_->num_layers(); ++i)
        if ((*groups_)[groups_->group_of(i)].kind == KvGroupKind::kState) state_layer_[i] = n++;
      num_state_layers_ = n;
      state_ptrs_host_ = Tensor::empty_pinned({2 * n * limits.max_seqs}, DType::kI64);
      state_ptrs_ = Tensor::empty({2 * n * limits.max_seqs}, DType::kI64, c.device);
    }
    // The paged groups come first (KvGroups' order): steps_[g] is group g's for g < their count.
    int64_t num_groups = groups_ ? groups_->size() : 1;
    while (groups_ && num_groups > 0 && (*groups_)[num_groups - 1].kind == KvGroupKind::kState)
      --num_groups;
    for (int64_t g = 0; g < num_groups; ++g)
      LONGCTX_CHECK(!groups_ || (*groups_)[g].kind != KvGroupKind::kState,
                    ErrorCode::kInvalidArgument,
                    "paged attention: KV groups ({}) list a state group before a paged one",
                    groups_->summary());
    LONGCTX_CHECK(num_groups > 0, ErrorCode::kUnsupported,
                  "paged attention: no paged KV group ({})", groups_ ? groups_->summary() : "");
    for (int64_t g = 0, base = 0; g < num_groups; ++g) {
      GroupStep st{IndexLayout(limits.max_tokens, limits.max_seqs, limits.max_blocks, base)};
      st.window = groups_ ? static_cast<int>((*groups_)[g].window) : 0;
      base = (st.layout.total + 3) / 4 * 4;
      steps_.push_back(st);
    }
    LONGCTX_CHECK(device_.is_cuda(), ErrorCode::kUnsupported,
                  "paged attention: the KV pool is on {}, not a CUDA device", device_.str());
    LONGCTX_CHECK(limits.max_tokens > 0 && limits.max_seqs > 0 && limits.max_blocks > 0,
                  ErrorCode::kInvalidArgument, "paged attention: limits must be positive");
    LONGCTX_CHECK(num_qo_heads % c.num_kv_heads == 0, ErrorCode::kUnsupported,
                  "paged attention: {} q heads are not a multiple of {} kv heads", num_qo_heads,
                  c.num_kv_heads);
    PagedShape shape;
    shape.num_qo_heads = num_qo_heads_;
    shape.num_kv_heads = static_cast<int>(c.num_kv_heads);
    shape.head_dim = static_cast<int>(c.head_dim);
    shape.page_size = static_cast<int>(c.block_size);
    shape.dtype = c.compute_dtype();
    if (c.fp8()) shape.kv_format = kernels::KvCacheFormat::kFp8E4M3;
    shape.sm_scale = sm_scale;
    dispatch_.emplace(shape, tuning, device_.index);
    const int64_t words = steps_.back().layout.total;
    host_ = Tensor::empty_pinned({words}, DType::kI32);
    indices_ = Tensor::empty({words}, DType::kI32, device_);
    // The planned kernels' workspaces (none for the generic kernel), one per group (their plans
    // live through the step); the dense prefill with room for the stream-K split (short chunks
    // over long histories; a windowed group's prefill takes none).
    const int max_seqs = static_cast<int>(limits.max_seqs);
    prefill_list_bytes_ = dispatch_->prefill_workspace_bytes(max_seqs, limits.max_tokens, false);
    prefill_ws_bytes_ = dispatch_->prefill_workspace_bytes(max_seqs, limits.max_tokens, true);
    decode_ws_bytes_ = dispatch_->decode_workspace_bytes(max_seqs);
    // (At least a little: the generic kernel's steps take none.)
    const size_t per_group =
        (std::max({prefill_ws_bytes_, decode_ws_bytes_, size_t(256)}) + 255) / 256 * 256;
    for (size_t g = 0; g < steps_.size(); ++g) steps_[g].workspace_off = g * per_group;
    workspace_ =
        Tensor::empty({static_cast<int64_t>(per_group * steps_.size())}, DType::kU8, device_);
    // FP8: the staging pool of the prefill calls (one call's pages are at most max_blocks; the
    // groups' calls run in stream order and share it). Counted by the memory plan's workspaces.
    if (const size_t stage = dispatch_->fp8_stage_bytes(limits.max_blocks); stage > 0)
      stage_ = Tensor::empty({static_cast<int64_t>(stage)}, DType::kU8, device_);
    sparse.validate();
    const int64_t max_seq_len =
        limits.max_seq_len > 0 ? limits.max_seq_len : c.num_blocks * c.block_size;
    // The policy's CUDA twin, from the registry (nullptr for full).
    sparse::SparseCudaConfig sc;
    sc.options = sparse;
    sc.num_layers = c.num_layers;
    sc.num_blocks = c.num_blocks;
    sc.block_size = c.block_size;
    sc.num_qo_heads = num_qo_heads;
    sc.num_kv_heads = c.num_kv_heads;
    sc.head_dim = c.head_dim;
    sc.dtype = c.compute_dtype();
    if (c.fp8()) sc.kv_format = kernels::KvCacheFormat::kFp8E4M3;
    sc.sm_scale = sm_scale;
    sc.device = device_;
    sc.max_tokens = limits.max_tokens;
    sc.max_seqs = limits.max_seqs;
    sc.max_seq_len = max_seq_len;
    sc.tuning = tuning;
    if (sparse::selects(sparse, sparse::Phase::kPrefill))
      LONGCTX_CHECK(dispatch_->planned_kernels().prefill && c.head_dim <= 128,
                    ErrorCode::kUnsupported,
                    "--sparse-policy {} on the GPU: head_dim {} (the block-sparse prefill takes 64 "
                    "and 128)",
                    sparse_policy_name(sparse.policy), c.head_dim);
    LONGCTX_CHECK(!c.fp8() || sparse::policy_def(sparse.policy).reads_fp8, ErrorCode::kUnsupported,
                  "--sparse-policy {} on the GPU reads a 16-bit KV cache; run it with "
                  "--kv-cache-dtype bf16 (FP8 runs dense and with quest)",
                  sparse_policy_name(sparse.policy));
    sparse_ = sparse::make_sparse_policy_cuda(sc);
    sparse_decodes_ = sparse::selects(sparse, sparse::Phase::kDecode);
    sparse_graphs_ = sparse::policy_def(sparse.policy).decode_graphs;
    LONGCTX_CHECK(!groups_ || sparse_ == nullptr, ErrorCode::kUnsupported,
                  "--sparse-policy {} on the GPU runs models of one full-attention KV group; this "
                  "one has {} ({})",
                  sparse_policy_name(sparse.policy), groups_ ? groups_->size() : 1,
                  groups_ ? groups_->summary() : "");
  }

  void copy_blocks(std::span<const KVBlockCopy> copies) override {
    if (sparse_ != nullptr) sparse_->copy_blocks(copies, current_cuda_stream(device_.index));
  }

  void plan(const ForwardBatch& batch) override {
    const PagedKVPoolConfig& c = pool_.config();
    if (groups_) {
      check_group_batch(batch, *groups_, c.block_size, c.num_blocks,
                        states_ != nullptr ? states_->num_slots() : 0);
      check_paged_limits(batch, limits_);
    } else {
      check_paged_batch(batch, c.block_size, c.num_blocks, limits_);
    }
    done_.synchronize();  // the previous step's copy out of the staging buffer has finished
    const int64_t s = batch.num_seqs(), t = batch.num_tokens();
    bool all_decode = true;
    for (int64_t q = 0; q < s; ++q) all_decode = all_decode && batch.q_len(q) == 1;
    cudaStream_t stream = current_cuda_stream(device_.index);
    for (size_t g = 0; g < steps_.size(); ++g) stage_group(batch, steps_[g], batch.tables(g));
    reset_new_states(batch);
    const size_t used_bytes = (steps_.back().layout.slots + 2 * t) * sizeof(int32_t);
    LONGCTX_CUDA_CHECK(cudaMemcpyAsync(indices_.data_ptr(), host_.data_ptr(), used_bytes,
                                       cudaMemcpyHostToDevice, stream));
    if (states_ != nullptr) stage_states(batch, stream);
    done_.record_on(stream);

    num_seqs_ = static_cast<int>(s);
    num_tokens_ = static_cast<int>(t);
    sparse_prefill_ = false;
    for (GroupStep& st : steps_) {
      PagedPrefillParams& p = st.params;
      p = PagedPrefillParams{};
      p.qo_indptr = dev(st.layout.qo_indptr);
      p.kv_indptr = dev(st.layout.kv_indptr);
      p.kv_indices = dev(st.layout.kv_indices);
      p.kv_last_page_len = dev(st.layout.last_page_len);
      p.batch_size = num_seqs_;
      p.num_qo_heads = num_qo_heads_;
      p.num_kv_heads = static_cast<int>(c.num_kv_heads);
      p.head_dim = static_cast<int>(c.head_dim);
      p.page_size = static_cast<int>(c.block_size);
      p.dtype = c.compute_dtype();
      if (c.fp8()) p.kv_format = kernels::KvCacheFormat::kFp8E4M3;
      p.mask_mode = MaskMode::kCausal;
      p.window = st.window;
      p.sm_scale = sm_scale_;
      // q, o and the caches are set per layer in attend().
    }
    GroupStep& st0 = steps_[0];
    // A decode policy: decode steps read the selected pages only (graph-shaped batches too when
    // the policy's decode replays in graphs, else dense); a prefill policy: steps with a prefill
    // get its block mask.
    const bool sparse_decode =
        sparse_decodes_ && all_decode && (!batch.fixed_launch_shapes || sparse_graphs_);
    const bool sparse_selects =
        sparse_ != nullptr &&
        sparse_->plan(batch, batch.slot_mapping,
                      sparse_decode ? std::span<const int32_t>(batch.block_tables)
                                    : std::span<const int32_t>(),
                      stream);
    sparse_decode_ = sparse_decode;
    if (sparse_decode) {
      st0.call = PagedCallPlan{};
      planned_ = true;
      return;
    }
    size_t ws_bytes = decode_ws_bytes_;
    // Every group's call is causal: the window does not change the choice.
    PagedCallQueries queries =
        paged_call_queries(batch.qo_indptr.data(), num_seqs_, MaskMode::kCausal, /*window=*/0);
    queries.block_sparse = sparse_selects;
    const PagedKernel kernel = dispatch_->kernel_for(queries);
    // The prefill plan's grid follows the query lengths, and CUDA graphs are captured for
    // decode steps only (a verify step's decode plan has other workspace addresses).
    const bool step_shaped =
        kernel == PagedKernel::kGeneric || (kernel == PagedKernel::kDecode && all_decode);
    LONGCTX_CHECK(!batch.fixed_launch_shapes || step_shaped, ErrorCode::kUnsupported,
                  "paged attention: fixed launch shapes (CUDA graphs) need a decode-only batch "
                  "(every sequence one new token)");
    if (kernel == PagedKernel::kPrefill) {
      sparse_prefill_ = sparse_selects;
      // The block-sparse prefill gets no split (the list's room only): the plan's costs are the
      // dense ones, and the offloaded XAttention prefill, which has none, stays bit-identical.
      ws_bytes = sparse_prefill_ ? prefill_list_bytes_ : prefill_ws_bytes_;
    }
    const int32_t* h = host_.data<int32_t>();
    for (GroupStep& st : steps_) {
      PagedCallInput in;
      in.qo_indptr = batch.qo_indptr.data();
      in.kv_indptr = h + st.layout.kv_indptr;
      in.last_page_len = h + st.layout.last_page_len;
      in.kv_lens = kv_lens_.data() + (&st - steps_.data()) * s;
      in.batch = num_seqs_;
      in.mask = MaskMode::kCausal;
      in.block_sparse = sparse_selects;
      in.num_padding = batch.num_padding_seqs;
      in.window = st.window;
      if (stage_.defined()) {
        in.fp8_stage = stage_.data_ptr();
        in.fp8_stage_bytes = static_cast<size_t>(stage_.numel());
      }
      st.call = dispatch_->plan(in, static_cast<uint8_t*>(workspace_.data_ptr()) + st.workspace_off,
                                ws_bytes, stream);
    }
    planned_ = true;
  }

  // The device form only: a graph's capture plans a batch that is gone by the time its layers
  // run, so nothing here reads the planned batch.
  LinearLayerStates linear_states(int64_t layer) override {
    LONGCTX_CHECK(planned_, ErrorCode::kInternal, "paged attention: linear_states before plan");
    LONGCTX_CHECK(states_ != nullptr && layer >= 0 &&
                      layer < static_cast<int64_t>(state_layer_.size()) && state_layer_[layer] >= 0,
                  ErrorCode::kInvalidArgument, "paged attention: layer {} keeps no state", layer);
    const auto* ptrs = reinterpret_cast<float* const*>(state_ptrs_.data_ptr());
    const int64_t s = num_seqs_;
    LinearLayerStates st;
    st.device_qo_indptr = dev(steps_[0].layout.qo_indptr);
    st.device_recurrent = ptrs + 2 * state_layer_[layer] * s;
    st.device_conv = ptrs + (2 * state_layer_[layer] + 1) * s;
    st.num_seqs = s;
    return st;
  }

  SparsePrefillCounters sparse_prefill_counters() const override {
    return sparse_ != nullptr ? sparse_->prefill_counters() : SparsePrefillCounters{};
  }
  void set_phase_recorder(PhaseRecorder* recorder) {
    if (sparse_ != nullptr) sparse_->set_phase_recorder(recorder);
  }

  // CTAs of group g's split-KV decode kernel grid in the last plan(); 0 when it takes another
  // kernel.
  // (A decode policy's step: its compact decode's, one group.)
  int64_t decode_grid(size_t g) const {
    if (!planned_) return 0;
    if (sparse_decode_) return sparse_->decode_grid();
    return PagedDispatcher::decode_grid(steps_[g].call);
  }
  size_t num_groups() const { return steps_.size(); }

  void begin_graph_capture() override { decode_nodes_.clear(); }
  std::unique_ptr<GraphLaunches> end_graph_capture() override;

  void store_kv(int64_t layer, const Tensor& k, const Tensor& v) override {
    check_layer_input("store_kv", layer, k);
    check_layer_input("store_kv", layer, v);
    const PagedKVPoolConfig& c = pool_.config();
    KvStoreParams p;
    p.k = k.data_ptr();
    p.v = v.data_ptr();
    p.k_token_stride = k.strides()[0];
    p.v_token_stride = v.strides()[0];
    const int64_t pl = pool_layer(layer);
    p.k_cache = pool_.k(pl).data_ptr();
    p.v_cache = pool_.v(pl).data_ptr();
    p.slot_mapping = reinterpret_cast<const int64_t*>(dev(step_of(layer).layout.slots));
    // plan() checked every slot against the block tables, so kv_store's device-side range flag
    // (error_flag) is not needed.
    p.num_tokens = num_tokens_;
    p.num_kv_heads = static_cast<int>(c.num_kv_heads);
    p.head_dim = static_cast<int>(c.head_dim);
    p.page_size = static_cast<int>(c.block_size);
    p.num_pages = static_cast<int>(c.num_blocks);
    p.dtype = c.compute_dtype();
    if (c.fp8()) {
      p.kv_format = kernels::KvCacheFormat::kFp8E4M3;
      p.k_scale = pool_.k_scale(pl).data<float>();
      p.v_scale = pool_.v_scale(pl).data<float>();
    }
    kernels::cuda::kv_store_run(p, current_cuda_stream(device_.index));
    if (sparse_ != nullptr)  // (one full group: pool layer = layer)
      sparse_->on_keys_stored(layer, page_memory(layer), current_cuda_stream(device_.index));
  }

  Tensor attend(int64_t layer, const Tensor& q) override {
    check_layer_input("attend", layer, q);
    // q is a view of the fused QKV output: the decode kernel reads it in place (rows
    // q_token_stride apart); the other kernels read a contiguous [T, H, d] copy.
    const GroupStep& st = step_of(layer);
    const bool decode = !sparse_decode_ && st.call.kernel == PagedKernel::kDecode;
    Tensor qc = decode ? q : q.contiguous();
    Tensor o = Tensor::empty(q.shape(), q.dtype(), device_);
    cudaStream_t stream = current_cuda_stream(device_.index);
    if (sparse_decode_) {
      const sparse::PageMemory mem[2] = {page_memory(layer), {}};
      sparse_->attend_decode(layer, qc.data_ptr(), o.data_ptr(), nullptr, mem, stream);
      if (sparse_->decode_grid() > 0) decode_nodes_.note(stream, 0);  // its last launch
    } else {
      PagedPrefillParams p = st.params;
      p.q = qc.data_ptr();
      p.k_cache = pool_.k(pool_layer(layer)).data_ptr();
      p.v_cache = pool_.v(pool_layer(layer)).data_ptr();
      if (p.kv_format == kernels::KvCacheFormat::kFp8E4M3) {
        p.k_scale = pool_.k_scale(pool_layer(layer)).data<float>();
        p.v_scale = pool_.v_scale(pool_layer(layer)).data<float>();
      }
      p.o = o.data_ptr();
      if (st.call.kernel == PagedKernel::kPrefill && sparse_prefill_)
        sparse_->select_prefill(p, stream);  // the block mask of this layer
      dispatch_->run(st.call, p, decode && qc.size(0) > 1 ? qc.strides()[0] : 0, stream);
      if (decode) decode_nodes_.note(stream, &st - steps_.data());
    }
    return o.view({q.size(0), -1});
  }

 private:
  const int32_t* dev(int64_t offset) const { return indices_.data<int32_t>() + offset; }

  // The pool's layer as a sparse policy reads it (one full group: pool layer = layer); FP8: the
  // scales [blocks, Hkv] beside the codes.
  sparse::PageMemory page_memory(int64_t layer) const {
    const PagedKVPoolConfig& c = pool_.config();
    sparse::PageMemory m{pool_.k(layer).data_ptr(), pool_.v(layer).data_ptr(),
                         c.block_size * c.num_kv_heads * c.head_dim};
    if (c.fp8()) {
      m.k_scale = pool_.k_scale(layer).data<float>();
      m.v_scale = pool_.v_scale(layer).data<float>();
      m.scale_block_stride = c.num_kv_heads;
    }
    return m;
  }

  const GroupStep& step_of(int64_t layer) const {
    return steps_[groups_ ? groups_->group_of(layer) : 0];
  }
  int64_t pool_layer(int64_t layer) const { return groups_ ? groups_->pool_layer(layer) : layer; }
  int64_t num_layers() const { return groups_ ? groups_->num_layers() : pool_.config().num_layers; }

  // Stages group `st`'s index arrays for the step: its tables trimmed, under a window, to start
  // at the block of the first key the first new token's window holds (kernels then see keys and
  // queries shifted alike: PagedPrefillParams::window), its kv lengths (kv_lens_) and slots.
  void stage_group(const ForwardBatch& batch, const GroupStep& st, const BlockTablesView& tables) {
    const int64_t s = batch.num_seqs(), t = batch.num_tokens();
    const int64_t bs = pool_.config().block_size, g = &st - steps_.data();
    int32_t* h = host_.data<int32_t>();
    const IndexLayout& l = st.layout;
    kv_lens_.resize(steps_.size() * s);
    std::memcpy(h + l.qo_indptr, batch.qo_indptr.data(), (s + 1) * sizeof(int32_t));
    int32_t n = 0;
    h[l.kv_indptr] = 0;
    for (int64_t q = 0; q < s; ++q) {
      const int32_t kv = batch.kv_lens[q];
      const int64_t first = kv - batch.q_len(q);
      const int64_t skip =
          st.window > 0 ? std::max<int64_t>(0, first - st.window + 1) / bs : 0;  // blocks
      const int32_t b0 = tables.block_table_indptr[q] + static_cast<int32_t>(skip);
      const int32_t b1 = tables.block_table_indptr[q + 1];
      std::memcpy(h + l.kv_indices + n, tables.block_tables.data() + b0,
                  (b1 - b0) * sizeof(int32_t));
      n += b1 - b0;
      h[l.kv_indptr + q + 1] = n;
      h[l.last_page_len + q] = kv == 0 ? 0 : (kv - 1) % int32_t(bs) + 1;
      kv_lens_[g * s + q] = static_cast<int32_t>(kv - skip * bs);
    }
    std::memcpy(h + l.slots, tables.slot_mapping.data(), t * sizeof(int64_t));
  }

  // Enqueued on the current stream (reset_new_sequence_states, paged_backend.h).
  void reset_new_states(const ForwardBatch& batch) {
    reset_new_sequence_states(batch, groups_ ? &*groups_ : nullptr, states_);
  }

  // Every linear-attention layer's state pointers of the step's sequences into their device
  // arrays, one copy (queued before done_ is recorded: the next plan() waits for it).
  void stage_states(const ForwardBatch& batch, cudaStream_t stream) {
    const int64_t s = batch.num_seqs();
    auto* h = reinterpret_cast<float**>(state_ptrs_host_.data_ptr());
    for (int64_t i = 0; i < static_cast<int64_t>(state_layer_.size()); ++i) {
      const int64_t k = state_layer_[i];
      if (k < 0) continue;
      const BlockTablesView t = batch.tables(groups_->group_of(i));
      const int64_t j = groups_->pool_layer(i);
      for (int64_t q = 0; q < s; ++q) {
        h[2 * k * s + q] = states_->recurrent_data(t.block_tables[q], j);
        h[(2 * k + 1) * s + q] = states_->conv_data(t.block_tables[q], j);
      }
    }
    LONGCTX_CUDA_CHECK(cudaMemcpyAsync(state_ptrs_.data_ptr(), h,
                                       2 * num_state_layers_ * s * sizeof(float*),
                                       cudaMemcpyHostToDevice, stream));
  }

  void check_layer_input(const char* what, int64_t layer, const Tensor& x) const {
    const PagedKVPoolConfig& c = pool_.config();
    LONGCTX_CHECK(planned_, ErrorCode::kInternal, "paged attention: {} before plan", what);
    LONGCTX_CHECK(layer >= 0 && layer < num_layers(), ErrorCode::kInvalidArgument,
                  "paged attention: layer {} of {}", layer, num_layers());
    LONGCTX_CHECK(x.device() == device_ && x.dtype() == c.compute_dtype() && x.rank() == 3 &&
                      x.size(0) == num_tokens_ && x.size(2) == c.head_dim && x.strides()[2] == 1 &&
                      x.strides()[1] == c.head_dim,
                  ErrorCode::kInvalidArgument,
                  "paged attention: {} got {} (strides {}, {}), expected [{}, H, {}] {} rows of "
                  "contiguous heads on {}",
                  what, x.str(), x.strides()[0], x.strides()[1], num_tokens_, c.head_dim,
                  dtype_name(c.compute_dtype()), device_.str());
  }

  const PagedKVPool& pool_;
  Device device_;
  int num_qo_heads_;
  float sm_scale_;
  PagedBackendLimits limits_;
  StatePool* states_ = nullptr;       // the state groups' slots (null: no state group)
  std::vector<int64_t> state_layer_;  // [layers] ordinal among linear-attention layers, or -1
  int64_t num_state_layers_ = 0;
  Tensor state_ptrs_host_;  // [2 * state layers * max_seqs] pinned staging of the state pointers
  Tensor state_ptrs_;       // their device copy (linear_states hands views of it)
  std::optional<KvGroups> groups_;  // several KV groups (none: one full group)
  std::vector<GroupStep> steps_;    // [groups] (one without groups_)
  std::vector<int32_t> kv_lens_;    // [groups, S] each group's kv lengths (trimmed tables)
  Tensor host_;                     // [words] i32 pinned staging of every group's index arrays
  Tensor indices_;                  // [words] i32 their device copy
  Tensor workspace_;  // [bytes] u8: the prefill or decode plan's work lists and partials
  Tensor stage_;      // [bytes] u8: FP8 caches: the staged prefill's pool (undefined otherwise)
  size_t prefill_list_bytes_ = 0;  // the prefill's work list alone
  size_t prefill_ws_bytes_ = 0, decode_ws_bytes_ = 0;
  std::optional<PagedDispatcher> dispatch_;  // the kernel of each step, its plan and launch
  Event done_;                               // recorded after the staging copy
  bool sparse_decode_ = false;     // this step is the decode policy's (selected pages only)
  DecodeGraphNodes decode_nodes_;  // decode launches under capture
  std::unique_ptr<sparse::SparsePolicyCuda> sparse_;  // the policy's twin (none under full)
  bool sparse_decodes_ = false;                       // the policy selects decode steps' pages
  bool sparse_graphs_ = false;                        // and its decode steps replay in CUDA graphs
  bool sparse_prefill_ = false;                       // this step's prefill is block-sparse
  int num_seqs_ = 0, num_tokens_ = 0;
  bool planned_ = false;
};

}  // namespace

namespace {

std::unique_ptr<GraphLaunches> PagedAttentionBackend::end_graph_capture() {
  // Every paged layer's attention is a decode kernel, or none is (one dispatcher, one kernel
  // choice; a decode policy's step: its compact decode); a linear-attention layer (a state
  // group's) launches none of them.
  const size_t want =
      decode_grid(0) > 0 ? static_cast<size_t>(num_layers() - num_state_layers_) : 0;
  return decode_nodes_.finish([this](size_t g) { return decode_grid(g); }, num_groups(), want);
}

}  // namespace

std::unique_ptr<AttentionBackend> make_paged_attention_backend(
    const PagedKVPool& pool, int64_t num_qo_heads, float sm_scale, const PagedBackendLimits& limits,
    const SparseOptions& sparse, const kernels::KernelTuning& tuning, const KvGroups* groups,
    StatePool* states, PagedPhaseHook* phase_hook) {
  auto backend = std::make_unique<PagedAttentionBackend>(pool, num_qo_heads, sm_scale, limits,
                                                         sparse, tuning, groups, states);
  if (phase_hook != nullptr) {
    PagedAttentionBackend* paged = backend.get();
    *phase_hook = [paged](PhaseRecorder* recorder) { paged->set_phase_recorder(recorder); };
  }
  return backend;
}

}  // namespace longctx
