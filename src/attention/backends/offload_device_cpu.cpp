// The CPU simulation of the offload device: the same plans as the CUDA device, with plain memory
// for the host pool, the GPU cache and the ring, memcpy as the copy engine and the reference
// kernels. It checks what the GPU cannot see: a slot loaded while its last reader has not
// released it, or read before its load, throws; a write-back lands cpu_write_back_lag steps late
// (reading the GPU block then), unless a load or a reuse waits for its ticket first, so a missing
// wait in a plan gives stale K/V and the tests that compare with the resident path fail.
// Under a sparse policy its reader (offload_sparse_cpu.cpp) reads this memory: host pages in
// place, after the write-backs it lands through this device's queue.
// An FP8 KV cache (kv_format kFp8E4M3) keeps codes in the same layout and each block's K and V
// scales beside it ([..][K, V][Hkv] f32); every move carries both, the KV store reference writes
// the GPU cache's blocks as the resident pool's, and the references read codes x scales (dense
// attention, and quest's reader: its metadata and pages dequantized).
#include <algorithm>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <memory>

#include "attention/backends/offload_backend.h"
#include "attention/backends/offload_sparse_cpu.h"
#include "kernels/cpu/attention_ref.h"
#include "kernels/cpu/kv_store_cpu.h"
#include "kernels/cpu/merge_cpu.h"
#include "longctx/core/error.h"

namespace longctx {

namespace {

using kernels::KvCacheFormat;
using kernels::MaskMode;
using kernels::PagedPrefillParams;

class CpuOffloadDevice final : public OffloadDevice {
 public:
  explicit CpuOffloadDevice(const OffloadDeviceConfig& c) : c_(c), g_(c.geometry) {
    LONGCTX_CHECK(c.device.is_cpu() && c.dtype == DType::kF32, ErrorCode::kInvalidArgument,
                  "KV offload (CPU): needs f32 K/V on the CPU, got {} on {}", dtype_name(c.dtype),
                  c.device.str());
    page_ = c.page_elems();
    esize_ = c.fp8() ? 1 : static_cast<int64_t>(sizeof(float));
    // Untouched until used (the host pool may be large); rows are read only once written.
    host_ = make_buffer(g_.num_layers * g_.num_host_blocks);
    gpu_ = make_buffer(g_.num_layers * g_.num_gpu_blocks);
    ring_ = make_buffer(g_.num_slots * g_.slot_blocks);
    slots_.resize(g_.num_slots);
  }

  // What the sparse reader reads.
  CpuOffloadMemory memory() {
    CpuOffloadMemory m;
    m.host = host_.codes.data_ptr();
    m.gpu = gpu_.codes.data_ptr();
    m.host_scales = scales(host_, 0);
    m.gpu_scales = scales(gpu_, 0);
    m.land_write_backs = [this](uint64_t ticket) { land_until(ticket); };
    return m;
  }

  bool ticket_done(uint64_t ticket) override { return ticket <= landed_; }

  void begin_step(const OffloadStepPlan& plan) override {
    plan_ = &plan;
    ++step_;
    // Write-backs issued cpu_write_back_lag steps ago land now.
    while (!pending_.empty() && pending_.front().step + c_.cpu_write_back_lag <= step_) land_next();
    // As the CUDA device: evicted dirty blocks out first, then the waits (which may name them).
    if (!plan.evict_write_backs.empty())
      issue(plan.evict_write_back_ticket, plan.evict_write_backs);
    if (plan.compute_wait_ticket) land_until(plan.compute_wait_ticket);
    for (auto [src, dst] : plan.gpu_copies)
      for (int64_t l = 0; l < g_.num_layers; ++l)
        move_blocks(gpu_, gpu_index(l, dst), gpu_, gpu_index(l, src), 1);
    if (!plan.loads.empty() && plan.load_wait_ticket) land_until(plan.load_wait_ticket);
    for (const BlockMove& m : plan.loads)
      for (int64_t l = 0; l < g_.num_layers; ++l)
        move_blocks(gpu_, gpu_index(l, m.gpu), host_, host_index(l, m.host), 1);
    const int64_t t = static_cast<int64_t>(plan.slots.size());
    acc_o_.assign(t * c_.num_qo_heads * c_.head_dim, 0.f);
    acc_lse_.assign(t * c_.num_qo_heads, 0.f);
  }

