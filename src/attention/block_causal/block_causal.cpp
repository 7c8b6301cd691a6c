#include "longctx/attention/block_causal.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "attention/block_causal/block_causal_cuda.h"
#include "kernels/attention_params.h"
#include "kernels/cpu/attention_ref.h"
#include "longctx/core/error.h"

namespace longctx {

namespace {

void check_block_size(int64_t block_size) {
  LONGCTX_CHECK(block_size > 0, ErrorCode::kInvalidArgument,
                "block-causal attention: block_size must be > 0, got {}", block_size);
}

// Sum of the prefix lengths of one span of `len` tokens: its blocks' key counts.
int64_t span_prefix_sum(int64_t len, int64_t block_size) {
  int64_t full = len / block_size;  // blocks with a prefix of (i + 1) * B, i < full
  int64_t sum = block_size * full * (full + 1) / 2;
  if (len % block_size) sum += len;  // the last, partial block sees the whole span
  return sum;
}

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

}  // namespace

BlockCausalLayout block_causal_layout(const std::vector<int64_t>& seg_lens, int64_t block_size) {
  check_block_size(block_size);
  LONGCTX_CHECK(!seg_lens.empty(), ErrorCode::kInvalidArgument,
                "block-causal layout: seg_lens is empty (need at least one span)");
  BlockCausalLayout out;
  int64_t num_blocks = 0, num_indices = 0;
  for (size_t i = 0; i < seg_lens.size(); ++i) {
    LONGCTX_CHECK(seg_lens[i] > 0, ErrorCode::kInvalidArgument,
                  "block-causal layout: span {} has length {} (spans must be > 0 tokens)", i,
                  seg_lens[i]);
    num_blocks += (seg_lens[i] + block_size - 1) / block_size;
    num_indices += span_prefix_sum(seg_lens[i], block_size);
  }
  out.qo_indptr.reserve(num_blocks + 1);
  out.kv_indptr.reserve(num_blocks + 1);
  out.kv_indices.reserve(num_indices);
  out.qo_indptr.push_back(0);
  out.kv_indptr.push_back(0);
  int64_t off = 0;
  for (int64_t len : seg_lens) {
    for (int64_t start = 0; start < len; start += block_size) {
      int64_t end = std::min(start + block_size, len);
      out.qo_indptr.push_back(off + end);
      for (int64_t j = 0; j < end; ++j) out.kv_indices.push_back(off + j);
      out.kv_indptr.push_back(static_cast<int64_t>(out.kv_indices.size()));
    }
    off += len;
  }
  LONGCTX_ASSERT(int64_t(out.kv_indices.size()) == num_indices, "prefix sum mismatch");
  return out;
}

int64_t max_blocks(int64_t max_segments, int64_t max_tokens, int64_t block_size) {
  check_block_size(block_size);
  LONGCTX_CHECK(max_segments >= 0 && max_tokens >= 0, ErrorCode::kInvalidArgument,
                "max_blocks: limits must be >= 0 (max_segments {}, max_tokens {})", max_segments,
                max_tokens);
  // A span of c blocks holds >= (c - 1) * B + 1 tokens, so m spans of C blocks in total need
  // >= (C - m) * B + m tokens; more spans never hurt, and spans are non-empty.
  int64_t m = std::min(max_segments, max_tokens);
  if (m == 0) return 0;  // no span (or no token) has no block
  return m + (max_tokens - m) / block_size;
}

int64_t max_prefix_tokens(int64_t max_tokens, int64_t block_size) {
  check_block_size(block_size);
  LONGCTX_CHECK(max_tokens >= 0, ErrorCode::kInvalidArgument,
                "max_prefix_tokens: max_tokens must be >= 0, got {}", max_tokens);
  return span_prefix_sum(max_tokens, block_size);
}

// ---- RaggedBlockCausalAttention ----

size_t RaggedBlockCausalAttention::workspace_bytes(int num_qo_heads, int num_kv_heads,
                                                   int64_t max_total_tokens, int64_t block_size,
                                                   int64_t max_blocks) {
  (void)block_size;
  // Without CUDA in the build there is no CUDA instance to size (the constructor rejects one).
  if (!detail::block_causal_cuda_compiled()) return 0;
  int group = num_kv_heads > 0 ? num_qo_heads / num_kv_heads : 1;
  int64_t batch = max_blocks + 1;  // + the no-op block of graph mode
  return detail::block_causal_cuda_workspace_bytes(
      batch, max_total_tokens, group,
      detail::block_causal_cuda_work_cap(batch, max_total_tokens, group));
}

RaggedBlockCausalAttention::RaggedBlockCausalAttention(Tensor workspace,
                                                       const BlockCausalOptions& options)
    : opt_(options), workspace_(std::move(workspace)) {
  const char* who = "RaggedBlockCausalAttention";
  check_block_size(opt_.block_size);
  LONGCTX_CHECK(
      opt_.num_qo_heads > 0 && opt_.num_kv_heads > 0 && opt_.num_qo_heads % opt_.num_kv_heads == 0,
      ErrorCode::kInvalidArgument,
      "{}: num_qo_heads {} must be a positive multiple of num_kv_heads {}", who, opt_.num_qo_heads,
      opt_.num_kv_heads);
  LONGCTX_CHECK(opt_.head_dim > 0, ErrorCode::kInvalidArgument, "{}: head_dim {} must be > 0", who,
                opt_.head_dim);
  LONGCTX_CHECK(opt_.q_dtype == DType::kBF16 || opt_.q_dtype == DType::kF16,
                ErrorCode::kUnsupported, "{}: q dtype must be bf16 or f16, got {}", who,
                dtype_name(opt_.q_dtype));
  if (opt_.max_num_segments)
    LONGCTX_CHECK(*opt_.max_num_segments > 0, ErrorCode::kInvalidArgument,
                  "{}: max_num_segments must be > 0, got {}", who, *opt_.max_num_segments);
  if (opt_.max_total_tokens)
    LONGCTX_CHECK(*opt_.max_total_tokens > 0, ErrorCode::kInvalidArgument,
                  "{}: max_total_tokens must be > 0, got {}", who, *opt_.max_total_tokens);
  if (opt_.graph_mode) {
    LONGCTX_CHECK(opt_.max_num_segments && opt_.max_total_tokens, ErrorCode::kInvalidArgument,
                  "{}: graph mode needs max_num_segments and max_total_tokens (the bucket)", who);
  }
  sm_scale_ = opt_.sm_scale ? *opt_.sm_scale : 1.f / std::sqrt(float(opt_.head_dim));

  if (opt_.device.is_cuda()) {
    // First, so a build without CUDA says so rather than failing a check below; the CUDA calls
    // in plan() and run() rely on it.
    LONGCTX_CHECK(detail::block_causal_cuda_compiled(), ErrorCode::kUnsupported,
                  "{}: this build has no CUDA (device {})", who, opt_.device.str());
    int64_t block_cap = 0, index_cap = 0;
    if (opt_.max_total_tokens) {
      int64_t segs = opt_.max_num_segments ? *opt_.max_num_segments : *opt_.max_total_tokens;
      block_cap = max_blocks(segs, *opt_.max_total_tokens, opt_.block_size) + 1;
      index_cap = max_prefix_tokens(*opt_.max_total_tokens, opt_.block_size);
      LONGCTX_CHECK(index_cap <= kInt32Max, ErrorCode::kOutOfRange,
                    "{}: {} key indices exceed the kernel's int32 indexing", who, index_cap);
      size_t need = workspace_bytes(opt_.num_qo_heads, opt_.num_kv_heads, *opt_.max_total_tokens,
                                    opt_.block_size, block_cap - 1);
      LONGCTX_CHECK(workspace_.defined() && workspace_.nbytes() >= need,
                    ErrorCode::kInvalidArgument, "{}: workspace has {} bytes, the bucket needs {}",
                    who, workspace_.defined() ? workspace_.nbytes() : 0, need);
    }
    LONGCTX_CHECK(!workspace_.defined() || workspace_.device() == opt_.device,
                  ErrorCode::kInvalidArgument, "{}: workspace on {}, attention on {}", who,
                  workspace_.device().str(), opt_.device.str());
    cuda_ = detail::block_causal_cuda_create(opt_.device.index, block_cap, index_cap);
    if (opt_.graph_mode) {
      out_buf_ = Tensor::empty({*opt_.max_total_tokens, opt_.num_qo_heads, opt_.head_dim},
                               opt_.q_dtype, opt_.device);
    }
  } else {
    LONGCTX_CHECK(!opt_.graph_mode, ErrorCode::kInvalidArgument,
                  "{}: graph mode needs a CUDA device", who);
  }
}

RaggedBlockCausalAttention::~RaggedBlockCausalAttention() {
  if (cuda_) detail::block_causal_cuda_destroy(cuda_);
}

void RaggedBlockCausalAttention::plan(const std::vector<int64_t>& seg_lens, void* stream) {
  const char* who = "RaggedBlockCausalAttention::plan";
  LONGCTX_CHECK(!seg_lens.empty(), ErrorCode::kInvalidArgument, "{}: seg_lens is empty", who);
  int64_t total = 0;
  for (size_t i = 0; i < seg_lens.size(); ++i) {
    LONGCTX_CHECK(seg_lens[i] > 0, ErrorCode::kInvalidArgument,
                  "{}: span {} has length {} (spans must be > 0 tokens)", who, i, seg_lens[i]);
    total += seg_lens[i];
  }
  if (opt_.max_num_segments)
    LONGCTX_CHECK(int64_t(seg_lens.size()) <= *opt_.max_num_segments, ErrorCode::kOutOfRange,
                  "{}: {} spans exceed max_num_segments {}", who, seg_lens.size(),
                  *opt_.max_num_segments);
  if (opt_.max_total_tokens)
    LONGCTX_CHECK(total <= *opt_.max_total_tokens, ErrorCode::kOutOfRange,
                  "{}: {} tokens exceed max_total_tokens {}", who, total, *opt_.max_total_tokens);
  LONGCTX_CHECK(max_prefix_tokens(total, opt_.block_size) <= kInt32Max, ErrorCode::kOutOfRange,
                "{}: {} tokens need more key indices than int32 holds", who, total);

  planned_ = false;
  layout_ = block_causal_layout(seg_lens, opt_.block_size);
  num_segments_ = int64_t(seg_lens.size());
  total_tokens_ = total;
  num_blocks_ = int64_t(layout_.qo_indptr.size()) - 1;
  padded_blocks_ = num_blocks_;
  if (opt_.graph_mode)  // + 1: a zero-length block the padded work items point at
    padded_blocks_ =
        max_blocks(*opt_.max_num_segments, *opt_.max_total_tokens, opt_.block_size) + 1;
  LONGCTX_ASSERT(padded_blocks_ >= num_blocks_, "graph bucket bound broken");

  // int32 arrays of the paged launch, padded with zero-length blocks (no query, no page).
  const int64_t nb = padded_blocks_;
  const int64_t num_indices = layout_.kv_indptr.back();
  qo_indptr32_.assign(nb + 1, int32_t(total));
  kv_indptr32_.assign(nb + 1, int32_t(num_indices));
  last_page_len32_.assign(nb, 0);
  std::vector<int32_t> kv_len32(nb, 0);
  for (int64_t i = 0; i <= num_blocks_; ++i) {
    qo_indptr32_[i] = int32_t(layout_.qo_indptr[i]);
    kv_indptr32_[i] = int32_t(layout_.kv_indptr[i]);
  }
  for (int64_t i = 0; i < num_blocks_; ++i) {
    last_page_len32_[i] = 1;  // one-token pages: every page is full
    kv_len32[i] = kv_indptr32_[i + 1] - kv_indptr32_[i];
  }
  kv_indices32_.assign(layout_.kv_indices.begin(), layout_.kv_indices.end());

  if (opt_.device.is_cuda()) {
    const int group = opt_.num_qo_heads / opt_.num_kv_heads;
    int64_t work_cap = 0;
    if (opt_.graph_mode) {
      work_cap = detail::block_causal_cuda_work_cap(nb, *opt_.max_total_tokens, group);
    } else {
      detail::block_causal_cuda_reserve(cuda_, nb, num_indices);
    }
    size_t need = detail::block_causal_cuda_workspace_bytes(nb, total, group, work_cap);
    LONGCTX_CHECK(workspace_.defined() && workspace_.nbytes() >= need, ErrorCode::kInvalidArgument,
                  "{}: workspace has {} bytes, this layout needs {}", who,
                  workspace_.defined() ? workspace_.nbytes() : 0, need);
    detail::block_causal_cuda_plan(cuda_, qo_indptr32_.data(), kv_indptr32_.data(),
                                   kv_indices32_.data(), last_page_len32_.data(), kv_len32.data(),
                                   nb, num_indices, opt_.num_qo_heads, opt_.num_kv_heads,
                                   opt_.head_dim, work_cap, nb - 1, workspace_.data_ptr(),
                                   workspace_.nbytes(), stream);
  } else {
    (void)stream;
  }
  planned_ = true;
}

void RaggedBlockCausalAttention::check_inputs(const Tensor& q, const Tensor& k, const Tensor& v,
                                              const Tensor& out) const {
  const char* who = "RaggedBlockCausalAttention::run";
  LONGCTX_CHECK(planned_, ErrorCode::kInvalidArgument, "{}: call plan() first", who);
  auto check = [&](const Tensor& t, const char* name, int heads) {
    LONGCTX_CHECK(t.defined(), ErrorCode::kInvalidArgument, "{}: {} is undefined", who, name);
    LONGCTX_CHECK(t.rank() == 3 && t.size(1) == heads && t.size(2) == opt_.head_dim,
                  ErrorCode::kInvalidArgument, "{}: {} has shape {}, expected [n, {}, {}]", who,
                  name, t.shape_str(), heads, opt_.head_dim);
    LONGCTX_CHECK(t.dtype() == opt_.q_dtype, ErrorCode::kInvalidArgument,
                  "{}: {} has dtype {}, expected {}", who, name, dtype_name(t.dtype()),
                  dtype_name(opt_.q_dtype));
    LONGCTX_CHECK(t.device() == opt_.device, ErrorCode::kInvalidArgument,
                  "{}: {} is on {}, expected {}", who, name, t.device().str(), opt_.device.str());
    LONGCTX_CHECK(t.is_contiguous(), ErrorCode::kInvalidArgument, "{}: {} must be contiguous", who,
                  name);
    LONGCTX_CHECK(t.size(0) >= total_tokens_, ErrorCode::kInvalidArgument,
                  "{}: {} has {} rows, the plan packs {} tokens", who, name, t.size(0),
                  total_tokens_);
  };
  check(q, "q", opt_.num_qo_heads);
  check(k, "k", opt_.num_kv_heads);
  check(v, "v", opt_.num_kv_heads);
  check(out, "out", opt_.num_qo_heads);
  LONGCTX_CHECK(k.size(0) == v.size(0), ErrorCode::kInvalidArgument,
                "{}: k has {} rows but v has {}", who, k.size(0), v.size(0));
  LONGCTX_CHECK(out.size(0) == q.size(0), ErrorCode::kInvalidArgument,
                "{}: out has {} rows but q has {}", who, out.size(0), q.size(0));
}

Tensor RaggedBlockCausalAttention::run(const Tensor& q, const Tensor& k, const Tensor& v,
                                       void* stream) {
  Tensor out;
  if (opt_.graph_mode) {
    LONGCTX_CHECK(q.defined() && q.rank() >= 1 && q.size(0) <= *opt_.max_total_tokens,
                  ErrorCode::kInvalidArgument,
                  "RaggedBlockCausalAttention::run: graph mode takes at most max_total_tokens {} "
                  "rows, q is {}",
                  *opt_.max_total_tokens, q.defined() ? q.shape_str() : "undefined");
    out = out_buf_.slice(0, 0, q.size(0));
  } else {
    LONGCTX_CHECK(q.defined() && q.rank() == 3, ErrorCode::kInvalidArgument,
                  "RaggedBlockCausalAttention::run: q must be [n, H, D], got {}",
                  q.defined() ? q.shape_str() : "undefined");
    out = Tensor::empty({q.size(0), opt_.num_qo_heads, opt_.head_dim}, opt_.q_dtype, opt_.device);
  }
  run(q, k, v, out, stream);
  return out;
}

void RaggedBlockCausalAttention::run(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out,
                                     void* stream) {
  check_inputs(q, k, v, out);
  if (opt_.device.is_cuda()) {
    detail::block_causal_cuda_run(cuda_, q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(),
                                  opt_.num_qo_heads, opt_.num_kv_heads, opt_.head_dim, opt_.q_dtype,
                                  sm_scale_, stream);
    return;
  }
  (void)stream;
  kernels::PagedPrefillParams p;
  p.q = q.data_ptr();
  p.k_cache = k.data_ptr();  // [n, Hkv, D] is [n pages, page_size 1, Hkv, D]
  p.v_cache = v.data_ptr();
  p.o = out.data_ptr();
  p.qo_indptr = qo_indptr32_.data();
  p.kv_indptr = kv_indptr32_.data();
  p.kv_indices = kv_indices32_.data();
  p.kv_last_page_len = last_page_len32_.data();
  p.batch_size = int(num_blocks_);
  p.num_qo_heads = opt_.num_qo_heads;
  p.num_kv_heads = opt_.num_kv_heads;
  p.head_dim = opt_.head_dim;
  p.page_size = 1;
  p.kv_contiguous = true;  // as on the GPU; the reference checks it
  p.dtype = opt_.q_dtype;
  p.mask_mode = kernels::MaskMode::kNone;
  p.sm_scale = sm_scale_;
  kernels::cpu::paged_prefill_ref(p);
}

}  // namespace longctx
