// The sparse attention policy of an engine and its parameters (docs/sparse.md; the policies and
// their registry are in src/attention/sparse). Defaults: full attention.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace longctx {

// Which policy: parsed once from the user's name (parse_sparse_policy); the code below the option
// parser asks the registry (src/attention/sparse/sparse_policy.h) what a policy does, never its
// name. One enumerator per registry line.
enum class SparsePolicyKind : uint8_t {
  kFull,        // "full": every key (the dense path, bit for bit)
  kQuest,       // "quest": decode, top pages by a bound of q.k under a token budget
  kXAttention,  // "xattention": prefill, antidiagonal estimate and a mass threshold
  kStreaming,   // "streaming": decode and prefill, the attention sinks and the recent window
};

// The user-facing name (the registry's). Throws Error(kInternal) for a value outside the registry.
std::string_view sparse_policy_name(SparsePolicyKind policy);
// The policy named `name`; throws Error(kInvalidArgument) "--sparse-policy 'NAME' is unknown
// (known: full, quest, ...)".
SparsePolicyKind parse_sparse_policy(std::string_view name);
// The registered names, in registry order.
std::vector<std::string> sparse_policy_names();

struct SparseOptions {
  SparsePolicyKind policy = SparsePolicyKind::kFull;
  // quest (sink and window: streaming too)
  int64_t budget_tokens = 4096;  // tokens read per KV head (whole pages), sink and window included
  int64_t sink_tokens = 64;      // the first tokens, always read
  int64_t window_tokens = 256;   // the last tokens, always read
  bool per_head = true;          // per KV head page lists, else one list from head-averaged scores
  int64_t page_tokens = 16;      // the selection's page, dividing the KV block (CPU and GPU)
  // quest: a decode step copies the pages a sequence selected and kept last step (settled, at the
  // same block) from device memory instead of reading them again (the host pool with offload);
  // the first quest_reuse_seqs sequences of a step keep their pages (GPU memory per sequence:
  // layers x the budget's K and V rows). Outputs are those without reuse, bit for bit.
  bool quest_reuse = false;
  int64_t quest_reuse_seqs = 1;
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

  // Throws Error(kInvalidArgument) naming the flag, through the policy's registered check: for
  // quest a budget not above sink + window (or a negative sink, a window < 1, a page < 1); for
  // streaming a negative sink, a window < 1 or a page < 1; a threshold outside (0, 1], a stride
  // outside [1, 128]. (That the page divides the KV block is checked where the block size is
  // known.)
  void validate() const;
};

}  // namespace longctx
