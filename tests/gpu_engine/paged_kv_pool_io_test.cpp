// The KV store's block I/O on a CUDA pool (what the GPU engine's --kv-store reads and writes):
// the CPU suite's body (tests/kv) on the device.
#include "common/paged_kv_pool_io.h"

namespace longctx {
namespace {

TEST(GpuPagedKVPoolIo, BlocksRoundTripInTheStoresOrder) {
  for (DType dtype : {DType::kBF16, DType::kF16, DType::kFP8E4M3}) {
    SCOPED_TRACE(dtype_name(dtype));
    testing::check_block_io_round_trip(Device::cuda(0), dtype);
  }
}

}  // namespace
}  // namespace longctx
