#include <algorithm>
#include <utility>

#include "attention/backends/phase_profile.h"
#include "attention/backends/quest_cuda.h"
#include "attention/sparse/policies.h"
#include "kernels/cpu/quest_cpu.h"
#include "kernels/cuda/paged_generic.h"
#include "kernels/cuda/quest.h"
#include "longctx/core/cuda_check.h"
#include "longctx/core/device_memory.h"
#include "longctx/core/error.h"

namespace longctx {

namespace {

struct Sizes {
  int64_t pages_per_block, max_pages, max_selected, meta_block_bytes;
};

Sizes sizes_of(const QuestCudaConfig& c) {
  const kernels::QuestBudget b = c.budget;
  if (c.scored)
    kernels::cpu::check_quest_budget(b, static_cast<int>(c.block_size));
  else
    LONGCTX_CHECK(b.page_tokens >= 1 && c.block_size % b.page_tokens == 0 && b.window_tokens >= 1,
                  ErrorCode::kInvalidArgument,
                  "--sparse-page {} must be positive and divide the KV block size {}",
                  b.page_tokens, c.block_size);
  Sizes s;
  s.pages_per_block = c.block_size / b.page_tokens;
  s.max_pages = (c.max_model_len + b.page_tokens - 1) / b.page_tokens;
  s.max_selected = std::min<int64_t>(kernels::quest_max_selected(b), s.max_pages);
  s.meta_block_bytes = c.scored ? s.pages_per_block * c.num_kv_heads * 2 * c.head_dim *
                                      static_cast<int64_t>(dtype_size(c.dtype))
                                : 0;
  return s;
}

int64_t quest_bytes(const QuestCudaConfig& c) {
  const kernels::QuestBytes b = kernels::quest_gpu_bytes(
      c.budget, c.num_layers, c.block_size, c.num_kv_heads, c.head_dim,
      static_cast<int64_t>(dtype_size(c.dtype)), c.max_seqs, c.max_model_len, c.reuse_seqs);
  return b.per_block * c.num_blocks + b.fixed;
}

// A [1] u64 device counter's value (synchronizes).
int64_t read_counter(const Tensor& counter) {
  int64_t n = 0;
  LONGCTX_CUDA_CHECK(cudaMemcpy(&n, counter.data_ptr(), sizeof(n), cudaMemcpyDeviceToHost));
  return n;
}

}  // namespace

QuestCudaConfig quest_cuda_config(const sparse::SparseCudaConfig& c,
                                  const kernels::QuestBudget& budget, bool scored) {
  QuestCudaConfig q;
  q.budget = budget;
  q.per_head = c.options.per_head;
  q.scored = scored;
  q.num_layers = c.num_layers;
  q.num_blocks = c.num_blocks;
  q.block_size = c.block_size;
  q.num_qo_heads = c.num_qo_heads;
  q.num_kv_heads = c.num_kv_heads;
  q.head_dim = c.head_dim;
  q.dtype = c.dtype;
  q.kv_format = c.kv_format;
  q.sm_scale = c.sm_scale;
  q.device = c.device;
  q.max_seqs = c.max_seqs;
  q.max_model_len = c.max_seq_len;
  q.tuning = c.tuning;
  q.reuse_seqs = scored ? sparse::quest_reuse_seqs(c.options, c.max_seqs) : 0;
  return q;
}

QuestCuda::QuestCuda(const QuestCudaConfig& c) : c_(c), words_(c.device) {
  LONGCTX_CHECK(c.num_layers > 0 && c.num_blocks > 0 && c.max_seqs > 0 && c.max_model_len > 0 &&
                    c.num_kv_heads > 0 && c.num_qo_heads % c.num_kv_heads == 0,
                ErrorCode::kInvalidArgument, "quest: bad cache shape");
  budget_ = c.budget;
  const Sizes s = sizes_of(c);
  pages_per_block_ = s.pages_per_block;
  max_pages_ = s.max_pages;
  max_selected_ = s.max_selected;
  meta_block_bytes_ = s.meta_block_bytes;
  generic_ = !(c.head_dim == 64 || c.head_dim == 128) ||
             c.tuning.attention == kernels::AttentionKernel::kGeneric;
  const int64_t page = budget_.page_tokens;
  try {
    if (c.scored) {
      meta_ =
          Tensor::empty({c.num_layers * c.num_blocks * meta_block_bytes_}, DType::kU8, c.device);
      scores_ = Tensor::empty({c.max_seqs * c.num_kv_heads * max_pages_}, DType::kF32, c.device);
    }
    selected_ = Tensor::empty({c.max_seqs * c.num_kv_heads * max_selected_}, DType::kI32, c.device);
    const int64_t compact = c.max_seqs * max_selected_ * page * c.num_kv_heads * c.head_dim;
    compact_k_ = Tensor::empty({compact}, c.dtype, c.device);
    compact_v_ = Tensor::empty({compact}, c.dtype, c.device);
    if (!generic_)
      decode_ws_ =
          Tensor::empty({static_cast<int64_t>(kernels::cuda::decode_workspace_bytes(
                            static_cast<int>(c.max_seqs), static_cast<int>(c.num_qo_heads),
                            static_cast<int>(c.num_kv_heads), static_cast<int>(c.head_dim)))},
                        DType::kU8, c.device);
    memory1_pages_ = Tensor::zeros({1}, DType::kI64, c.device);
    reused_pages_ = Tensor::zeros({1}, DType::kI64, c.device);
    if (c.reuse_seqs > 0) {
      LONGCTX_CHECK(c.scored, ErrorCode::kInvalidArgument, "quest: page reuse without scores");
      const int64_t slots = c.num_layers * c.reuse_seqs;
      kept_k_ = Tensor::empty({slots * max_selected_ * page * c.num_kv_heads * c.head_dim}, c.dtype,
                              c.device);
      kept_v_ = Tensor::empty({kept_k_.numel()}, c.dtype, c.device);
      kept_pages_ = Tensor::empty({slots * c.num_kv_heads * max_selected_}, DType::kI32, c.device);
      // Block ids -1 (never a hit) until a slot is first kept.
      std::vector<int32_t> none(static_cast<size_t>(kept_pages_.numel()), -1);
      kept_blocks_ =
          Tensor::from_blob(none.data(), {kept_pages_.numel()}, DType::kI32).to(c.device);
      reuse_slots_ = kernels::cpu::QuestReuseSlots(c.reuse_seqs);
    }
    layout_ = kernels::cpu::quest_decode_layout(
        c.max_seqs, c.max_seqs * ((c.max_model_len + c.block_size - 1) / c.block_size),
        c.max_seqs * touched_per_token());
    decode_words_ = std::make_unique<StagedWords>(c.device, layout_.total);
  } catch (const Error& e) {
    LONGCTX_THROW(ErrorCode::kOutOfMemory,
                  "quest: cannot allocate {} of GPU memory for the page metadata and the "
                  "selection buffers (lower --max-num-seqs or --sparse-budget): {}",
                  format_bytes(quest_bytes(c)), e.what());
  }
}

void* QuestCuda::meta_layer(int64_t layer) const {
  if (!c_.scored) return nullptr;  // the select kernel reads no metadata without free pages
  return static_cast<char*>(meta_.data_ptr()) + layer * c_.num_blocks * meta_block_bytes_;
}

bool QuestCuda::plan(const ForwardBatch& batch, std::span<const int64_t> cache_slots,
                     std::span<const int32_t> block_loc, cudaStream_t stream) {
  const int64_t bs = c_.block_size, page = budget_.page_tokens;
  std::vector<int32_t> pages = kernels::cpu::quest_touched_pages(
      batch.slot_mapping, cache_slots, static_cast<int>(bs), static_cast<int>(page),
      /*block_prefix=*/fp8());
  num_pages_ = static_cast<int64_t>(pages.size() / 4);
  decode_ = !block_loc.empty();
  batch_ = static_cast<int>(batch.num_seqs());
  if (!decode_) {  // the metadata only (and no sequence keeps its pages over this step)
    reuse_slots_.other_step();
    words_.begin();
    pages_at_ = words_.put(pages);
    words_.upload(stream);
    step_words_ = &words_;
    return false;
  }
  LONGCTX_CHECK(batch.num_seqs() <= c_.max_seqs && block_loc.size() == batch.block_tables.size() &&
                    static_cast<int64_t>(block_loc.size()) <= layout_.max_entries,
                ErrorCode::kInternal,
                "quest: {} sequences (max {}), {} block codes for {} blocks (max {})",
                batch.num_seqs(), c_.max_seqs, block_loc.size(), batch.block_tables.size(),
                layout_.max_entries);
  if (batch.fixed_launch_shapes) {  // a graph's: the metadata launch's count is fixed
    pages = kernels::cpu::quest_fixed_pages(std::move(pages), batch_, touched_per_token());
    num_pages_ = static_cast<int64_t>(pages.size() / 4);
  }
  LONGCTX_CHECK(num_pages_ <= layout_.max_touched, ErrorCode::kInternal,
                "quest: {} touched pages in a decode step (room for {})", num_pages_,
                layout_.max_touched);
  // The compact decode: sequence b is page b of max_selected * page tokens.
  std::vector<int32_t> indptr(batch_ + 1), indices(batch_), last(batch_), qo(batch_ + 1);
  for (int b = 0; b < batch_; ++b) {
    const int32_t kv = batch.kv_lens[b];
    LONGCTX_CHECK(batch.q_len(b) == 1 && kv >= 1 && kv <= max_pages_ * page, ErrorCode::kInternal,
                  "quest: sequence {} decodes {} rows over {} keys", b, batch.q_len(b), kv);
    indptr[b + 1] = b + 1;
    indices[b] = b;
    qo[b + 1] = b + 1;
    last[b] = kernels::cpu::quest_compact_len(kv, budget_);
    LONGCTX_CHECK(c_.scored || kernels::quest_count(kv, budget_).num_free == 0,
                  ErrorCode::kInternal,
                  "page-list decode without scores: {} keys pick {} free "
                  "pages",
                  kv, kernels::quest_count(kv, budget_).num_free);
  }
  // Every array at its fixed offset: a graph captured over one decode step reads the next's.
  StagedWords& w = *decode_words_;
  const kernels::cpu::QuestDecodeLayout& l = layout_;
  w.begin();
  lens_at_ = w.put_at(l.lens, batch.kv_lens);
  indptr_at_ = w.put_at(l.indptr, batch.block_table_indptr);
  dec_indptr_at_ = w.put_at(l.dec_indptr, indptr);
  dec_indices_at_ = w.put_at(l.dec_indices, indices);
  dec_last_at_ = w.put_at(l.dec_last, last);
  qo_at_ = w.put_at(l.qo, qo);
  pages_at_ = w.put_at(l.pages, pages);
  tables_at_ = w.put_at(l.tables, batch.block_tables);
  loc_at_ = w.put_at(l.loc, block_loc);
  if (c_.reuse_seqs > 0) {
    reuse_slots_.decode_step(batch.seq_ids, batch_, batch.num_padding_seqs, reuse_read_,
                             reuse_write_);
    reuse_read_at_ = w.put_at(l.reuse_read, reuse_read_);
    reuse_write_at_ = w.put_at(l.reuse_write, reuse_write_);
  }
  step_words_ = &w;
  if (!generic_) {
    // Padding sequences (a graph's) leave the real ones' split as a plan of them alone makes it.
    kernels::cuda::DecodeGraphMode graph;
    graph.num_padding = batch.num_padding_seqs;
    decode_plan_ = kernels::cuda::decode_plan(
        indptr.data(), last.data(), batch_, static_cast<int>(max_selected_ * page),
        static_cast<int>(c_.num_qo_heads), static_cast<int>(c_.num_kv_heads),
        static_cast<int>(c_.head_dim), decode_ws_.data_ptr(), decode_ws_.numel(), stream,
        /*num_sms=*/0, /*min_chunk_tokens=*/256, graph, c_.tuning.decode);
  }
  w.upload(stream);
  return true;
}

int64_t QuestCuda::decode_grid() const {
  return decode_ && !generic_ ? kernels::cuda::decode_grid_ctas(decode_plan_) : 0;
}

int64_t QuestCuda::pages_reused() const { return read_counter(reused_pages_); }

int64_t QuestCuda::memory1_bytes_read() const {
  const int64_t pages = read_counter(memory1_pages_);
  // FP8: a page's codes and its K and V scales (one float each per KV head).
  const int64_t page_bytes =
      fp8() ? 2 * (budget_.page_tokens * c_.head_dim + int64_t(sizeof(float)))
            : 2 * budget_.page_tokens * c_.head_dim * static_cast<int64_t>(dtype_size(c_.dtype));
  return pages * page_bytes;
}

void QuestCuda::on_keys_stored(int64_t layer, const sparse::PageMemory& keys, cudaStream_t stream) {
  if (!c_.scored || num_pages_ == 0) return;
  kernels::QuestMetaParams p;
  p.k_cache = keys.k;
  p.block_stride = keys.block_stride;
  if (fp8()) {
    p.kv_format = kernels::KvCacheFormat::kFp8E4M3;
    p.k_scale = keys.k_scale;
    p.scale_block_stride = keys.scale_block_stride;
  }
  p.meta = meta_layer(layer);
  p.pages = dev(pages_at_);
  p.num_pages = static_cast<int>(num_pages_);
  p.num_kv_heads = static_cast<int>(c_.num_kv_heads);
  p.head_dim = static_cast<int>(c_.head_dim);
  p.page_tokens = budget_.page_tokens;
  p.pages_per_block = static_cast<int>(pages_per_block_);
  p.dtype = c_.dtype;
  kernels::cuda::quest_meta_run(p, stream);
}

void QuestCuda::copy_blocks(std::span<const KVBlockCopy> copies, cudaStream_t stream) {
  if (!c_.scored) return;
  const size_t pitch = static_cast<size_t>(c_.num_blocks * meta_block_bytes_);
  char* base = static_cast<char*>(meta_.data_ptr());
  for (const KVBlockCopy& cp : copies) {
    LONGCTX_CHECK(cp.src >= 0 && cp.src < c_.num_blocks && cp.dst >= 0 && cp.dst < c_.num_blocks,
                  ErrorCode::kInternal, "quest: block copy {} -> {} outside {} blocks", cp.src,
                  cp.dst, c_.num_blocks);
    LONGCTX_CUDA_CHECK(cudaMemcpy2DAsync(
        base + cp.dst * meta_block_bytes_, pitch, base + cp.src * meta_block_bytes_, pitch,
        static_cast<size_t>(meta_block_bytes_), c_.num_layers, cudaMemcpyDeviceToDevice, stream));
  }
}

void QuestCuda::attend_decode(int64_t layer, const void* q, void* o, float* o_f32,
                              const Memory (&mem)[2], cudaStream_t stream) {
  LONGCTX_CHECK(decode_, ErrorCode::kInternal, "quest: attend on a step that is not a decode");
  auto mark = [&](AttentionPhase phase) {
    if (recorder_ != nullptr) recorder_->mark(phase);
  };
  mark(AttentionPhase::kAttendOther);
  kernels::QuestSelectParams s;
  s.q = q;
  s.meta = meta_layer(layer);
  s.block_indptr = dev(indptr_at_);
  s.block_tables = dev(tables_at_);
  s.kv_lens = dev(lens_at_);
  s.scores = c_.scored ? scores_.data<float>() : nullptr;  // mode 2 only, never without scores
  s.selected = selected_.data<int32_t>();
  s.batch = batch_;
  s.num_qo_heads = static_cast<int>(c_.num_qo_heads);
  s.num_kv_heads = static_cast<int>(c_.num_kv_heads);
  s.head_dim = static_cast<int>(c_.head_dim);
  s.pages_per_block = static_cast<int>(pages_per_block_);
  s.max_pages = static_cast<int>(max_pages_);
  s.max_selected = static_cast<int>(max_selected_);
  s.budget = budget_;
  s.per_head = c_.per_head;
  s.dtype = c_.dtype;
  kernels::cuda::quest_select_run(s, stream);
  mark(AttentionPhase::kSelect);

  kernels::QuestGatherParams g;
  for (int m = 0; m < 2; ++m) {
    g.k_base[m] = mem[m].k;
    g.v_base[m] = mem[m].v;
    g.block_stride[m] = mem[m].block_stride;
    g.k_scale[m] = mem[m].k_scale;
    g.v_scale[m] = mem[m].v_scale;
    g.scale_block_stride[m] = mem[m].scale_block_stride;
  }
  g.kv_format = c_.kv_format;
  g.block_indptr = dev(indptr_at_);
  g.block_loc = dev(loc_at_);
  g.kv_lens = dev(lens_at_);
  g.selected = selected_.data<int32_t>();
  g.out_k = compact_k_.data_ptr();
  g.out_v = compact_v_.data_ptr();
  g.memory1_pages = reinterpret_cast<unsigned long long*>(memory1_pages_.data_ptr());
  g.batch = batch_;
  g.num_kv_heads = s.num_kv_heads;
  g.head_dim = s.head_dim;
  g.pages_per_block = s.pages_per_block;
  g.max_selected = s.max_selected;
  g.budget = budget_;
  g.dtype = c_.dtype;
  const int64_t kept_rows = c_.reuse_seqs * max_selected_ * budget_.page_tokens * c_.num_kv_heads *
                            c_.head_dim;  // elements of a layer's slots
  const int64_t kept_list = c_.reuse_seqs * c_.num_kv_heads * max_selected_;
  const size_t es = dtype_size(c_.dtype);
  if (c_.reuse_seqs > 0) {
    g.reuse_read = dev(reuse_read_at_);
    g.block_ids = dev(tables_at_);
    g.kept_pages = kept_pages_.data<int32_t>() + layer * kept_list;
    g.kept_blocks = kept_blocks_.data<int32_t>() + layer * kept_list;
    g.kept_k = static_cast<const char*>(kept_k_.data_ptr()) + layer * kept_rows * es;
    g.kept_v = static_cast<const char*>(kept_v_.data_ptr()) + layer * kept_rows * es;
    g.reused_pages = reinterpret_cast<unsigned long long*>(reused_pages_.data_ptr());
  }
  kernels::cuda::quest_gather_run(g, stream);
  if (c_.reuse_seqs > 0) {
    // Before the decode (whose launch is the layer's last, which the graphs' updates find): the
    // gather above read the slots, this step's pages replace them.
    kernels::QuestKeepParams k;
    k.compact_k = compact_k_.data_ptr();
    k.compact_v = compact_v_.data_ptr();
    k.kept_k = static_cast<char*>(kept_k_.data_ptr()) + layer * kept_rows * es;
    k.kept_v = static_cast<char*>(kept_v_.data_ptr()) + layer * kept_rows * es;
    k.kept_pages = kept_pages_.data<int32_t>() + layer * kept_list;
    k.kept_blocks = kept_blocks_.data<int32_t>() + layer * kept_list;
    k.reuse_write = dev(reuse_write_at_);
    k.selected = selected_.data<int32_t>();
    k.block_indptr = dev(indptr_at_);
    k.block_ids = dev(tables_at_);
    k.kv_lens = dev(lens_at_);
    k.batch = batch_;
    k.num_kv_heads = s.num_kv_heads;
    k.head_dim = s.head_dim;
    k.pages_per_block = s.pages_per_block;
    k.max_selected = s.max_selected;
    k.budget = budget_;
    k.dtype = c_.dtype;
    k.whole_blocks = fp8();
    kernels::cuda::quest_keep_run(k, stream);
  }
  mark(AttentionPhase::kGather);

  const int page_size = static_cast<int>(max_selected_ * budget_.page_tokens);
  if (!generic_) {
    kernels::DecodeParams d;
    d.q = q;
    d.k_cache = compact_k_.data_ptr();
    d.v_cache = compact_v_.data_ptr();
    d.o = o;
    d.o_f32 = o_f32;
    d.kv_indptr = dev(dec_indptr_at_);
    d.kv_indices = dev(dec_indices_at_);
    d.kv_last_page_len = dev(dec_last_at_);
    d.batch_size = batch_;
    d.num_qo_heads = s.num_qo_heads;
    d.num_kv_heads = s.num_kv_heads;
    d.head_dim = s.head_dim;
    d.page_size = page_size;
    d.dtype = c_.dtype;
    d.sm_scale = c_.sm_scale;
    kernels::cuda::decode_run(d, decode_plan_, stream);
    mark(AttentionPhase::kDecode);
    return;
  }
  kernels::PagedPrefillParams p;
  p.q = q;
  p.k_cache = compact_k_.data_ptr();
  p.v_cache = compact_v_.data_ptr();
  p.o = o;
  p.o_f32 = o_f32;
  p.qo_indptr = dev(qo_at_);
  p.kv_indptr = dev(dec_indptr_at_);
  p.kv_indices = dev(dec_indices_at_);
  p.kv_last_page_len = dev(dec_last_at_);
  p.batch_size = batch_;
  p.num_qo_heads = s.num_qo_heads;
  p.num_kv_heads = s.num_kv_heads;
  p.head_dim = s.head_dim;
  p.page_size = page_size;
  p.dtype = c_.dtype;
  p.mask_mode = kernels::MaskMode::kNone;
  p.sm_scale = c_.sm_scale;
  kernels::cuda::paged_generic_run(p, batch_, stream);
  mark(AttentionPhase::kDecode);
}

}  // namespace longctx
