// The CUDA offload device (see offload_backend.h). Memory:
//   host pool (pinned) [layers][host blocks][K, V][block_size, Hkv, d]: layer-major, so a run of
//     consecutive blocks of one layer is one contiguous copy into a ring slot, and a block across
//     all layers is one strided 2D copy;
//   GPU cache [layers][gpu blocks][K, V][block_size, Hkv, d] and ring [slots][slot_blocks][K, V]
//     [...]: K and V of a block are adjacent, so the paged kernels see page 2b as K and (v_cache =
//     k_cache + one page) page 2b as V; under a prefill policy (xattention, streaming) the GPU
//     cache allocation ends with its staging buffers [buffers][staging blocks][K, V][...]
//     (xattention_offload_cuda.h), which the device allocates and the sparse reader uses;
//   an FP8 KV cache (kernels/kv_format.h) holds E4M3 codes in those layouts and, in a buffer of
//     the same block order beside each, the blocks' scales [..][K, V][Hkv] f32: page 2b's scales
//     are then K's and (v_scale = k_scale + Hkv) V's, as the kernels index [page, Hkv]; every
//     move (ring load, reload, write-back, copy-on-write) copies the scales with the codes. The
//     KV store's FP8 path writes the GPU cache's blocks as it writes the resident pool's (a row
//     that raises a block's scale re-encodes the block's earlier rows, which a reload of a
//     partial block brought back with their scales);
// Streams: the compute stream (the caller's), one H2D copy stream for the ring, one D2H stream for
// write-backs. Events: per slot "ready" (load done) and "free" (the attention that read it done);
// per write-back ticket one event.
// Kernels: the paged prefill and split-KV decode kernels for head_dim 64 / 128, the generic paged
// kernel for the other head dims (8..256): the resident paged backend's dispatcher
// (paged_dispatch.h) under the config's KernelTuning.
// A sparse policy is not this device's: its reader (offload_sparse_cuda.cu) reads this memory
// (CudaOffloadMemory) and attends the steps it takes.
#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "attention/backends/offload_backend.h"
#include "attention/backends/offload_sparse_cuda.h"
#include "attention/backends/paged_dispatch_cuda.h"
#include "attention/backends/staged_words.h"
#include "attention/sparse/sparse_policy.h"
#include "core/cuda_stream.h"
#include "kernels/cuda/kv_store.h"
#include "kernels/cuda/merge.h"
#include "kernels/cuda/workspace.h"
#include "longctx/core/cuda_check.h"
#include "longctx/core/device_memory.h"
#include "longctx/core/error.h"
#include "longctx/core/stream.h"

