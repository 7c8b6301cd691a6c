// The CPU simulation of the offload device: the same plans as the CUDA device, with plain memory
// for the host pool, the GPU cache and the ring, memcpy as the copy engine and the reference
// kernels. It checks what the GPU cannot see: a slot loaded while its last reader has not
// released it, or read before its load, throws; a write-back lands cpu_write_back_lag steps late
// (reading the GPU block then), unless a load or a reuse waits for its ticket first, so a missing
// wait in a plan gives stale K/V and the tests that compare with the resident path fail.
// Quest (--sparse-policy quest) runs through the reference kernels of the GPU path
// (kernels/cpu/quest_cpu.h) with pages of one KV block (the CPU engine's granularity): host pages
// are read from the host pool in place, so a sparse step that forgot a write-back's ticket reads
// stale keys here too.
// XAttention (--sparse-policy xattention) takes the steps with a prefill: per sequence the
// estimate reads the keys of every block (host blocks in place), the policy picks the chunk's
// mask, and only the blocks some head keeps have their values read; the masked attention is the
// resident CPU engine's (kernels::cpu::paged_prefill_ref with the policy's mask), the plan the
// CUDA device runs (xattention_offload_cuda.h).
#include <algorithm>
#include <cstring>
#include <deque>
#include <limits>
#include <memory>

#include "attention/backends/offload_backend.h"
#include "kernels/cpu/attention_ref.h"
#include "kernels/cpu/merge_cpu.h"
#include "kernels/cpu/quest_cpu.h"
#include "attention/sparse/sparse_policy.h"
#include "longctx/core/error.h"

namespace longctx {

namespace {

using kernels::MaskMode;
using kernels::PagedPrefillParams;

class CpuOffloadDevice final : public OffloadDevice {
 public:
  explicit CpuOffloadDevice(const OffloadDeviceConfig& c) : c_(c), g_(c.geometry) {
    LONGCTX_CHECK(c.device.is_cpu() && c.dtype == DType::kF32, ErrorCode::kInvalidArgument,
                  "KV offload (CPU): needs f32 K/V on the CPU, got {} on {}", dtype_name(c.dtype),
                  c.device.str());
    page_ = c.page_elems();
    // Untouched until used (the host pool may be large); rows are read only once written.
    host_ = Tensor::empty({g_.num_layers * g_.num_host_blocks * 2 * page_}, DType::kF32);
    gpu_ = Tensor::empty({g_.num_layers * g_.num_gpu_blocks * 2 * page_}, DType::kF32);
    ring_ = Tensor::empty({g_.num_slots * g_.slot_blocks * 2 * page_}, DType::kF32);
    slots_.resize(g_.num_slots);
    if (c.sparse.policy == "xattention") {
      sparse::KvShape shape;
      shape.num_layers = g_.num_layers;
      shape.num_blocks = g_.num_host_blocks;
      shape.block_size = g_.block_size;
      shape.num_qo_heads = c.num_qo_heads;
      shape.num_kv_heads = c.num_kv_heads;
      shape.head_dim = c.head_dim;
      shape.sm_scale = c.sm_scale;
      xattn_ = sparse::make_sparse_policy(c.sparse, shape);
    } else if (c.sparse.policy == "quest") {
      SparseOptions o = c.sparse;
      o.page_tokens = g_.block_size;
      budget_ = kernels::cpu::quest_budget_of(o);
      kernels::cpu::check_quest_budget(budget_, static_cast<int>(g_.block_size));
      quest_ = true;
      // Uninitialized, as the pool: a page's metadata is written with its first rows.
      meta_.reset(new float[static_cast<size_t>(g_.num_layers * g_.num_host_blocks * 2 *
                                                c.num_kv_heads * c.head_dim)]);
    }
  }

  bool sparse() const override { return quest_ || xattn_ != nullptr; }
  bool sparse_step(const ForwardBatch& batch, std::span<const int32_t> block_loc) const override {
    if (xattn_ == nullptr) return OffloadDevice::sparse_step(batch, block_loc);
    for (int64_t s = 0; s < batch.num_seqs(); ++s)
      if (batch.q_len(s) > 1) return true;
    return false;
  }
  int64_t sparse_host_bytes_read() const override {
    if (xattn_ != nullptr) return xattn_host_bytes_;
    return static_cast<int64_t>(host_pages_read_) * 2 * budget_.page_tokens * c_.head_dim *
           static_cast<int64_t>(sizeof(float));
  }