  void load_slot(int64_t slot, int64_t layer, int64_t item, uint64_t wait) override {
    Slot& s = slots_[slot];
    LONGCTX_CHECK(!s.loaded, ErrorCode::kInternal,
                  "KV offload ring: slot {} loaded with layer {} item {} while layer {} item {} "
                  "has not released it",
                  slot, layer, item, s.layer, s.item);
    if (wait) land_until(wait);
    const RingItem& it = plan_->items[item];
    for (const SlotRun& r : it.runs)
      move_blocks(ring_, slot_index(slot, r.slot_begin), host_, host_index(layer, r.host_begin),
                  r.count);
    s = {true, layer, item};
  }

  void store_kv(int64_t layer, const Tensor& k, const Tensor& v) override {
    const int64_t hkv = c_.num_kv_heads, d = c_.head_dim, bs = g_.block_size;
    if (c_.fp8()) {
      store_fp8(layer, k, v);
      return;
    }
    for (size_t t = 0; t < plan_->slots.size(); ++t) {
      const int64_t slot = plan_->slots[t];
      float* base = gpu_block(layer, static_cast<int32_t>(slot / bs)) + (slot % bs) * hkv * d;
      for (int64_t h = 0; h < hkv; ++h) {
        std::memcpy(base + h * d, k.data<float>() + t * k.strides()[0] + h * k.strides()[1],
                    d * sizeof(float));
        std::memcpy(base + page_ + h * d, v.data<float>() + t * v.strides()[0] + h * v.strides()[1],
                    d * sizeof(float));
      }
    }
  }

  void attend_resident(int64_t layer, const Tensor& q) override {
    const int64_t s = static_cast<int64_t>(plan_->kv_lens.size());
    q_ = q.contiguous();
    std::vector<int32_t> pages(plan_->kv_indices.size());
    for (size_t i = 0; i < pages.size(); ++i) pages[i] = 2 * plan_->kv_indices[i];
    std::vector<int32_t> last(s);
    for (int64_t i = 0; i < s; ++i) last[i] = last_page_len(plan_->kv_lens[i]);
    const std::vector<int32_t>& qo = plan_->qo_indptr;
    part_o_.assign(acc_o_.size(), 0.f);
    part_lse_.assign(acc_lse_.size(), 0.f);
    PagedPrefillParams p = params(q_.data<float>(), gpu_, gpu_index(layer, 0), qo, plan_->kv_indptr,
                                  pages, last, MaskMode::kCausal);
    kernels::cpu::paged_prefill_ref(p);
    accumulate(0, static_cast<int>(qo.back()), /*init=*/true);
  }

  void attend_slot(int64_t slot, int64_t layer, int64_t item, const Tensor& q) override {
    Slot& s = slots_[slot];
    LONGCTX_CHECK(s.loaded && s.layer == layer && s.item == item, ErrorCode::kInternal,
                  "KV offload ring: slot {} read for layer {} item {} but holds {}", slot, layer,
                  item, s.loaded ? fmt::format("layer {} item {}", s.layer, s.item) : "nothing");
    const RingItem& it = plan_->items[item];
    std::vector<int32_t> pages(it.kv_indices.size());
    for (size_t i = 0; i < pages.size(); ++i) pages[i] = 2 * it.kv_indices[i];
    std::vector<int32_t> last(it.kv_lens.size());
    for (size_t i = 0; i < last.size(); ++i) last[i] = last_page_len(it.kv_lens[i]);
    const int64_t row = c_.num_qo_heads * c_.head_dim;
    PagedPrefillParams p = params(q_.data<float>() + it.row_begin * row, ring_, slot_index(slot, 0),
                                  it.qo_indptr, it.kv_indptr, pages, last, MaskMode::kNone);
    p.o = part_o_.data() + it.row_begin * row;
    p.lse = part_lse_.data() + it.row_begin * c_.num_qo_heads;
    kernels::cpu::paged_prefill_ref(p);
    accumulate(it.row_begin, it.row_end - it.row_begin, /*init=*/false);
    s.loaded = false;
  }