namespace longctx {

namespace {

using kernels::MaskMode;
using kernels::PagedPrefillParams;

// One attention call's index arrays (offsets into the staged int32 buffer), kernel and plan.
struct CallPlan {
  int64_t qo = 0, kv_indptr = 0, kv_indices = 0, last = 0;  // word offsets
  int batch = 0;
  PagedCallPlan call;
};

PagedShape shape_of(const OffloadDeviceConfig& c) {
  PagedShape s;
  s.num_qo_heads = static_cast<int>(c.num_qo_heads);
  s.num_kv_heads = static_cast<int>(c.num_kv_heads);
  s.head_dim = static_cast<int>(c.head_dim);
  s.page_size = static_cast<int>(c.geometry.block_size);
  s.dtype = c.dtype;
  s.kv_format = c.kv_format;
  s.sm_scale = c.sm_scale;
  return s;
}

class CudaOffloadDevice final : public OffloadDevice {
 public:
  // staging_blocks: blocks after the cache's last layer in its allocation (a sparse reader's).
  CudaOffloadDevice(const OffloadDeviceConfig& c, int64_t staging_blocks)
      : c_(c),
        g_(c.geometry),
        device_(c.device),
        h2d_(c.device, /*priority=*/-1),
        d2h_(c.device),
        words_(c.device),
        slot_words_(c.device, 2 * std::max<int64_t>({c.max_tokens, c.max_seqs, 1})) {
    LONGCTX_CHECK(device_.is_cuda(), ErrorCode::kInvalidArgument,
                  "KV offload: the CUDA device needs a CUDA device, got {}", device_.str());
    LONGCTX_CHECK(!c.fp8() || sparse::policy_def(c.sparse.policy).reads_fp8,
                  ErrorCode::kUnsupported,
                  "KV offload: --sparse-policy {} over an FP8 KV cache is not built on the CUDA "
                  "device (FP8 runs dense and with quest; use --kv-cache-dtype bf16 with it)",
                  sparse_policy_name(c.sparse.policy));
    LONGCTX_CHECK(c.num_qo_heads % c.num_kv_heads == 0, ErrorCode::kUnsupported,
                  "KV offload: {} q heads are not a multiple of {} kv heads", c.num_qo_heads,
                  c.num_kv_heads);
    dispatch_.emplace(shape_of(c), c.tuning, device_.index);
    esize_ = c.fp8() ? 1 : static_cast<int64_t>(dtype_size(c.dtype));
    page_ = c.page_elems();
    block_bytes_ = 2 * page_ * esize_;
    scale_bytes_ = c.fp8() ? 2 * c.num_kv_heads * static_cast<int64_t>(sizeof(float)) : 0;
    const int64_t host_bytes = g_.num_layers * g_.num_host_blocks * c.layer_block_bytes();
    try {
      host_ = Tensor::empty_pinned({g_.num_layers * g_.num_host_blocks * block_bytes_}, DType::kU8);
      if (c.fp8()) {
        host_scales_ =
            Tensor::empty_pinned({g_.num_layers * g_.num_host_blocks * scale_bytes_}, DType::kU8);
        std::memset(host_scales_.data_ptr(), 0, static_cast<size_t>(host_scales_.nbytes()));
      }
    } catch (const Error& e) {
      LONGCTX_THROW(ErrorCode::kOutOfMemory,
                    "KV offload: cannot pin {} of host memory for the host KV pool ({} blocks); "
                    "lower --host-kv-budget ({})",
                    format_bytes(host_bytes), g_.num_host_blocks, e.what());
    }
    gpu_ = Tensor::empty({(g_.num_layers * g_.num_gpu_blocks + staging_blocks) * block_bytes_},
                         DType::kU8, device_);
    ring_ = Tensor::empty({g_.num_slots * g_.slot_blocks * block_bytes_}, DType::kU8, device_);
    if (c.fp8()) {  // zeroed: a block's scales are defined before any row reaches it
      gpu_scales_ =
          Tensor::zeros({g_.num_layers * g_.num_gpu_blocks * scale_bytes_}, DType::kU8, device_);
      ring_scales_ =
          Tensor::zeros({g_.num_slots * g_.slot_blocks * scale_bytes_}, DType::kU8, device_);
    }
    const int64_t rows = c.max_tokens * c.num_qo_heads;
    part_o_ = Tensor::empty({rows * c.head_dim}, DType::kF32, device_);
    part_lse_ = Tensor::empty({rows}, DType::kF32, device_);
    acc_o_ = Tensor::empty({rows * c.head_dim}, DType::kF32, device_);
    acc_lse_ = Tensor::empty({rows}, DType::kF32, device_);
    for (int64_t s = 0; s < g_.num_slots; ++s) {
      ready_.emplace_back(device_);
      free_.emplace_back(device_);
    }
  }

  // What the sparse reader uses.
  CudaOffloadMemory memory() {
    CudaOffloadMemory m{static_cast<char*>(gpu_.data_ptr()),
                        static_cast<const char*>(host_.data_ptr()), &h2d_,
                        [this](cudaStream_t s, uint64_t ticket) { wait_ticket(s, ticket); }};
    if (c_.fp8()) {
      m.gpu_scales = scales_at(kGpu, 0);
      m.host_scales = scales_at(kHost, 0);
    }
    return m;
  }

  ~CudaOffloadDevice() override {
    // Copies in flight read or write the pools: let them land before the memory goes.
    h2d_.synchronize();
    d2h_.synchronize();
  }

  bool ticket_done(uint64_t ticket) override {
    // Tickets land in issue order (one D2H stream); one not issued yet has not landed.
    while (landed_ < ticket && !tickets_.empty() && tickets_.begin()->second.query()) {
      landed_ = tickets_.begin()->first;
      tickets_.erase(tickets_.begin());
    }
    return landed_ >= ticket;
  }