  void plan_sparse(const ForwardBatch& batch, std::span<const int32_t> block_loc,
                   std::span<const KVBlockCopy> copies) override {
    if (quest_) {
      const int64_t per_block = 2 * c_.num_kv_heads * c_.head_dim;
      for (const KVBlockCopy& cp : copies)
        for (int64_t l = 0; l < g_.num_layers; ++l)
          std::memcpy(meta_layer(l) + cp.dst * per_block, meta_layer(l) + cp.src * per_block,
                      per_block * sizeof(float));
      touched_ = kernels::cpu::quest_touched_pages(
          batch.slot_mapping, plan_->slots, static_cast<int>(g_.block_size), budget_.page_tokens);
    }
    batch_ = &batch;
    block_loc_.assign(block_loc.begin(), block_loc.end());
    // Host pages are read in place: after write-backs of them still in flight.
    if (!block_loc.empty() && plan_->load_wait_ticket) land_until(plan_->load_wait_ticket);
  }

  Tensor attend_sparse(int64_t layer, const Tensor& q) override {
    if (xattn_ != nullptr) return attend_xattention(layer, q);
    const ForwardBatch& b = *batch_;
    const int n = static_cast<int>(b.num_seqs());
    const int hkv = static_cast<int>(c_.num_kv_heads), d = static_cast<int>(c_.head_dim);
    int max_pages = 0;
    for (int32_t kv : b.kv_lens)
      max_pages = std::max(max_pages, kernels::quest_count(kv, budget_).num_pages);
    const int max_sel = std::min(kernels::quest_max_selected(budget_), max_pages);
    q_ = q.contiguous();
    std::vector<int32_t> selected(static_cast<size_t>(n) * hkv * max_sel);
    kernels::QuestSelectParams s;
    s.q = q_.data<float>();
    s.meta = meta_layer(layer);
    s.block_indptr = b.block_table_indptr.data();
    s.block_tables = b.block_tables.data();
    s.kv_lens = b.kv_lens.data();
    s.selected = selected.data();
    s.batch = n;
    s.num_qo_heads = static_cast<int>(c_.num_qo_heads);
    s.num_kv_heads = hkv;
    s.head_dim = d;
    s.pages_per_block = 1;
    s.max_pages = max_pages;
    s.max_selected = max_sel;
    s.budget = budget_;
    s.per_head = c_.sparse.per_head;
    s.dtype = DType::kF32;
    kernels::cpu::quest_select(s);
    const int64_t rows = int64_t(max_sel) * budget_.page_tokens;
    std::vector<float> ck(static_cast<size_t>(n * rows * hkv * d)), cv(ck.size());
    kernels::QuestGatherParams g;
    g.k_base[0] = gpu_block(layer, 0);
    g.v_base[0] = gpu_block(layer, 0) + page_;
    g.k_base[1] = host_block(layer, 0);
    g.v_base[1] = host_block(layer, 0) + page_;
    g.block_stride[0] = g.block_stride[1] = 2 * page_;
    g.block_indptr = b.block_table_indptr.data();
    g.block_loc = block_loc_.data();
    g.kv_lens = b.kv_lens.data();
    g.selected = selected.data();
    g.out_k = ck.data();
    g.out_v = cv.data();
    g.memory1_pages = &host_pages_read_;
    g.batch = n;
    g.num_kv_heads = hkv;
    g.head_dim = d;
    g.pages_per_block = 1;
    g.max_selected = max_sel;
    g.budget = budget_;
    g.dtype = DType::kF32;
    kernels::cpu::quest_gather(g);
    // Attention over the compact buffer: sequence b is one page of max_sel blocks.
    std::vector<int32_t> qo(n + 1), indptr(n + 1), pages(n), last(n);
    for (int i = 0; i < n; ++i) {
      qo[i + 1] = indptr[i + 1] = i + 1;
      pages[i] = i;
      last[i] = kernels::cpu::quest_compact_len(b.kv_lens[i], budget_);
    }
    Tensor o = Tensor::empty({q.size(0), c_.num_qo_heads * c_.head_dim}, DType::kF32);
    PagedPrefillParams p =
        params(q_.data<float>(), ck.data(), qo, indptr, pages, last, MaskMode::kNone);
    p.v_cache = cv.data();
    p.o = o.data<float>();
    p.lse = nullptr;
    p.page_size = static_cast<int>(rows);
    kernels::cpu::paged_prefill_ref(p);
    return o;
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
        std::memcpy(gpu_block(l, dst), gpu_block(l, src), 2 * page_ * sizeof(float));
    if (!plan.loads.empty() && plan.load_wait_ticket) land_until(plan.load_wait_ticket);
    for (const BlockMove& m : plan.loads)
      for (int64_t l = 0; l < g_.num_layers; ++l)
        std::memcpy(gpu_block(l, m.gpu), host_block(l, m.host), 2 * page_ * sizeof(float));
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
      std::memcpy(slot_block(slot, r.slot_begin), host_block(layer, r.host_begin),
                  r.count * 2 * page_ * sizeof(float));
    s = {true, layer, item};
  }