  Tensor finish_layer(int64_t, const Tensor& q) override {
    Tensor o = Tensor::empty({q.size(0), c_.num_qo_heads * c_.head_dim}, DType::kF32);
    std::memcpy(o.data<float>(), acc_o_.data(), acc_o_.size() * sizeof(float));
    return o;
  }

  void end_step() override {
    if (!plan_->write_backs.empty()) issue(plan_->write_back_ticket, plan_->write_backs);
  }

  // The write-backs into the host copy land first (here, on the engine thread); the copy itself
  // runs in the wait, on the caller's thread (the store's loader), as the CUDA device's does:
  // the steps between never touch the block.
  std::function<void()> import_block(int32_t host, std::span<const std::byte> bytes,
                                     uint64_t wait) override {
    if (wait) land_until(wait);
    return [this, host, bytes] {
      for_each_piece(
          host_, [&](int64_t l) { return host_index(l, host); },
          [&](std::byte* p, const std::byte* store, size_t n) { std::memcpy(p, store, n); },
          const_cast<std::byte*>(bytes.data()));
    };
  }

  // At once: from the GPU cache, or from the host copy once its write-back landed. The ticket is
  // issued (with nothing to write back) so that the planner's waits on it are defined.
  std::function<void()> export_block(int32_t host, int32_t gpu, uint64_t ticket,
                                     std::span<std::byte> out, uint64_t wait) override {
    if (gpu < 0 && wait) land_until(wait);
    auto read = [&](std::byte* p, std::byte* store, size_t n) { std::memcpy(store, p, n); };
    if (gpu >= 0)
      for_each_piece(
          gpu_, [&](int64_t l) { return gpu_index(l, gpu); }, read, out.data());
    else
      for_each_piece(
          host_, [&](int64_t l) { return host_index(l, host); }, read, out.data());
    if (ticket) issue(ticket, {});
    return {};
  }

 private:
  struct Slot {
    bool loaded = false;
    int64_t layer = -1, item = -1;
  };
  struct PendingWriteBack {
    uint64_t ticket;
    uint64_t step;
    std::vector<BlockMove> moves;
  };

  // One of the host pool, the GPU cache and the ring: blocks of [K, V][bs, Hkv, d] elements
  // (f32, or FP8 codes) and, FP8, each block's [K, V][Hkv] scales.
  struct Buffer {
    Tensor codes, scales;
  };
  Buffer make_buffer(int64_t blocks) const {
    Buffer b;
    b.codes = Tensor::empty({blocks * 2 * page_}, c_.fp8() ? DType::kFP8E4M3 : DType::kF32);
    if (c_.fp8()) b.scales = Tensor::empty({blocks * 2 * c_.num_kv_heads}, DType::kF32);
    return b;
  }
  int64_t host_index(int64_t layer, int32_t b) const { return layer * g_.num_host_blocks + b; }
  int64_t gpu_index(int64_t layer, int32_t b) const { return layer * g_.num_gpu_blocks + b; }
  int64_t slot_index(int64_t slot, int32_t b) const { return slot * g_.slot_blocks + b; }
  std::byte* codes(const Buffer& buf, int64_t block) const {
    return static_cast<std::byte*>(buf.codes.data_ptr()) + block * 2 * page_ * esize_;
  }
  float* scales(const Buffer& buf, int64_t block) const {
    return c_.fp8() ? buf.scales.data<float>() + block * 2 * c_.num_kv_heads : nullptr;
  }
  // n consecutive blocks, codes and scales (the copy engine's one transfer).
  void move_blocks(const Buffer& dst, int64_t d, const Buffer& src, int64_t s, int64_t n) {
    std::memcpy(codes(dst, d), codes(src, s), n * 2 * page_ * esize_);
    if (c_.fp8())
      std::memcpy(scales(dst, d), scales(src, s), n * 2 * c_.num_kv_heads * sizeof(float));
  }
  // The pieces of one block of `buf` (block index(l) of layer l) in the KV store's order (every
  // layer's K, then V, then FP8 K scales, then V scales): f(piece, store bytes, size).
  template <typename Index, typename F>
  void for_each_piece(const Buffer& buf, Index index, F f, std::byte* store) const {
    const auto page = static_cast<size_t>(page_ * esize_);
    for (int64_t kv = 0; kv < 2; ++kv)
      for (int64_t l = 0; l < g_.num_layers; ++l, store += page)
        f(codes(buf, index(l)) + kv * page, store, page);
    if (!c_.fp8()) return;
    const auto hkv = static_cast<size_t>(c_.num_kv_heads * sizeof(float));
    for (int64_t kv = 0; kv < 2; ++kv)
      for (int64_t l = 0; l < g_.num_layers; ++l, store += hkv)
        f(reinterpret_cast<std::byte*>(scales(buf, index(l))) + kv * hkv, store, hkv);
  }
  // f32 caches only (store_kv's rows).
  float* gpu_block(int64_t layer, int32_t b) {
    return reinterpret_cast<float*>(codes(gpu_, gpu_index(layer, b)));
  }

