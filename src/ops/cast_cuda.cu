// CUDA cast: one thread per kVec (or 1) elements of a row, through f32 (exact for every source
// dtype), rounded to nearest even on store.
#include "longctx/core/stream.h"
#include "ops/cast.h"
#include "ops/ops_device.cuh"

namespace longctx::ops {

namespace {

using namespace cuda_detail;

template <int N, typename TX, typename TO>
struct CastRow {
  CastParams p;
  __device__ void operator()(int64_t r, int64_t chunk) const {
    const int64_t col = chunk * N;
    float v[N];
    load<N>(row_of<const TX>(p.x, r) + col, v);
    store<N>(row_of<TO>(p.out, r) + col, v);
  }
};

}  // namespace

void cast_cuda(const Tensor& x, const Tensor& out) {
  const CastParams p = cast_params(x, out);
  DeviceGuard guard(p.device.index);
  cudaStream_t stream = op_stream(p.device, "cast");
  const int64_t rows = p.x.rows, cols = p.x.cols;
  const bool vec = cols % kVec == 0 && rows_aligned16(p.x) && rows_aligned16(p.out);
  visit_float(p.x.dtype, "cast", [&](auto tx) {
    visit_float(p.out.dtype, "cast", [&](auto to) {
      using TX = decltype(tx);
      using TO = decltype(to);
      if (vec)
        launch_rows(CastRow<kVec, TX, TO>{p}, rows, cols / kVec, stream);
      else
        launch_rows(CastRow<1, TX, TO>{p}, rows, cols, stream);
    });
  });
}

}  // namespace longctx::ops