  void store_kv(int64_t layer, const Tensor& k, const Tensor& v) override {
    const int64_t hkv = c_.num_kv_heads, d = c_.head_dim, bs = g_.block_size;
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
    if (!quest_ || touched_.empty()) return;
    kernels::QuestMetaParams m;
    m.k_cache = gpu_block(layer, 0);
    m.block_stride = 2 * page_;
    m.meta = meta_layer(layer);
    m.pages = touched_.data();
    m.num_pages = static_cast<int>(touched_.size() / 4);
    m.num_kv_heads = static_cast<int>(hkv);
    m.head_dim = static_cast<int>(d);
    m.page_tokens = budget_.page_tokens;
    m.pages_per_block = 1;
    m.dtype = DType::kF32;
    kernels::cpu::quest_meta_update(m);
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
    PagedPrefillParams p = params(q_.data<float>(), gpu_block(layer, 0), qo, plan_->kv_indptr,
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
    PagedPrefillParams p = params(q_.data<float>() + it.row_begin * row, slot_block(slot, 0),
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

  // One prefill step under XAttention: per sequence, K of every block (the estimate's read),
  // the policy's mask, V of the blocks the mask keeps, masked causal attention.
  Tensor attend_xattention(int64_t layer, const Tensor& q) {
    const ForwardBatch& b = *batch_;
    const int64_t bs = g_.block_size, q_row = c_.num_qo_heads * c_.head_dim;
    q_ = q.contiguous();
    Tensor o = Tensor::empty({q.size(0), q_row}, DType::kF32);
    for (int64_t s = 0; s < b.num_seqs(); ++s) {
      const int64_t kv_len = b.kv_lens[s], n = b.q_len(s), q0 = b.qo_indptr[s];
      const int32_t nb = static_cast<int32_t>((kv_len + bs - 1) / bs);
      const int32_t* loc = block_loc_.data() + b.block_table_indptr[s];
      std::vector<int32_t> blocks(nb);
      for (int32_t j = 0; j < nb; ++j) blocks[j] = j;
      // [nb, bs, Hkv, d] each: the sequence's blocks in table order (rows past kv_len unread).
      std::vector<float> k(static_cast<size_t>(nb * page_)), v(k.size());
      for (int32_t j = 0; j < nb; ++j) read_half(layer, loc[j], 0, k.data() + j * page_);
      const float* qs = q_.data<float>() + q0 * q_row;
      sparse::PrefillMask mask;
      if (n > 1)
        mask = xattn_->select_prefill(layer, qs, q_row, n, {blocks.data(), kv_len, k.data()});
      for (int32_t j = 0; j < nb; ++j)
        if (mask.all() || mask_keeps(mask, j * bs, std::min<int64_t>((j + 1) * bs, kv_len)))
          read_half(layer, loc[j], 1, v.data() + j * page_);
      const std::vector<int32_t> qo = {0, static_cast<int32_t>(n)}, kv_indptr = {0, nb},
                                 last = {last_page_len(static_cast<int32_t>(kv_len))};
      const int64_t mask_indptr[2] = {0, static_cast<int64_t>(mask.mask.size())};
      PagedPrefillParams p = params(qs, k.data(), qo, kv_indptr, blocks, last, MaskMode::kCausal);
      p.v_cache = v.data();
      p.o = o.data<float>() + q0 * q_row;
      p.lse = nullptr;
      if (!mask.all()) {
        p.block_mask = mask.mask.data();
        p.block_mask_indptr = mask_indptr;
        p.block_mask_heads = static_cast<int>(c_.num_qo_heads);
      }
      kernels::cpu::paged_prefill_ref(p);
    }
    return o;
  }

  float* meta_layer(int64_t layer) {
    return meta_.get() + layer * g_.num_host_blocks * 2 * c_.num_kv_heads * c_.head_dim;
  }
  float* host_block(int64_t layer, int32_t b) {
    return host_.data<float>() + (layer * g_.num_host_blocks + b) * 2 * page_;
  }
  float* gpu_block(int64_t layer, int32_t b) {
    return gpu_.data<float>() + (layer * g_.num_gpu_blocks + b) * 2 * page_;
  }
  float* slot_block(int64_t slot, int32_t b) {
    return ring_.data<float>() + (slot * g_.slot_blocks + b) * 2 * page_;
  }
  // K (half 0) or V (half 1) of a sequence's block at `loc` (GPU block g >= 0, or host block h
  // as -h - 1; host blocks are read in place and counted).
  void read_half(int64_t layer, int32_t loc, int half, float* dst) {
    const float* src = loc >= 0 ? gpu_block(layer, loc) : host_block(layer, -loc - 1);
    std::memcpy(dst, src + half * page_, page_ * sizeof(float));
    if (loc < 0) xattn_host_bytes_ += page_ * static_cast<int64_t>(sizeof(float));
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
  int32_t last_page_len(int32_t kv_len) const {
    const int32_t bs = static_cast<int32_t>(g_.block_size);
    return kv_len == 0 ? 0 : (kv_len - 1) % bs + 1;
  }

  // The write-back queue in issue order (the copy engine is one stream).
  void land_next() {
    PendingWriteBack& w = pending_.front();
    for (const BlockMove& m : w.moves)
      for (int64_t l = 0; l < g_.num_layers; ++l)
        std::memcpy(host_block(l, m.host), gpu_block(l, m.gpu), 2 * page_ * sizeof(float));
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

  PagedPrefillParams params(const float* q, float* cache, const std::vector<int32_t>& qo,
                            const std::vector<int32_t>& kv_indptr,
                            const std::vector<int32_t>& pages, const std::vector<int32_t>& last,
                            MaskMode mask) {
    PagedPrefillParams p;
    p.q = q;
    p.k_cache = cache;
    p.v_cache = cache + page_;  // K and V of a block are adjacent: page 2b is K, 2b + 1 V
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
  Tensor host_;  // [layers * host blocks * 2 * page] f32: [layer][block][K, V][bs, Hkv, d]
  Tensor gpu_;   // [layers * gpu blocks * 2 * page] f32, the same layout
  Tensor ring_;  // [slots * slot_blocks * 2 * page] f32: [slot][block][K, V][bs, Hkv, d]
  std::vector<Slot> slots_;
  std::deque<PendingWriteBack> pending_;
  uint64_t landed_ = 0, issued_ = 0;
  uint64_t step_ = 0;
  const OffloadStepPlan* plan_ = nullptr;
  Tensor q_;
  std::vector<float> acc_o_, acc_lse_, part_o_, part_lse_;
  // xattention
  std::unique_ptr<sparse::SparsePolicy> xattn_;
  int64_t xattn_host_bytes_ = 0;  // host K/V bytes read in place by xattention steps
  // quest
  bool quest_ = false;
  kernels::QuestBudget budget_;
  std::unique_ptr<float[]> meta_;   // [layers][host blocks][Hkv][min, max][d]
  std::vector<int32_t> touched_;    // this step's pages (QuestMetaParams::pages)
  std::vector<int32_t> block_loc_;  // a decode step's block locations
  const ForwardBatch* batch_ = nullptr;
  unsigned long long host_pages_read_ = 0;  // pages (of one KV head) gathered from the host pool
};

}  // namespace

std::unique_ptr<OffloadDevice> make_cpu_offload_device(const OffloadDeviceConfig& config) {
  return std::make_unique<CpuOffloadDevice>(config);
}

}  // namespace longctx
