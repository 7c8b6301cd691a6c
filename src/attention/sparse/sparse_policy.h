// Sparse attention policies (docs/sparse.md): which keys each query attends. A policy never
// computes attention. It keeps per-page metadata as keys are written and, per layer and phase,
// selects before anything is read, so a backend reads only what it selected (with offload, only
// the selected host pages cross the link). Its output is device-agnostic:
//   decode   per KV head the ascending logical pages (of page_tokens keys, counted from key 0 of
//            the sequence) its q heads read;
//   prefill  the block-sparse kernels' mask over query and key blocks of 128.
// Every policy is one file with a CPU reference (SparsePolicy, host data, what the CPU engine and
// the simulated offload's sparse reader run) and a CUDA twin (SparsePolicyCuda,
// sparse_policy_cuda.h: the same selection on the device), and one line of the registry
// (registry.cpp), which the engine and the backends ask what a policy does: its phases, its device
// bytes, its factories.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "longctx/attention/sparse_options.h"

namespace longctx::sparse {

enum class Phase { kPrefill, kDecode };

class PageReuse;  // page_reuse.h

// What the policy sees of the KV cache.
struct KvShape {
  int64_t num_layers = 0, num_blocks = 0, block_size = 0;
  int64_t num_qo_heads = 0, num_kv_heads = 0, head_dim = 0;
  float sm_scale = 0.f;
};

// One sequence's keys of one layer, fp32 on the host: key j is row j % block_size of block
// blocks[j / block_size] in pool_k [num_blocks, block_size, num_kv_heads, head_dim]. (Decode
// policies read their metadata by block id and may ignore pool_k.)
struct SeqKeys {
  const int32_t* blocks = nullptr;  // [ceil(kv_len / block_size)] block ids
  int64_t kv_len = 0;
  const float* pool_k = nullptr;
};

// Decode: per KV head the logical pages of page_tokens keys (page i: keys [i * page_tokens,
// (i + 1) * page_tokens) of the sequence, the last one partial), ascending, its q heads read.
// Empty: every key (the policy chose not to select, e.g. a budget >= kv_len).
struct DecodeSelection {
  int64_t page_tokens = 0;
  std::vector<std::vector<int32_t>> per_kv_head;  // [Hkv][chosen pages]
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

// The CPU reference of a policy.
class SparsePolicy {
 public:
  virtual ~SparsePolicy() = default;
  virtual SparsePolicyKind kind() const = 0;
  // The registry's name and phases of kind() (virtual for the tests' own policies).
  virtual std::string_view name() const { return sparse_policy_name(kind()); }
  virtual bool selects(Phase phase) const;

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
  // Quest's page reuse across decode steps (page_reuse.h; null unless SparseOptions::quest_reuse):
  // the backends gather the rows of the pages select_decode lists through it.
  virtual PageReuse* page_reuse() { return nullptr; }
  // q [n, Hq, d] fp32: the chunk's queries, with row stride q_stride floats.
  virtual PrefillMask select_prefill(int64_t /*layer*/, const float* /*q*/, int64_t /*q_stride*/,
                                     int64_t /*n*/, const SeqKeys& /*keys*/) {
    return {};
  }
};

class SparsePolicyCuda;  // sparse_policy_cuda.h (CUDA builds)
struct SparseCudaConfig;

// What a policy costs on the GPU (the memory plan): per engine block (its metadata over every
// layer) and fixed (selection buffers for a step).
struct SparseGpuShape {
  int64_t num_layers = 0, block_size = 0, num_qo_heads = 0, num_kv_heads = 0, head_dim = 0;
  int64_t elem_size = 2;  // of K / V
  int64_t max_tokens = 0, max_seqs = 0, max_model_len = 0;
};
struct SparseGpuBytes {
  int64_t per_block = 0, fixed = 0;
};

// One registry line: everything the engine and the backends know of a policy.
struct PolicyDef {
  SparsePolicyKind kind;
  const char* name;              // what users type after --sparse-policy
  bool prefill = false;          // selects prefill chunks (a block mask)
  bool decode = false;           // selects decode steps (page lists)
  bool decode_graphs = true;     // decode steps may replay CUDA graphs (the selection is planned)
  bool offload_staging = false;  // with KV offload: the GPU stages host keys (xattention)
  // Runs over an FP8 E4M3 KV cache (its metadata from the dequantized keys, its reads FP8), on
  // both devices, resident and offloaded; the others are refused there by name.
  bool reads_fp8 = false;
  // Checks the policy's options, naming the flags (nullptr: none of its own).
  void (*check)(const SparseOptions& options) = nullptr;
  std::unique_ptr<SparsePolicy> (*make_cpu)(const SparseOptions&, const KvShape&) = nullptr;
  // The CUDA twin; nullptr in a build without CUDA.
  std::unique_ptr<SparsePolicyCuda> (*make_cuda)(const SparseCudaConfig&) = nullptr;
  SparseGpuBytes (*gpu_bytes)(const SparseOptions&, const SparseGpuShape&) = nullptr;
};

// The registry line of `kind` (Error(kInternal) if none).
const PolicyDef& policy_def(SparsePolicyKind kind);
inline bool selects(const SparseOptions& o, Phase phase) {
  const PolicyDef& d = policy_def(o.policy);
  return phase == Phase::kPrefill ? d.prefill : d.decode;
}

// The CPU policy `options.policy` names (validated) for a cache of `shape`.
std::unique_ptr<SparsePolicy> make_sparse_policy(const SparseOptions& options,
                                                 const KvShape& shape);
// The policy's device bytes (zeros for full); throws what the policy's check throws (the page
// must divide the block).
SparseGpuBytes sparse_gpu_bytes(const SparseOptions& options, const SparseGpuShape& shape);

// Quest's score of one page for one q head: sum_d max(q_d * min_d, q_d * max_d), an upper bound
// of q.k over every key of the page (exposed for the tests).
float quest_upper_bound(const float* q, const float* kmin, const float* kmax, int64_t head_dim);

}  // namespace longctx::sparse