  void begin_step(const OffloadStepPlan& plan) override {
    plan_ = &plan;
    import_after_ = nullptr;  // the next import follows this step
    cudaStream_t compute = stream();
    stage_indices(plan, compute);
    // Evicted dirty blocks out first: the step's waits may name their ticket.
    if (!plan.evict_write_backs.empty())
      write_back(plan.evict_write_backs, plan.evict_write_back_ticket);
    if (plan.compute_wait_ticket) wait_ticket(compute, plan.compute_wait_ticket);
    for (auto [src, dst] : plan.gpu_copies)
      copy_all_layers(kGpu, dst, kGpu, src, cudaMemcpyDeviceToDevice, compute);
    if (!plan.loads.empty() && plan.load_wait_ticket) wait_ticket(compute, plan.load_wait_ticket);
    for (const BlockMove& m : plan.loads)
      copy_all_layers(kGpu, m.gpu, kHost, m.host, cudaMemcpyHostToDevice, compute);
  }

  void load_slot(int64_t slot, int64_t layer, int64_t item, uint64_t wait) override {
    cudaStream_t s = cuda_handle(h2d_);
    h2d_.wait(free_[slot]);
    if (wait) wait_ticket(s, wait);
    for (const SlotRun& r : plan_->items[item].runs) {
      LONGCTX_CUDA_CHECK(cudaMemcpyAsync(slot_at(slot, r.slot_begin), host_at(layer, r.host_begin),
                                         static_cast<size_t>(r.count * block_bytes_),
                                         cudaMemcpyHostToDevice, s));
      if (scale_bytes_ > 0)
        LONGCTX_CUDA_CHECK(cudaMemcpyAsync(
            scales_at(kRing, slot * g_.slot_blocks + r.slot_begin),
            scales_at(kHost, layer * g_.num_host_blocks + r.host_begin),
            static_cast<size_t>(r.count * scale_bytes_), cudaMemcpyHostToDevice, s));
    }
    ready_[slot].record(h2d_);
  }

  void store_kv(int64_t layer, const Tensor& k, const Tensor& v) override {
    kernels::KvStoreParams p;
    p.k = k.data_ptr();
    p.v = v.data_ptr();
    p.k_token_stride = k.strides()[0];
    p.v_token_stride = v.strides()[0];
    p.k_cache = gpu_at(layer, 0);
    p.v_cache = static_cast<char*>(gpu_at(layer, 0)) + page_ * esize_;
    p.slot_mapping = reinterpret_cast<const int64_t*>(slot_words_.device_at(0));
    p.num_tokens = static_cast<int>(plan_->slots.size());
    p.num_kv_heads = static_cast<int>(c_.num_kv_heads);
    p.head_dim = static_cast<int>(c_.head_dim);
    p.page_size = static_cast<int>(g_.block_size);
    p.num_pages = static_cast<int>(2 * g_.num_gpu_blocks - 1);
    p.dtype = c_.dtype;
    if (c_.fp8()) {  // the codes' scales: pages 2b (K) and, from v_scale, 2b as V
      p.kv_format = kernels::KvCacheFormat::kFp8E4M3;
      p.k_scale = scales_at(kGpu, layer * g_.num_gpu_blocks);
      p.v_scale = p.k_scale + c_.num_kv_heads;
    }
    kernels::cuda::kv_store_run(p, stream());
  }

  void attend_resident(int64_t layer, const Tensor& q) override {
    q_ = q.contiguous();
    const int64_t t = q.size(0);
    out_ = Tensor::empty({t, c_.num_qo_heads * c_.head_dim}, c_.dtype, device_);
    const bool direct = plan_->items.empty();  // no host blocks: the output directly
    // With host blocks too, every partial stays fp32 until the merged state is rounded once.
    run(resident_, q_.data_ptr(), gpu_at(layer, 0), scales_at(kGpu, layer * g_.num_gpu_blocks),
        direct ? out_.data_ptr() : nullptr, direct ? nullptr : part_o_.data<float>(),
        direct ? nullptr : part_lse_.data<float>(), MaskMode::kCausal);
    if (!direct) accumulate(0, static_cast<int>(t), /*init=*/true);
  }

