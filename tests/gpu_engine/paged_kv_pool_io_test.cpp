// The KV store's block I/O on a CUDA pool (what the GPU engine's --kv-store reads and writes):
// the CPU suite's body (tests/kv) on the device.
#include "common/paged_kv_pool_io.h"

#include "longctx/core/stream.h"

namespace longctx {
namespace {

TEST(GpuPagedKVPoolIo, BlocksRoundTripInTheStoresOrder) {
  for (DType dtype : {DType::kBF16, DType::kF16, DType::kFP8E4M3}) {
    SCOPED_TRACE(dtype_name(dtype));
    testing::check_block_io_round_trip(Device::cuda(0), dtype);
  }
}

TEST(GpuPagedKVPoolIo, CopyStreamCopiesFromPinnedMemoryGiveTheSameBytes) {
  const Stream copies(Device::cuda(0));
  for (DType dtype : {DType::kBF16, DType::kFP8E4M3}) {
    SCOPED_TRACE(dtype_name(dtype));
    testing::check_async_block_io(
        Device::cuda(0), dtype, copies.handle(),
        [](int64_t n) { return Tensor::empty_pinned({n}, DType::kU8); },
        [&] { copies.synchronize(); });
  }
}

}  // namespace
}  // namespace longctx
