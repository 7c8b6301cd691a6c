// CUDA gather_rows: a byte copy of each selected row in the widest unit (16 down to 1 bytes)
// that every row start and the row length allow; an index outside [0, n) writes zeros.
#include "longctx/core/stream.h"
#include "ops/gather_rows.h"
#include "ops/ops_device.cuh"

namespace longctx::ops {

namespace {

using namespace cuda_detail;

template <typename U>
struct GatherRow {
  GatherRowsParams p;
  int64_t element_size;
  __device__ void operator()(int64_t r, int64_t unit) const {
    const int32_t src = p.rows[r];
    U* out =
        reinterpret_cast<U*>(static_cast<char*>(p.out.data) + p.out.row_offset(r) * element_size) +
        unit;
    if (src >= 0 && src < p.x.rows) {
      *out = reinterpret_cast<const U*>(static_cast<const char*>(p.x.data) +
                                        p.x.row_offset(src) * element_size)[unit];
    } else {
      *out = U{};
    }
  }
};

// Largest power of two <= 16 dividing every row start of v (in bytes).
int64_t row_alignment(const RowsView& v) {
  const int64_t es = int64_t(dtype_size(v.dtype));
  int64_t a = 16;
  auto fit = [&](int64_t bytes) {
    while (a > 1 && bytes % a != 0) a /= 2;
  };
  fit(int64_t(reinterpret_cast<uintptr_t>(v.data) % 16));
  if (v.rows > v.inner) fit(v.stride_outer * es);
  if (v.inner > 1) fit(v.stride_inner * es);
  return a;
}

template <typename U>
void launch_gather(const GatherRowsParams& p, int64_t row_bytes, cudaStream_t stream) {
  launch_rows(GatherRow<U>{p, int64_t(dtype_size(p.x.dtype))}, p.num_rows,
              row_bytes / int64_t(sizeof(U)), stream);
}

}  // namespace

void gather_rows_cuda(const Tensor& x, const Tensor& rows, const Tensor& out) {
  const GatherRowsParams p = gather_rows_params(x, rows, out);
  DeviceGuard guard(p.device.index);
  cudaStream_t stream = op_stream(p.device, "gather_rows");
  const int64_t row_bytes = p.x.cols * int64_t(dtype_size(p.x.dtype));
  int64_t unit = std::min(row_alignment(p.x), row_alignment(p.out));
  while (unit > 1 && row_bytes % unit != 0) unit /= 2;
  switch (unit) {
    case 16:
      return launch_gather<uint4>(p, row_bytes, stream);
    case 8:
      return launch_gather<uint2>(p, row_bytes, stream);
    case 4:
      return launch_gather<uint32_t>(p, row_bytes, stream);
    case 2:
      return launch_gather<uint16_t>(p, row_bytes, stream);
    default:
      return launch_gather<uint8_t>(p, row_bytes, stream);
  }
}

}  // namespace longctx::ops
