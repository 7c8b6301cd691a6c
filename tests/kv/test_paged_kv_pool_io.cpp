// The KV store's block I/O on a CPU pool (the GPU twin runs the same body: tests/gpu_engine).
#include "common/paged_kv_pool_io.h"

namespace longctx {
namespace {

TEST(PagedKVPoolIo, BlocksRoundTripInTheStoresOrder) {
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kFP8E4M3}) {
    SCOPED_TRACE(dtype_name(dtype));
    testing::check_block_io_round_trip(Device::cpu(), dtype);
  }
}

TEST(PagedKVPoolIo, AsynchronousCopiesGiveTheSameBytes) {
  for (DType dtype : {DType::kF32, DType::kFP8E4M3}) {
    SCOPED_TRACE(dtype_name(dtype));
    testing::check_async_block_io(
        Device::cpu(), dtype, nullptr, [](int64_t n) { return Tensor::empty({n}, DType::kU8); },
        [] {});
  }
}

}  // namespace
}  // namespace longctx