  void attend_slot(int64_t slot, int64_t, int64_t item, const Tensor&) override {
    cudaStream_t compute = stream();
    LONGCTX_CUDA_CHECK(cudaStreamWaitEvent(compute, cuda_handle(ready_[slot]), 0));
    const RingItem& it = plan_->items[item];
    const int64_t row = c_.num_qo_heads * c_.head_dim;
    const int64_t q_esize = static_cast<int64_t>(dtype_size(c_.dtype));
    run(items_[item], static_cast<const char*>(q_.data_ptr()) + it.row_begin * row * q_esize,
        slot_at(slot, 0), scales_at(kRing, slot * g_.slot_blocks), nullptr,
        part_o_.data<float>() + it.row_begin * row,
        part_lse_.data<float>() + it.row_begin * c_.num_qo_heads, MaskMode::kNone);
    accumulate(it.row_begin, it.row_end - it.row_begin, /*init=*/false);
    free_[slot].record_on(compute);
  }

  Tensor finish_layer(int64_t, const Tensor& q) override {
    if (!plan_->items.empty()) {
      kernels::MergeParams m;  // one fp32 state -> the output dtype
      m.o_in = acc_o_.data_ptr();
      m.lse_in = acc_lse_.data<float>();
      m.o_out = out_.data_ptr();
      m.num_states = 1;
      m.num_rows = static_cast<int>(q.size(0));
      m.num_heads = static_cast<int>(c_.num_qo_heads);
      m.head_dim = static_cast<int>(c_.head_dim);
      m.in_dtype = DType::kF32;
      m.out_dtype = c_.dtype;
      kernels::cuda::merge_states(m, stream());
    }
    return std::move(out_);
  }

  void end_step() override {
    if (!plan_->write_backs.empty()) write_back(plan_->write_backs, plan_->write_back_ticket);
  }

  // The host copy is written by the CPU, in the wait (the store's loader thread): no stream is
  // held and the engine thread only records events, one pair a step. The wait first waits for
  // the steps enqueued so far (the ring and reloads may still read the block) and the D2H
  // stream (a write-back into the block, ticket `wait`, may still run): an H2H cudaMemcpyAsync
  // would be synchronous for the calling thread.
  std::function<void()> import_block(int32_t host, std::span<const std::byte> bytes,
                                     uint64_t) override {
    if (import_after_ == nullptr) {
      Event after(device_);
      after.record_on(stream());
      d2h_.wait(after);
      import_after_ = std::make_shared<Event>(device_);
      import_after_->record(d2h_);
    }
    return [this, host, bytes, after = import_after_] {
      after->synchronize();
      const std::byte* src = bytes.data();
      const auto page = static_cast<size_t>(page_ * esize_);
      for (int64_t kv = 0; kv < 2; ++kv)
        for (int64_t l = 0; l < g_.num_layers; ++l, src += page)
          std::memcpy(static_cast<char*>(host_at(l, host)) + kv * page, src, page);
      const auto half = static_cast<size_t>(scale_bytes_ / 2);
      for (int64_t kv = 0; kv < 2 && half > 0; ++kv)
        for (int64_t l = 0; l < g_.num_layers; ++l, src += half)
          std::memcpy(
              reinterpret_cast<char*>(scales_at(kHost, l * g_.num_host_blocks + host)) + kv * half,
              src, half);
    };
  }

