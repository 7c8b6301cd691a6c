// The sparse attention policy of an engine and its parameters (docs/sparse.md; the policies are
// in src/kv/sparse). Defaults: full attention.
#pragma once

#include <cstdint>
#include <string>

namespace longctx {

struct SparseOptions {
  std::string policy = "full";  // full | quest | xattention
  // quest
  int64_t budget_tokens = 4096;  // tokens read per KV head (whole blocks), sink and window included
  int64_t sink_tokens = 64;      // the first tokens, always read
  int64_t window_tokens = 256;   // the last tokens, always read
  bool per_head = true;          // per KV head block lists, else one list from head-averaged scores
  int64_t page_tokens = 16;  // GPU: the selection's page, dividing the KV block (CPU: the block)
  // xattention
  double threshold = 0.9;  // attention mass each query block keeps, in (0, 1]
  int64_t stride = 8;      // antidiagonal stride of the estimate
  // One mask per KV head from the summed masses of its q heads (the GQA prefill kernels read a
  // key block for all q heads of a KV head at once), else one per q head.
  bool xattn_per_kv_head = true;
  // Query blocks of 128 holding any of a prefill chunk's last xattn_dense_tail queries keep every
  // causal block: the end of the prompt, whose states the first generated token reads.
  int64_t xattn_dense_tail = 128;
  // A prefill chunk that sees fewer keys attends densely: short prompts gain little from the
  // selection (the needle model keeps ~58 % of the blocks at 4K) and lose the most accuracy.
  int64_t xattn_min_len = 8192;

  // Throws Error(kInvalidArgument) naming the flag: an unknown policy; for quest a budget not
  // above sink + window (or a negative sink, a window < 1, a page < 1); a threshold outside
  // (0, 1], a stride outside [1, 128]. (That the page divides the KV block is checked where the
  // block size is known.)
  void validate() const;
};

}  // namespace longctx
