// Full: every key. It selects nothing, so the backends take their dense path unchanged (no CUDA
// twin: nothing to select on the device).
#include "attention/sparse/policies.h"

namespace longctx::sparse {

namespace {

class FullPolicy final : public SparsePolicy {
 public:
  SparsePolicyKind kind() const override { return SparsePolicyKind::kFull; }
};

std::unique_ptr<SparsePolicy> make_cpu(const SparseOptions&, const KvShape&) {
  return std::make_unique<FullPolicy>();
}

}  // namespace

extern const PolicyDef kFullPolicy{
    .kind = SparsePolicyKind::kFull,
    .name = "full",
    .reads_fp8 = true,  // the dense kernels read FP8
    .make_cpu = make_cpu,
};

}  // namespace longctx::sparse
