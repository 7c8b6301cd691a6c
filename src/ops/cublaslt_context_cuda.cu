// The shared cuBLASLt pieces of ops/cublaslt_context.h.
#include "ops/cublaslt_context.h"

namespace longctx::ops::cublaslt {

cudaDataType_t cuda_type(DType t) {
  return t == DType::kBF16 ? CUDA_R_16BF : t == DType::kF16 ? CUDA_R_16F : CUDA_R_32F;
}

uint32_t alignment(const void* p) {
  uint32_t a = 256;
  while (a > 1 && reinterpret_cast<uintptr_t>(p) % a != 0) a /= 2;
  return a;
}

Plan::~Plan() {
  if (c) cublasLtMatrixLayoutDestroy(c);
  if (b) cublasLtMatrixLayoutDestroy(b);
  if (a) cublasLtMatrixLayoutDestroy(a);
  if (desc) cublasLtMatmulDescDestroy(desc);
}

cublasStatus_t pick_algo(cublasLtHandle_t handle, Plan& plan, const Alignments& al, int* found) {
  *found = 0;
  cublasLtMatmulPreference_t pref = nullptr;
  LONGCTX_CUBLASLT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  auto set_pref = [&](cublasLtMatmulPreferenceAttributes_t attr, auto v) {
    return cublasLtMatmulPreferenceSetAttribute(pref, attr, &v, sizeof v);
  };
  cublasStatus_t st = set_pref(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, uint64_t(kWorkspaceBytes));
  if (st == CUBLAS_STATUS_SUCCESS) st = set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, al.a);
  if (st == CUBLAS_STATUS_SUCCESS) st = set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, al.b);
  if (st == CUBLAS_STATUS_SUCCESS) st = set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, al.c);
  if (st == CUBLAS_STATUS_SUCCESS) st = set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, al.c);
  cublasLtMatmulHeuristicResult_t result{};
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulAlgoGetHeuristic(handle, plan.desc, plan.a, plan.b, plan.c, plan.c, pref, 1,
                                        &result, found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st == CUBLAS_STATUS_SUCCESS && *found > 0) {
    plan.algo = result.algo;
    plan.workspace = result.workspaceSize;
  }
  return st;
}

std::string describe_algo(const Plan& plan) {
  auto get = [&](cublasLtMatmulAlgoConfigAttributes_t attr, auto zero) {
    decltype(zero) v = zero;
    size_t written = 0;
    cublasLtMatmulAlgoConfigGetAttribute(&plan.algo, attr, &v, sizeof v, &written);
    return int64_t(v);
  };
  return LONGCTX_FORMAT(
      "cublasLt algo {} tile {} stages {} split-k {} reduction {} cluster {} workspace {} B",
      get(CUBLASLT_ALGO_CONFIG_ID, int32_t(0)), get(CUBLASLT_ALGO_CONFIG_TILE_ID, uint32_t(0)),
      get(CUBLASLT_ALGO_CONFIG_STAGES_ID, uint32_t(0)),
      get(CUBLASLT_ALGO_CONFIG_SPLITK_NUM, int32_t(0)),
      get(CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, uint32_t(0)),
      get(CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, uint16_t(0)), plan.workspace);
}

cublasLtHandle_t create_handle() {
  cublasLtHandle_t h = nullptr;
  LONGCTX_CUBLASLT_CHECK(cublasLtCreate(&h));
  return h;
}

}  // namespace longctx::ops::cublaslt
