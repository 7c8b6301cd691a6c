// What the cuBLASLt ops (linear_cuda.cu, quantized_linear_w8a8_cuda.cu) share: a handle per
// device, a 32 MiB workspace per (device, stream) allocated once through Tensor::empty (so a GEMM
// never allocates and two streams never share one), and plans (matmul descriptor, layouts, the
// heuristic's algorithm) cached per problem key, cleared when kMaxPlans is reached. Each op keeps
// its own contexts (its own Key type); a context's mutex guards its maps and a plan's pointer
// attributes (bias, scales) from being set until the launch that reads them.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "core/stream_limits.h"
#include "longctx/core/cuda_check.h"
#include "longctx/core/error.h"
#include "longctx/core/tensor.h"

#define LONGCTX_CUBLASLT_CHECK(call)                                                        \
  do {                                                                                      \
    const cublasStatus_t st_ = (call);                                                      \
    if (st_ != CUBLAS_STATUS_SUCCESS)                                                       \
      ::longctx::throw_cuda_error(__FILE__, __LINE__, #call, cublasLtGetStatusString(st_)); \
  } while (0)

namespace longctx::ops::cublaslt {

inline constexpr size_t kWorkspaceBytes = size_t(32) << 20;
inline constexpr size_t kMaxPlans = 1024;

// CUDA_R_16BF, CUDA_R_16F, else CUDA_R_32F.
cudaDataType_t cuda_type(DType t);

// Largest power of two <= 256 dividing the address (cuBLASLt's alignment preference).
uint32_t alignment(const void* p);

template <typename T>
void set_desc(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const T& v) {
  LONGCTX_CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(d, attr, &v, sizeof v));
}

struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;  // D is laid out as C
  cublasLtMatmulAlgo_t algo{};
  size_t workspace = 0;  // bytes the algorithm asked for
  std::string refusal;   // set when cuBLASLt has no kernel (the plan is not runnable)
  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan();
};

// The minimum operand alignments (bytes) the heuristic may assume.
struct Alignments {
  uint32_t a = 256, b = 256, c = 256;
};

// Asks the heuristic for plan's algorithm (desc and layouts made; workspace <= kWorkspaceBytes)
// and, when it found one (*found > 0), sets plan.algo and plan.workspace. Returns the status.
cublasStatus_t pick_algo(cublasLtHandle_t handle, Plan& plan, const Alignments& al, int* found);

// "cublasLt algo A tile T stages S split-k K reduction R cluster C workspace W B".
std::string describe_algo(const Plan& plan);

template <typename Key, typename Hash>
struct Context {
  std::mutex mu;  // guards the maps, and a plan's pointer attributes until its launch
  cublasLtHandle_t handle = nullptr;

  // The workspace of `stream` (kWorkspaceBytes, made on first use); mu held.
  void* workspace(cudaStream_t stream, Device device) {
    Tensor& ws = workspaces_[stream];
    if (!ws.defined()) ws = Tensor::empty({int64_t(kWorkspaceBytes)}, DType::kU8, device);
    return ws.data_ptr();
  }

  // The cached plan of key, made by make() (a std::unique_ptr<Plan>) on first use; mu held.
  template <typename Make>
  const Plan& plan(const Key& key, Make&& make) {
    auto it = plans_.find(key);
    if (it == plans_.end()) {
      if (plans_.size() >= kMaxPlans) plans_.clear();
      it = plans_.emplace(key, make()).first;
    }
    return *it->second;
  }

 private:
  std::unordered_map<cudaStream_t, Tensor> workspaces_;
  std::unordered_map<Key, std::unique_ptr<Plan>, Hash> plans_;
};

cublasLtHandle_t create_handle();

// The context of `device` for one op (one per Key type). Never destroyed: process exit tears
// the CUDA context down first, after which handle and device memory frees would fail.
template <typename Key, typename Hash>
Context<Key, Hash>& context(int device, const char* op) {
  static std::mutex mu;
  static Context<Key, Hash>* contexts[kMaxCudaDevices] = {};
  LONGCTX_CHECK(device >= 0 && device < kMaxCudaDevices, ErrorCode::kInvalidArgument,
                "{}: device index {} out of range", op, device);
  std::lock_guard<std::mutex> lock(mu);
  if (!contexts[device]) {
    auto* ctx = new Context<Key, Hash>();
    ctx->handle = create_handle();
    contexts[device] = ctx;
  }
  return *contexts[device];
}

// FNV-1a over 64-bit words, for the plan keys' hashes.
struct Fnv {
  size_t h = 1469598103934665603ull;
  void mix(uint64_t v) { h = (h ^ v) * 1099511628211ull; }
};

}  // namespace longctx::ops::cublaslt
