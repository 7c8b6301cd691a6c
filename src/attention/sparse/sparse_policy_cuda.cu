#include "attention/sparse/sparse_policy_cuda.h"
#include "longctx/core/error.h"

namespace longctx::sparse {

void SparsePolicyCuda::attend_decode(int64_t, const void*, void*, float*, const PageMemory (&)[2],
                                     cudaStream_t) {
  LONGCTX_THROW(ErrorCode::kInternal, "sparse policy: attend_decode on a policy without decodes");
}

void SparsePolicyCuda::select_prefill(kernels::PagedPrefillParams&, cudaStream_t) {
  LONGCTX_THROW(ErrorCode::kInternal, "sparse policy: select_prefill on a policy without prefill");
}

std::unique_ptr<SparsePolicyCuda> make_sparse_policy_cuda(const SparseCudaConfig& config) {
  config.options.validate();
  const PolicyDef& d = policy_def(config.options.policy);
  if (!d.prefill && !d.decode) return nullptr;
  LONGCTX_CHECK(d.make_cuda != nullptr, ErrorCode::kUnsupported,
                "--sparse-policy {} on the GPU: not built", d.name);
  return d.make_cuda(config);
}

}  // namespace longctx::sparse