  // A resident full block: strided copies of its layers' K, V (and scales) from the GPU cache on
  // the D2H stream after the steps so far, issuing `ticket`. Otherwise the host copy, on this
  // thread once its write-back landed (a block evicted before its export started).
  std::function<void()> export_block(int32_t host, int32_t gpu, uint64_t ticket,
                                     std::span<std::byte> out, uint64_t wait) override {
    const auto page = static_cast<size_t>(page_ * esize_);
    const auto half = static_cast<size_t>(scale_bytes_ / 2);
    const auto layers = static_cast<size_t>(g_.num_layers);
    if (gpu < 0) {
      if (wait && !ticket_done(wait)) {
        auto it = tickets_.find(wait);
        LONGCTX_CHECK(it != tickets_.end(), ErrorCode::kInternal,
                      "KV offload: write-back ticket {} was never issued", wait);
        it->second.synchronize();
      }
      std::byte* dst = out.data();
      for (int64_t kv = 0; kv < 2; ++kv)
        for (int64_t l = 0; l < g_.num_layers; ++l, dst += page)
          std::memcpy(dst, static_cast<const char*>(host_at(l, host)) + kv * page, page);
      for (int64_t kv = 0; kv < 2 && half > 0; ++kv)
        for (int64_t l = 0; l < g_.num_layers; ++l, dst += half)
          std::memcpy(
              dst,
              reinterpret_cast<const char*>(scales_at(kHost, l * g_.num_host_blocks + host)) +
                  kv * half,
              half);
      return {};
    }
    Event after(device_);
    after.record_on(stream());
    d2h_.wait(after);
    cudaStream_t s = cuda_handle(d2h_);
    const auto pitch = static_cast<size_t>(g_.num_gpu_blocks * block_bytes_);
    for (int64_t kv = 0; kv < 2; ++kv)
      LONGCTX_CUDA_CHECK(cudaMemcpy2DAsync(out.data() + kv * layers * page, page,
                                           static_cast<char*>(gpu_at(0, gpu)) + kv * page, pitch,
                                           page, layers, cudaMemcpyDeviceToHost, s));
    for (int64_t kv = 0; kv < 2 && half > 0; ++kv)
      LONGCTX_CUDA_CHECK(
          cudaMemcpy2DAsync(out.data() + 2 * layers * page + kv * layers * half, half,
                            reinterpret_cast<char*>(scales_at(kGpu, gpu)) + kv * half,
                            static_cast<size_t>(g_.num_gpu_blocks * scale_bytes_), half, layers,
                            cudaMemcpyDeviceToHost, s));
    auto [it, fresh] = tickets_.emplace(ticket, Event(device_));
    LONGCTX_CHECK(fresh, ErrorCode::kInternal, "KV offload: ticket {} issued twice", ticket);
    it->second.record(d2h_);
    auto done = std::make_shared<Event>(device_);
    done->record(d2h_);
    return [done] { done->synchronize(); };
  }

 private:
  cudaStream_t stream() const { return current_cuda_stream(device_.index); }
  void* gpu_at(int64_t layer, int64_t b) const {
    return static_cast<char*>(gpu_.data_ptr()) + (layer * g_.num_gpu_blocks + b) * block_bytes_;
  }
  void* host_at(int64_t layer, int64_t b) const {
    return static_cast<char*>(host_.data_ptr()) + (layer * g_.num_host_blocks + b) * block_bytes_;
  }
  void* slot_at(int64_t slot, int64_t b) const {
    return static_cast<char*>(ring_.data_ptr()) + (slot * g_.slot_blocks + b) * block_bytes_;
  }
  const int32_t* dev(int64_t offset) const { return words_.device_at(offset); }
  // The scales of buffer `which`'s block `index` (layer * blocks per layer + block for the host
  // pool and the GPU cache, slot * slot_blocks + block for the ring); null without FP8.
  enum Buffer { kHost, kGpu, kRing };
  float* scales_at(Buffer which, int64_t index) const {
    if (scale_bytes_ == 0) return nullptr;
    const Tensor& t = which == kHost ? host_scales_ : which == kGpu ? gpu_scales_ : ring_scales_;
    return reinterpret_cast<float*>(static_cast<char*>(t.data_ptr()) + index * scale_bytes_);
  }
  // Block `src` of the host pool or the GPU cache -> block `dst` of the other (or the same), every
  // layer: one strided 2D copy of the codes and, FP8, one of the scales.
  void copy_all_layers(Buffer dst_buf, int64_t dst, Buffer src_buf, int64_t src,
                       cudaMemcpyKind kind, cudaStream_t s) {
    auto blocks = [&](Buffer b) { return b == kHost ? g_.num_host_blocks : g_.num_gpu_blocks; };
    auto codes = [&](Buffer b, int64_t i) { return b == kHost ? host_at(0, i) : gpu_at(0, i); };
    LONGCTX_CUDA_CHECK(
        cudaMemcpy2DAsync(codes(dst_buf, dst), static_cast<size_t>(blocks(dst_buf) * block_bytes_),
                          codes(src_buf, src), static_cast<size_t>(blocks(src_buf) * block_bytes_),
                          static_cast<size_t>(block_bytes_), g_.num_layers, kind, s));
    if (scale_bytes_ == 0) return;
    LONGCTX_CUDA_CHECK(cudaMemcpy2DAsync(
        scales_at(dst_buf, dst), static_cast<size_t>(blocks(dst_buf) * scale_bytes_),
        scales_at(src_buf, src), static_cast<size_t>(blocks(src_buf) * scale_bytes_),
        static_cast<size_t>(scale_bytes_), g_.num_layers, kind, s));
  }