  // FP8: the new rows through the KV store reference into the layer's GPU cache blocks. Block
  // b's K is page 2b and its V page 2b + 1 of the cache seen as pages of one half each (the
  // params() view), so slot s of block b is row s % bs of page 2b.
  void store_fp8(int64_t layer, const Tensor& k, const Tensor& v) {
    const int64_t bs = g_.block_size;
    auto rows = [](const Tensor& x) {
      return x.strides()[2] == 1 && x.strides()[1] == x.size(2) ? x : x.contiguous();
    };
    const Tensor kr = rows(k), vr = rows(v);
    std::vector<int64_t> slots(plan_->slots.size());
    for (size_t t = 0; t < slots.size(); ++t) {
      const int64_t s = plan_->slots[t];
      slots[t] = s < 0 ? s : 2 * (s / bs) * bs + s % bs;
    }
    kernels::KvStoreParams p;
    p.k = kr.data<float>();
    p.v = vr.data<float>();
    p.k_token_stride = kr.strides()[0];
    p.v_token_stride = vr.strides()[0];
    p.k_cache = codes(gpu_, gpu_index(layer, 0));
    p.v_cache = codes(gpu_, gpu_index(layer, 0)) + page_;
    p.slot_mapping = slots.data();
    p.num_tokens = static_cast<int>(slots.size());
    p.num_kv_heads = static_cast<int>(c_.num_kv_heads);
    p.head_dim = static_cast<int>(c_.head_dim);
    p.page_size = static_cast<int>(bs);
    p.num_pages = static_cast<int>(2 * g_.num_gpu_blocks - 1);  // the last V page ends the cache
    p.dtype = DType::kF32;
    p.kv_format = KvCacheFormat::kFp8E4M3;
    p.k_scale = scales(gpu_, gpu_index(layer, 0));
    p.v_scale = scales(gpu_, gpu_index(layer, 0)) + c_.num_kv_heads;
    kernels::cpu::kv_store(p);
  }
  int32_t last_page_len(int32_t kv_len) const {
    const int32_t bs = static_cast<int32_t>(g_.block_size);
    return kv_len == 0 ? 0 : (kv_len - 1) % bs + 1;
  }

  // The write-back queue in issue order (the copy engine is one stream).
  void land_next() {
    PendingWriteBack& w = pending_.front();
    for (const BlockMove& m : w.moves)
      for (int64_t l = 0; l < g_.num_layers; ++l)
        move_blocks(host_, host_index(l, m.host), gpu_, gpu_index(l, m.gpu), 1);
    landed_ = std::max(landed_, w.ticket);
    pending_.pop_front();
  }
  void issue(uint64_t ticket, const std::vector<BlockMove>& moves) {
    LONGCTX_CHECK(ticket > issued_, ErrorCode::kInternal,
                  "KV offload: write-back ticket {} issued after ticket {}", ticket, issued_);
    issued_ = ticket;
    pending_.push_back({ticket, step_, moves});
  }
  // A wait on a ticket not issued yet is a planning bug (the GPU could not wait on it).
  void land_until(uint64_t ticket) {
    LONGCTX_CHECK(ticket <= issued_, ErrorCode::kInternal,
                  "KV offload: wait for write-back ticket {} before it was issued (last {})",
                  ticket, issued_);
    while (!pending_.empty() && pending_.front().ticket <= ticket) land_next();
  }

