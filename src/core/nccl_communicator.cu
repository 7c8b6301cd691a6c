// NCCL communicators for the ranks of one process, one GPU each (ncclCommInitAll). Collectives
// run on the rank's current stream, so they order with the model's kernels and can be captured.
// libnccl.so.2 is opened on first use (dlopen): binaries that never shard do not need it, and it
// may come from the CUDA toolkit or from PyTorch's wheel (LD_LIBRARY_PATH).
#ifdef LONGCTX_WITH_NCCL
#include <dlfcn.h>
#include <nccl.h>

#include <cstdlib>
#include <mutex>
#include <string>

#include "core/cuda_stream.h"
#include "longctx/core/communicator.h"
#include "longctx/core/cuda_check.h"
#include "longctx/core/error.h"

namespace longctx {

namespace {

// The entry points used, from the library opened at run time.
struct NcclApi {
  decltype(&ncclCommInitAll) comm_init_all = nullptr;
  decltype(&ncclCommDestroy) comm_destroy = nullptr;
  decltype(&ncclAllReduce) all_reduce = nullptr;
  decltype(&ncclAllGather) all_gather = nullptr;
  decltype(&ncclGetErrorString) error_string = nullptr;
};

const NcclApi& nccl() {
  static NcclApi api;
  static std::once_flag once;
  static std::string failure;
  std::call_once(once, [] {
    void* lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      failure = dlerror();
      return;
    }
    auto sym = [&](const char* name) {
      void* p = dlsym(lib, name);
      if (p == nullptr) failure = std::string("no symbol ") + name;
      return p;
    };
    api.comm_init_all = reinterpret_cast<decltype(api.comm_init_all)>(sym("ncclCommInitAll"));
    api.comm_destroy = reinterpret_cast<decltype(api.comm_destroy)>(sym("ncclCommDestroy"));
    api.all_reduce = reinterpret_cast<decltype(api.all_reduce)>(sym("ncclAllReduce"));
    api.all_gather = reinterpret_cast<decltype(api.all_gather)>(sym("ncclAllGather"));
    api.error_string = reinterpret_cast<decltype(api.error_string)>(sym("ncclGetErrorString"));
  });
  LONGCTX_CHECK(failure.empty(), ErrorCode::kUnsupported,
                "tensor parallelism on GPUs: cannot load NCCL (libnccl.so.2: {}); put the folder "
                "that holds it on LD_LIBRARY_PATH (the CUDA toolkit's lib/, or PyTorch's "
                "nvidia/nccl/lib)",
                failure);
  return api;
}

#define LONGCTX_NCCL_CHECK(call)                                                         \
  do {                                                                                   \
    const ncclResult_t r_ = (call);                                                      \
    LONGCTX_CHECK(r_ == ncclSuccess, ErrorCode::kInternal, "NCCL: {} failed: {}", #call, \
                  nccl().error_string(r_));                                              \
  } while (0)

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::kF32:
      return ncclFloat32;
    case DType::kBF16:
      return ncclBfloat16;
    case DType::kF16:
      return ncclFloat16;
    default:
      LONGCTX_THROW(ErrorCode::kUnsupported, "NCCL collectives: dtype {} (f32, bf16, f16)",
                    dtype_name(t));
  }
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, int rank, int size, int device)
      : comm_(comm), rank_(rank), size_(size), device_(device) {}
  ~NcclCommunicator() override { nccl().comm_destroy(comm_); }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_reduce_sum(const Tensor& x) override {
    check(x, "all_reduce_sum's tensor");
    LONGCTX_NCCL_CHECK(nccl().all_reduce(x.data_ptr(), x.data_ptr(), static_cast<size_t>(x.numel()),
                                         nccl_type(x.dtype()), ncclSum, comm_,
                                         current_cuda_stream(device_)));
  }

  // Gathered as [size][rows][cols] (every rank the same cols), then placed column-wise.
  void all_gather_columns(const Tensor& local, const Tensor& out) override {
    check(local, "all_gather_columns' local tensor");
    check(out, "all_gather_columns' output");
    const int64_t rows = local.size(0), cols = local.size(1);
    LONGCTX_CHECK(out.rank() == 2 && out.size(0) == rows && out.size(1) == cols * size_ &&
                      out.dtype() == local.dtype(),
                  ErrorCode::kInvalidArgument,
                  "NCCL all_gather_columns: {} per rank into {} needs {} equal parts", local.str(),
                  out.str(), size_);
    cudaStream_t s = current_cuda_stream(device_);
    Tensor parts = Tensor::empty({size_, rows, cols}, local.dtype(), local.device());
    LONGCTX_NCCL_CHECK(nccl().all_gather(local.data_ptr(), parts.data_ptr(),
                                         static_cast<size_t>(rows * cols), nccl_type(local.dtype()),
                                         comm_, s));
    const size_t es = dtype_size(local.dtype());
    for (int r = 0; r < size_; ++r)
      LONGCTX_CUDA_CHECK(cudaMemcpy2DAsync(
          static_cast<char*>(out.data_ptr()) + r * cols * es, size_ * cols * es,
          static_cast<const char*>(parts.data_ptr()) + r * rows * cols * es, cols * es, cols * es,
          static_cast<size_t>(rows), cudaMemcpyDeviceToDevice, s));
  }

 private:
  void check(const Tensor& x, const char* what) const {
    LONGCTX_CHECK(
        x.defined() && x.device().is_cuda() && x.device().index == device_ && x.is_contiguous(),
        ErrorCode::kInvalidArgument,
        "NCCL communicator of cuda:{}: {} must be contiguous on that device, got {}", device_, what,
        x.defined() ? x.str() : std::string("undefined"));
  }

  ncclComm_t comm_;
  int rank_, size_, device_;
};

}  // namespace

std::vector<std::shared_ptr<Communicator>> make_nccl_communicators(
    const std::vector<int>& devices) {
  LONGCTX_CHECK(!devices.empty(), ErrorCode::kInvalidArgument, "NCCL: no devices");
  // NVLink multicast (NVLS) stays off, as the lent machines require.
  setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);
  std::vector<ncclComm_t> comms(devices.size());
  LONGCTX_NCCL_CHECK(
      nccl().comm_init_all(comms.data(), static_cast<int>(devices.size()), devices.data()));
  std::vector<std::shared_ptr<Communicator>> out;
  for (size_t r = 0; r < devices.size(); ++r)
    out.push_back(std::make_shared<NcclCommunicator>(comms[r], static_cast<int>(r),
                                                     static_cast<int>(devices.size()), devices[r]));
  return out;
}

}  // namespace longctx
#endif  // LONGCTX_WITH_NCCL
