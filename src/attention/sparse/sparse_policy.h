// Sparse attention policies (docs/sparse.md): which KV blocks each query attends. A policy never
// computes attention. It keeps per-block metadata as keys are written and, per layer and phase,
// selects blocks before anything is read, so a backend reads only those (with offload, only the
// selected host blocks are to cross the link). Policies:
//   full        every block (the default; the backends' dense path, bit for bit);
//   quest       decode: per block and KV head the key min/max; a block's score is the upper bound
//               of q.k over its keys; the top blocks under a token budget per KV head (or one list
//               from head-averaged scores), the sink and the recent window always kept;
//   xattention  prefill: strided antidiagonal scores of each (query block, key block) of 128, a
//               softmax per query group, block sums, per q head the fewest key blocks whose mass
//               reaches a threshold; the sink and the diagonal blocks always kept.
// Selections are host data over fp32 keys here (the CPU engine); Quest's GPU path
// (attention_backends/quest_cuda.h) computes the same selections on the device.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "longctx/attention/sparse_options.h"

namespace longctx::sparse {

enum class Phase { kPrefill, kDecode };

// What the policy sees of the KV cache.
struct KvShape {
  int64_t num_layers = 0, num_blocks = 0, block_size = 0;
  int64_t num_qo_heads = 0, num_kv_heads = 0, head_dim = 0;
  float sm_scale = 0.f;
};

// One sequence's keys of one layer, fp32 on the host: key j is row j % block_size of block
// blocks[j / block_size] in pool_k [num_blocks, block_size, num_kv_heads, head_dim].
struct SeqKeys {
  const int32_t* blocks = nullptr;  // [ceil(kv_len / block_size)] block ids
  int64_t kv_len = 0;
  const float* pool_k = nullptr;
};

// Decode: per KV head the logical block indices (into the sequence's block table, ascending) its
// q heads read. Empty: every block (the policy chose not to select, e.g. a budget >= kv_len).
struct DecodeSelection {
  std::vector<std::vector<int32_t>> per_kv_head;  // [Hkv][chosen]
  bool all() const { return per_kv_head.empty(); }
};

// Prefill chunk of n queries (the last n positions of kv_len): the block-sparse kernels' mask
// (kernels/attention_params.h), per q head, query block i of 128 counted from the chunk's first
// query, key block j of 128 from key 0. Empty: dense.
struct PrefillMask {
  int64_t q_blocks = 0, k_blocks = 0;
  std::vector<uint8_t> mask;  // [Hq][q_blocks][k_blocks]
  bool all() const { return mask.empty(); }
};

class SparsePolicy {
 public:
  virtual ~SparsePolicy() = default;
  virtual std::string_view name() const = 0;
  virtual bool selects(Phase phase) const = 0;

  // Metadata hooks. Rows of `layer` were written: k [n, Hkv, d] fp32 with row stride k_stride
  // floats, row t at slot slots[t] (block * block_size + offset; a block's rows are written in
  // order, offset 0 first). A block was copied whole (copy-on-write).
  virtual void on_keys_written(int64_t /*layer*/, const float* /*k*/, int64_t /*k_stride*/,
                               const int64_t* /*slots*/, int64_t /*n*/) {}
  virtual void on_block_copied(int32_t /*src*/, int32_t /*dst*/) {}

  // q [Hq, d] fp32: the sequence's one new token (its key already written).
  virtual DecodeSelection select_decode(int64_t /*layer*/, const float* /*q*/,
                                        const SeqKeys& /*keys*/) {
    return {};
  }
  // q [n, Hq, d] fp32: the chunk's queries, with row stride q_stride floats.
  virtual PrefillMask select_prefill(int64_t /*layer*/, const float* /*q*/, int64_t /*q_stride*/,
                                     int64_t /*n*/, const SeqKeys& /*keys*/) {
    return {};
  }
};

// The policy `options.policy` names (validated) for a cache of `shape`.
std::unique_ptr<SparsePolicy> make_sparse_policy(const SparseOptions& options,
                                                 const KvShape& shape);
std::vector<std::string> sparse_policy_names();

// Quest's score of one block for one q head: sum_d max(q_d * min_d, q_d * max_d), an upper bound
// of q.k over every key of the block (exposed for the tests).
float quest_upper_bound(const float* q, const float* kmin, const float* kmax, int64_t head_dim);

}  // namespace longctx::sparse