  void wait_ticket(cudaStream_t s, uint64_t ticket) {
    if (ticket_done(ticket)) return;
    auto it = tickets_.find(ticket);
    LONGCTX_CHECK(it != tickets_.end(), ErrorCode::kInternal,
                  "KV offload: write-back ticket {} was never issued", ticket);
    LONGCTX_CUDA_CHECK(cudaStreamWaitEvent(s, cuda_handle(it->second), 0));
  }

  // Blocks of every layer, GPU cache -> host pool, on the D2H stream after the compute so far.
  void write_back(const std::vector<BlockMove>& moves, uint64_t ticket) {
    Event after(device_);
    after.record_on(stream());
    d2h_.wait(after);
    cudaStream_t s = cuda_handle(d2h_);
    for (const BlockMove& m : moves)
      copy_all_layers(kHost, m.host, kGpu, m.gpu, cudaMemcpyDeviceToHost, s);
    auto [it, fresh] = tickets_.emplace(ticket, Event(device_));
    LONGCTX_CHECK(fresh, ErrorCode::kInternal, "KV offload: ticket {} issued twice", ticket);
    it->second.record(d2h_);
  }

  // Index arrays of the resident call and every ring item in one staged buffer, one copy; the
  // kernels' plans (work lists into per-call workspaces).
  void stage_indices(const OffloadStepPlan& plan, cudaStream_t compute) {
    words_.begin();
    auto last_lens = [&](const std::vector<int32_t>& kv_lens) {
      std::vector<int32_t> last(kv_lens.size());
      const int32_t bs = static_cast<int32_t>(g_.block_size);
      for (size_t i = 0; i < last.size(); ++i)
        last[i] = kv_lens[i] == 0 ? 0 : (kv_lens[i] - 1) % bs + 1;
      return last;
    };
    auto stage_call =
        [&](CallPlan& cp, const std::vector<int32_t>& qo, const std::vector<int32_t>& kv_indptr,
            const std::vector<int32_t>& kv_indices, const std::vector<int32_t>& kv_lens) {
          cp.batch = static_cast<int>(kv_lens.size());
          cp.qo = words_.put(qo);
          cp.kv_indptr = words_.put(kv_indptr);
          cp.kv_indices =
              words_.put(kv_indices, 2);  // page 2b is block b's K (and, from v_cache, its V)
          cp.last = words_.put(last_lens(kv_lens));
        };
    stage_call(resident_, plan.qo_indptr, plan.kv_indptr, plan.kv_indices, plan.kv_lens);
    items_.resize(plan.items.size());
    for (size_t i = 0; i < plan.items.size(); ++i) {
      const RingItem& it = plan.items[i];
      stage_call(items_[i], it.qo_indptr, it.kv_indptr, it.kv_indices, it.kv_lens);
    }
    words_.upload(compute);
    {  // slots, as int64 of the doubled page ids, at a fixed address (a graph's KV store reads it)
      std::vector<int64_t> doubled;
      doubled.reserve(plan.slots.size());
      const int64_t bs = g_.block_size;
      for (int64_t s : plan.slots) doubled.push_back((s / bs) * 2 * bs + s % bs);
      slot_words_.begin();
      slot_words_.put_at(0, reinterpret_cast<const int32_t*>(doubled.data()), 2 * doubled.size());
      slot_words_.upload(compute);
    }

    // The calls' kernels and plans, each into its own workspace region (the generic kernel's
    // take none; the prefill's no stream-K split).
    std::vector<CallPlan*> calls = {&resident_};
    std::vector<const std::vector<int32_t>*> qos = {&plan.qo_indptr};
    std::vector<const std::vector<int32_t>*> lens = {&plan.kv_lens};
    for (size_t i = 0; i < plan.items.size(); ++i) {
      calls.push_back(&items_[i]);
      qos.push_back(&plan.items[i].qo_indptr);
      lens.push_back(&plan.items[i].kv_lens);
    }
    // The resident call's queries see its keys causally; a ring item's (earlier keys) all of them.
    auto mask_of = [](size_t i) { return i == 0 ? MaskMode::kCausal : MaskMode::kNone; };
    std::vector<size_t> offsets, bytes(calls.size());
    size_t total = 0;
    for (size_t i = 0; i < calls.size(); ++i) {
      const PagedKernel kernel =
          dispatch_->kernel_for(qos[i]->data(), calls[i]->batch, mask_of(i), /*window=*/0);
      const int64_t total_q = qos[i]->empty() ? 0 : qos[i]->back();
      bytes[i] = kernels::cuda::workspace_align(
          dispatch_->workspace_bytes(kernel, calls[i]->batch, total_q));
      offsets.push_back(total);
      total += bytes[i];
    }
    if (workspace_.numel() < static_cast<int64_t>(total))
      workspace_ = Tensor::empty({static_cast<int64_t>(total * 5 / 4)}, DType::kU8, device_);
    // FP8: one staging pool for the calls' prefills (they run in stream order), of the most pages
    // one call reads (a ring slot's, or the resident call's) up to the tuning's cap.
    int64_t most_pages = 0;
    for (const CallPlan* cp : calls)
      if (cp->batch > 0)
        most_pages = std::max<int64_t>(most_pages, words_.host()[cp->kv_indptr + cp->batch]);
    if (const size_t stage = dispatch_->fp8_stage_bytes(most_pages);
        stage > 0 && stage_.numel() < static_cast<int64_t>(stage))
      stage_ = Tensor::empty({static_cast<int64_t>(stage)}, DType::kU8, device_);
    const int32_t* host = words_.host();
    for (size_t i = 0; i < calls.size(); ++i) {
      CallPlan& cp = *calls[i];
      PagedCallInput in;
      in.qo_indptr = host + cp.qo;
      in.kv_indptr = host + cp.kv_indptr;
      in.last_page_len = host + cp.last;
      in.kv_lens = lens[i]->data();
      in.batch = cp.batch;
      in.mask = mask_of(i);
      if (stage_.defined()) {
        in.fp8_stage = stage_.data_ptr();
        in.fp8_stage_bytes = static_cast<size_t>(stage_.numel());
      }
      void* ws = bytes[i] > 0 ? static_cast<char*>(workspace_.data_ptr()) + offsets[i] : nullptr;
      cp.call = dispatch_->plan(in, ws, bytes[i], compute);
    }
  }

