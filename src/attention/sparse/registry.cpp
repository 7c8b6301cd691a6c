#include "attention/sparse/sparse_policy.h"

#include <algorithm>
#include <cmath>

#include "attention/sparse/policies.h"
#include "longctx/core/error.h"

namespace longctx::sparse {

namespace {

using Factory = std::unique_ptr<SparsePolicy> (*)(const SparseOptions&, const KvShape&);

struct Entry {
  const char* name;
  Factory make;
};

constexpr Entry kPolicies[] = {
    {"full", make_full_policy},
    {"quest", make_quest_policy},
    {"xattention", make_xattention_policy},
};

}  // namespace

std::vector<std::string> sparse_policy_names() {
  std::vector<std::string> n;
  for (const Entry& e : kPolicies) n.emplace_back(e.name);
  return n;
}

}  // namespace longctx::sparse

namespace longctx {

void SparseOptions::validate() const {
  using sparse::Entry;
  using sparse::kPolicies;
  const Entry* e = std::find_if(std::begin(kPolicies), std::end(kPolicies),
                                [&](const Entry& x) { return policy == x.name; });
  if (e == std::end(kPolicies)) {
    std::string known;
    for (const Entry& x : kPolicies) known += (known.empty() ? "" : ", ") + std::string(x.name);
    LONGCTX_THROW(ErrorCode::kInvalidArgument, "--sparse-policy '{}' is unknown (known: {})",
                  policy, known);
  }
  if (policy == "quest") {  // the other policies do not read the budget
    LONGCTX_CHECK(sink_tokens >= 0 && window_tokens >= 1, ErrorCode::kInvalidArgument,
                  "--sparse-sink {} must be >= 0 and --sparse-window {} >= 1", sink_tokens,
                  window_tokens);
    LONGCTX_CHECK(page_tokens >= 1, ErrorCode::kInvalidArgument, "--sparse-page {} must be >= 1",
                  page_tokens);
    LONGCTX_CHECK(budget_tokens > sink_tokens + window_tokens, ErrorCode::kInvalidArgument,
                  "--sparse-budget {} must be more than --sparse-sink {} + --sparse-window {} "
                  "(those are always read)",
                  budget_tokens, sink_tokens, window_tokens);
  }
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

namespace longctx::sparse {

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
  for (const Entry& e : kPolicies)
    if (options.policy == e.name) return e.make(options, shape);
  LONGCTX_THROW(ErrorCode::kInternal, "sparse policy '{}' not registered", options.policy);
}

float quest_upper_bound(const float* q, const float* kmin, const float* kmax, int64_t head_dim) {
  float s = 0.f;
  for (int64_t i = 0; i < head_dim; ++i) s += std::max(q[i] * kmin[i], q[i] * kmax[i]);
  return s;
}

}  // namespace longctx::sparse
