// The registry of sparse policies: one line per policy (its definition, PolicyDef, is in the
// policy's own file). Everything below the option parser asks it what a policy does.
#include <algorithm>
#include <cmath>

#include "attention/sparse/kv_export.h"
#include "attention/sparse/policies.h"
#include "longctx/core/error.h"

namespace longctx::sparse {

namespace {

const PolicyDef* const kPolicies[] = {
    &kFullPolicy,        // full.cpp: every key
    &kQuestPolicy,       // quest.cpp: decode pages by a bound of q.k
    &kXAttentionPolicy,  // xattention.cpp: prefill masks by an antidiagonal estimate
    &kStreamingPolicy,   // streaming.cpp: attention sinks + the recent window
};

std::string known_names() {
  std::string known;
  for (const PolicyDef* d : kPolicies) known += (known.empty() ? "" : ", ") + std::string(d->name);
  return known;
}

}  // namespace

const PolicyDef& policy_def(SparsePolicyKind kind) {
  for (const PolicyDef* d : kPolicies)
    if (d->kind == kind) return *d;
  LONGCTX_THROW(ErrorCode::kInternal, "sparse policy {} is not registered", static_cast<int>(kind));
}

bool SparsePolicy::selects(Phase phase) const {
  const PolicyDef& d = policy_def(kind());
  return phase == Phase::kPrefill ? d.prefill : d.decode;
}

std::unique_ptr<SparsePolicy> make_sparse_policy(const SparseOptions& options,
                                                 const KvShape& shape) {
  options.validate();
  LONGCTX_CHECK(shape.num_layers > 0 && shape.num_blocks > 0 && shape.block_size > 0 &&
                    shape.num_kv_heads > 0 && shape.num_qo_heads % shape.num_kv_heads == 0 &&
                    shape.head_dim > 0 && shape.sm_scale > 0,
                ErrorCode::kInvalidArgument,
                "sparse policy: bad KV shape ({} layers, {} blocks of {}, {} / {} heads, head_dim "
                "{})",
                shape.num_layers, shape.num_blocks, shape.block_size, shape.num_qo_heads,
                shape.num_kv_heads, shape.head_dim);
  return policy_def(options.policy).make_cpu(options, shape);
}

SparseGpuBytes sparse_gpu_bytes(const SparseOptions& options, const SparseGpuShape& shape) {
  options.validate();
  const PolicyDef& d = policy_def(options.policy);
  return d.gpu_bytes != nullptr ? d.gpu_bytes(options, shape) : SparseGpuBytes{};
}

float quest_upper_bound(const float* q, const float* kmin, const float* kmax, int64_t head_dim) {
  float s = 0.f;
  for (int64_t i = 0; i < head_dim; ++i) s += std::max(q[i] * kmin[i], q[i] * kmax[i]);
  return s;
}

bool exports_kv_blocks(bool cache, const KvGroups& groups, const SparseOptions& options) {
  return cache && groups.single_full() && !selects(options, Phase::kDecode) &&
         !selects(options, Phase::kPrefill);
}

}  // namespace longctx::sparse

namespace longctx {

using sparse::kPolicies;
using sparse::PolicyDef;

std::string_view sparse_policy_name(SparsePolicyKind policy) {
  return sparse::policy_def(policy).name;
}

SparsePolicyKind parse_sparse_policy(std::string_view name) {
  for (const PolicyDef* d : kPolicies)
    if (name == d->name) return d->kind;
  LONGCTX_THROW(ErrorCode::kInvalidArgument, "--sparse-policy '{}' is unknown (known: {})", name,
                sparse::known_names());
}

std::vector<std::string> sparse_policy_names() {
  std::vector<std::string> n;
  for (const PolicyDef* d : kPolicies) n.emplace_back(d->name);
  return n;
}

void SparseOptions::validate() const {
  const PolicyDef& d = sparse::policy_def(policy);
  if (d.check != nullptr) d.check(*this);
  // The other policies' flags are parsed for every policy: a bad value is an error anywhere.
  LONGCTX_CHECK(std::isfinite(threshold) && threshold > 0 && threshold <= 1,
                ErrorCode::kInvalidArgument, "--xattn-threshold {} must be in (0, 1]", threshold);
  LONGCTX_CHECK(stride >= 1 && stride <= 128, ErrorCode::kInvalidArgument,
                "--xattn-stride {} must be in [1, 128]", stride);
  LONGCTX_CHECK(xattn_dense_tail >= 0, ErrorCode::kInvalidArgument,
                "--xattn-dense-tail {} must be >= 0", xattn_dense_tail);
  LONGCTX_CHECK(xattn_min_len >= 0, ErrorCode::kInvalidArgument, "--xattn-min-len {} must be >= 0",
                xattn_min_len);
}

}  // namespace longctx