  // Paged params over `buf`'s blocks from `block` on (pages 2b: K, 2b + 1: V of block b).
  PagedPrefillParams params(const float* q, const Buffer& buf, int64_t block,
                            const std::vector<int32_t>& qo, const std::vector<int32_t>& kv_indptr,
                            const std::vector<int32_t>& pages, const std::vector<int32_t>& last,
                            MaskMode mask) {
    return params(q, codes(buf, block), scales(buf, block), qo, kv_indptr, pages, last, mask);
  }
  // `cache`: f32 elements, or FP8 codes with `scale` ([blocks][K, V][Hkv]).
  PagedPrefillParams params(const float* q, void* cache, const float* scale,
                            const std::vector<int32_t>& qo, const std::vector<int32_t>& kv_indptr,
                            const std::vector<int32_t>& pages, const std::vector<int32_t>& last,
                            MaskMode mask) {
    PagedPrefillParams p;
    p.q = q;
    p.k_cache = cache;
    // K and V of a block are adjacent: page 2b is K, 2b + 1 V.
    p.v_cache = static_cast<std::byte*>(cache) + page_ * esize_;
    if (scale != nullptr) {
      p.kv_format = KvCacheFormat::kFp8E4M3;
      p.k_scale = scale;
      p.v_scale = scale + c_.num_kv_heads;
    }
    p.o = part_o_.data();
    p.lse = part_lse_.data();
    p.qo_indptr = qo.data();
    p.kv_indptr = kv_indptr.data();
    p.kv_indices = pages.data();
    p.kv_last_page_len = last.data();
    p.batch_size = static_cast<int>(last.size());
    p.num_qo_heads = static_cast<int>(c_.num_qo_heads);
    p.num_kv_heads = static_cast<int>(c_.num_kv_heads);
    p.head_dim = static_cast<int>(c_.head_dim);
    p.page_size = static_cast<int>(g_.block_size);
    p.dtype = DType::kF32;
    p.mask_mode = mask;
    p.sm_scale = c_.sm_scale;
    return p;
  }

  void accumulate(int64_t row_begin, int num_rows, bool init) {
    kernels::StateAccumulateParams a;
    a.acc_o = acc_o_.data() + row_begin * c_.num_qo_heads * c_.head_dim;
    a.acc_lse = acc_lse_.data() + row_begin * c_.num_qo_heads;
    a.o = part_o_.data() + row_begin * c_.num_qo_heads * c_.head_dim;
    a.lse = part_lse_.data() + row_begin * c_.num_qo_heads;
    a.num_rows = num_rows;
    a.num_heads = static_cast<int>(c_.num_qo_heads);
    a.head_dim = static_cast<int>(c_.head_dim);
    a.dtype = DType::kF32;
    a.init = init;
    kernels::cpu::accumulate_state(a);
  }

  OffloadDeviceConfig c_;
  OffloadGeometry g_;
  int64_t page_ = 0;
  int64_t esize_ = 4;  // bytes of an element: f32, or 1 for FP8 codes
  Buffer host_;        // [layers * host blocks] blocks: [layer][block][K, V][bs, Hkv, d]
  Buffer gpu_;         // [layers * gpu blocks], the same layout
  Buffer ring_;        // [slots * slot_blocks]: [slot][block][K, V][bs, Hkv, d]
  std::vector<Slot> slots_;
  std::deque<PendingWriteBack> pending_;
  uint64_t landed_ = 0, issued_ = 0;
  uint64_t step_ = 0;
  const OffloadStepPlan* plan_ = nullptr;
  Tensor q_;
  std::vector<float> acc_o_, acc_lse_, part_o_, part_lse_;
};

}  // namespace

OffloadDeviceParts make_cpu_offload_device(const OffloadDeviceConfig& config) {
  auto ring = std::make_unique<CpuOffloadDevice>(config);
  OffloadDeviceParts parts;
  parts.sparse = make_cpu_offload_sparse(config, ring->memory());
  parts.ring = std::move(ring);
  return parts;
}

}  // namespace longctx
