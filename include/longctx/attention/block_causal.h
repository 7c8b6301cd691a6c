// Block-causal ragged attention over packed, cacheless q/k/v (streaming encoders, Whisper-style).
//
// Spans of seg_lens[i] tokens are packed end to end into [total, H, D] tensors. Within a span, a
// token of block b (block_size tokens a block, counted from the span's start) attends every key
// of blocks 0..b of the same span: causal between blocks, bidirectional within one, nothing across
// spans. So a streaming client that feeds a span block by block sees what a whole-span forward
// computes.
//
// The prefixes of one span overlap, which a ragged kv_indptr (one contiguous key range per query
// segment) cannot express, but a paged KV layout can: the packed keys are viewed as pages of ONE
// token ([total, 1, Hkv, D]) and every query block is one paged "request" whose page list is its
// key prefix. No key is copied; the page lists are host-side index arithmetic done at plan time.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "longctx/core/tensor.h"

namespace longctx {

namespace detail {
struct BlockCausalCuda;  // device buffers of the CUDA path (src/attention/block_causal_cuda.h)
}

// One entry per query block, over spans packed end to end. Block i of a span starting at `off`
// with length L has queries [off + i*B, off + min((i+1)*B, L)) and keys [off, off + min((i+1)*B,
// L)); the keys are listed one token index each in kv_indices.
struct BlockCausalLayout {
  std::vector<int64_t> qo_indptr;   // [num_blocks + 1] token offsets of each block's queries
  std::vector<int64_t> kv_indptr;   // [num_blocks + 1] offsets into kv_indices
  std::vector<int64_t> kv_indices;  // [kv_indptr.back()] packed token index of each key
};

// Throws Error(kInvalidArgument) for block_size <= 0, an empty seg_lens, or a span length <= 0.
BlockCausalLayout block_causal_layout(const std::vector<int64_t>& seg_lens, int64_t block_size);

// Most query blocks any layout of at most max_segments spans and max_tokens tokens has (spans are
// non-empty, so at most min(max_segments, max_tokens) of them). TIGHT: with m = min(max_segments,
// max_tokens) spans, m - 1 of one token and one of the remaining tokens, a layout reaches
//   m + floor((max_tokens - m) / block_size),
// and no layout exceeds it (a span of c blocks holds at least (c - 1) * block_size + 1 tokens).
// Proven exhaustively over small limits in tests/kernels/block_causal_layout_test.cpp.
int64_t max_blocks(int64_t max_segments, int64_t max_tokens, int64_t block_size);

// Most key indices (sum of the blocks' prefix lengths) any layout of at most max_tokens tokens
// needs, whatever its span count. TIGHT: one span holding every token attains it (splitting a span
// never lengthens a prefix), i.e. sum_{i < ceil(T/B)} min((i+1)*B, T). Proven exhaustively over
// small limits in the same test.
int64_t max_prefix_tokens(int64_t max_tokens, int64_t block_size);

struct BlockCausalOptions {
  int num_qo_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int64_t block_size = 0;
  // Limits of the bucket. Required in graph mode (they size the padded buffers); otherwise
  // optional checks (and, when given, the device buffers are allocated once at construction).
  std::optional<int64_t> max_num_segments;
  std::optional<int64_t> max_total_tokens;
  Device device = Device::cpu();
  // Graph mode: the block count is padded to max_blocks(...) with zero-length blocks and the
  // index buffer sized for max_prefix_tokens(max_total_tokens), so every layout of the bucket
  // replays through ONE captured CUDA graph: plan() only rewrites device buffers (async copies
  // on the stream), run() only launches.
  bool graph_mode = false;
  std::optional<float> sm_scale;  // default 1/sqrt(head_dim)
  DType q_dtype = DType::kBF16;   // bf16 or f16 (q, k, v and the output)
};

// The seed's RaggedBlockCausalWrapper: plan(seg_lens) once per packed layout, run(q, k, v) per
// layer. On a CUDA device run() is the paged prefill kernel (kernels/cuda/prefill.h) with one-token
// pages and mask mode none inside each block's key range; on the CPU device it is the CPU
// reference of the same paged prefill, so the whole API is testable without a GPU.
class RaggedBlockCausalAttention {
 public:
  // `workspace`: a caller-owned byte tensor (u8) on `options.device` for the kernel's plan
  // (work lists); see workspace_bytes(). Ignored (may be undefined) on the CPU.
  RaggedBlockCausalAttention(Tensor workspace, const BlockCausalOptions& options);
  ~RaggedBlockCausalAttention();
  RaggedBlockCausalAttention(const RaggedBlockCausalAttention&) = delete;
  RaggedBlockCausalAttention& operator=(const RaggedBlockCausalAttention&) = delete;

  // Workspace a CUDA instance needs for up to max_total_tokens tokens.
  static size_t workspace_bytes(int num_qo_heads, int num_kv_heads, int64_t max_total_tokens,
                                int64_t block_size, int64_t max_blocks);

  // Plans one packed layout: seg_lens[i] tokens in span i, end to end. `stream` is a
  // cudaStream_t (nullptr: the legacy default stream); ignored on the CPU.
  void plan(const std::vector<int64_t>& seg_lens, void* stream = nullptr);

  // q [n, num_qo_heads, head_dim], k/v [n, num_kv_heads, head_dim] packed by the planned spans,
  // n >= the planned total (rows past it are ignored) -> [n, num_qo_heads, head_dim]. Rows past
  // the planned total are not a valid result; the caller slices. In graph mode the returned
  // tensor is a view of a buffer owned by this object (fixed address, so a captured graph writes
  // it on every replay) and n must be <= max_total_tokens.
  Tensor run(const Tensor& q, const Tensor& k, const Tensor& v, void* stream = nullptr);
  // Same, into a caller-owned out [n, num_qo_heads, head_dim].
  void run(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, void* stream = nullptr);

  int64_t num_segments() const { return num_segments_; }        // real (unpadded), last plan
  int64_t total_tokens() const { return total_tokens_; }        // of the last plan
  int64_t num_blocks() const { return num_blocks_; }            // real (unpadded), last plan
  int64_t padded_num_blocks() const { return padded_blocks_; }  // the launch's batch size
  const BlockCausalLayout& layout() const { return layout_; }

 private:
  void check_inputs(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out) const;

  BlockCausalOptions opt_;
  float sm_scale_ = 0.f;
  Tensor workspace_;  // [workspace bytes] u8, caller-owned
  Tensor out_buf_;    // [max_total_tokens, num_qo_heads, head_dim] graph mode only
  BlockCausalLayout layout_;
  int64_t num_segments_ = 0;
  int64_t total_tokens_ = 0;
  int64_t num_blocks_ = 0;
  int64_t padded_blocks_ = 0;
  bool planned_ = false;
  // Host int32 copies the kernels read (CPU path reads them directly).
  std::vector<int32_t> qo_indptr32_, kv_indptr32_, kv_indices32_, last_page_len32_;
  detail::BlockCausalCuda* cuda_ = nullptr;  // CUDA device only
};

}  // namespace longctx
