// Full: every block. It selects nothing, so the backends take their dense path unchanged.
#include "attention/sparse/policies.h"

namespace longctx::sparse {

namespace {

class FullPolicy final : public SparsePolicy {
 public:
  std::string_view name() const override { return "full"; }
  bool selects(Phase) const override { return false; }
};

}  // namespace

std::unique_ptr<SparsePolicy> make_full_policy(const SparseOptions&, const KvShape&) {
  return std::make_unique<FullPolicy>();
}

}  // namespace longctx::sparse