  // Output o (q's dtype) or, when o_f32 is set, fp32. scales: the FP8 cache's (null otherwise).
  void run(const CallPlan& cp, const void* q, void* cache, const float* scales, void* o,
           float* o_f32, float* lse, MaskMode mask) {
    PagedPrefillParams p = shape_params(mask);
    p.q = q;
    p.k_cache = cache;
    p.v_cache = static_cast<char*>(cache) + page_ * esize_;
    if (scales != nullptr) {
      p.k_scale = scales;
      p.v_scale = scales + c_.num_kv_heads;
    }
    p.o = o;
    p.o_f32 = o_f32;
    p.lse = lse;
    p.qo_indptr = dev(cp.qo);
    p.kv_indptr = dev(cp.kv_indptr);
    p.kv_indices = dev(cp.kv_indices);
    p.kv_last_page_len = dev(cp.last);
    p.batch_size = cp.batch;
    dispatch_->run(cp.call, p, /*q_token_stride=*/0, stream());
  }

  // The params' shape fields (no pointers).
  PagedPrefillParams shape_params(MaskMode mask) const {
    PagedPrefillParams p;
    p.num_qo_heads = static_cast<int>(c_.num_qo_heads);
    p.num_kv_heads = static_cast<int>(c_.num_kv_heads);
    p.head_dim = static_cast<int>(c_.head_dim);
    p.page_size = static_cast<int>(g_.block_size);
    p.dtype = c_.dtype;
    p.kv_format = c_.kv_format;
    p.mask_mode = mask;
    p.sm_scale = c_.sm_scale;
    return p;
  }

  void accumulate(int64_t row_begin, int num_rows, bool init) {
    const int64_t row = c_.num_qo_heads * c_.head_dim;
    kernels::StateAccumulateParams a;
    a.acc_o = acc_o_.data<float>() + row_begin * row;
    a.acc_lse = acc_lse_.data<float>() + row_begin * c_.num_qo_heads;
    a.o = part_o_.data<float>() + row_begin * row;
    a.lse = part_lse_.data<float>() + row_begin * c_.num_qo_heads;
    a.num_rows = num_rows;
    a.num_heads = static_cast<int>(c_.num_qo_heads);
    a.head_dim = static_cast<int>(c_.head_dim);
    a.dtype = DType::kF32;
    a.init = init;
    kernels::cuda::accumulate_state(a, stream());
  }

  OffloadDeviceConfig c_;
  OffloadGeometry g_;
  Device device_;
  // esize_: bytes of a cache element (FP8: 1); block_bytes_: a block's K and V codes of one
  // layer; scale_bytes_: its K and V scales (0 without FP8).
  int64_t esize_ = 2, block_bytes_ = 0, scale_bytes_ = 0, page_ = 0;
  std::optional<PagedDispatcher> dispatch_;  // each call's kernel, plan and launch
  Tensor host_;                              // [layers * host blocks * block_bytes_] u8, pinned
  Tensor gpu_;                               // [layers * gpu blocks * block_bytes_] u8
  Tensor ring_;                              // [slots * slot_blocks * block_bytes_] u8
  Tensor host_scales_;  // FP8: [layers * host blocks * scale_bytes_] u8 ([K, V][Hkv] f32), pinned
  Tensor gpu_scales_;   // FP8: [layers * gpu blocks * scale_bytes_] u8
  Tensor ring_scales_;  // FP8: [slots * slot_blocks * scale_bytes_] u8
  Tensor part_o_;       // [max_tokens * Hq * d] f32: one call's output, unrounded
  Tensor part_lse_;     // [max_tokens * Hq] f32
  Tensor acc_o_;        // [max_tokens * Hq * d] f32: the layer's merged state
  Tensor acc_lse_;      // [max_tokens * Hq] f32
  Tensor q_, out_;      // the layer's contiguous q [T, Hq, d] and output [T, Hq * d]
  Stream h2d_, d2h_;
  std::vector<Event> ready_, free_;    // [slots]
  std::map<uint64_t, Event> tickets_;  // write-backs (and exports) in flight, by ticket
  // The steps and write-backs enqueued before this step's imports (null: none since the step).
  std::shared_ptr<Event> import_after_;
  uint64_t landed_ = 0;
  StagedWords words_;       // the step's index arrays (resident call, ring items)
  StagedWords slot_words_;  // its slots [T] i64 (fixed capacity: the address stays)
  Tensor workspace_;        // [bytes] u8: the calls' plans
  Tensor stage_;            // [bytes] u8: FP8: the staged prefills' pool (grows to the cap)
  CallPlan resident_;
  std::vector<CallPlan> items_;
  const OffloadStepPlan* plan_ = nullptr;
};

}  // namespace

double measure_host_to_device_gbps(Device device, int64_t bytes) {
  Tensor host = Tensor::empty_pinned({bytes}, DType::kU8);
  std::memset(host.data_ptr(), 1, static_cast<size_t>(bytes));
  Tensor dev = Tensor::empty({bytes}, DType::kU8, device);
  Stream s(device);
  Event start(device, true), stop(device, true);
  float best_ms = 1e30f;
  for (int i = 0; i < 3; ++i) {
    start.record(s);
    LONGCTX_CUDA_CHECK(cudaMemcpyAsync(dev.data_ptr(), host.data_ptr(), static_cast<size_t>(bytes),
                                       cudaMemcpyHostToDevice, cuda_handle(s)));
    stop.record(s);
    stop.synchronize();
    float ms = 0;
    LONGCTX_CUDA_CHECK(cudaEventElapsedTime(&ms, cuda_handle(start), cuda_handle(stop)));
    best_ms = std::min(best_ms, ms);
  }
  return double(bytes) / (best_ms * 1e-3) / 1e9;
}

OffloadDeviceParts make_cuda_offload_device(const OffloadDeviceConfig& config) {
  const XAttnStaging staging = cuda_offload_sparse_staging(config);
  auto ring = std::make_unique<CudaOffloadDevice>(config, staging.buffers * staging.blocks);
  OffloadDeviceParts parts;
  parts.sparse = make_cuda_offload_sparse(config, staging, ring->memory());
  parts.ring = std::move(ring);
  return parts;
}

}  // namespace longctx
