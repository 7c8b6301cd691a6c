// CUDA add: out = a + b in fp32 per element, one thread per kVec (or 1) elements of a row.
// out may be a or b exactly: each element is read and written by the same thread.
#include "longctx/core/stream.h"
#include "ops/add.h"
#include "ops/ops_device.cuh"

namespace longctx::ops {

namespace {

using namespace cuda_detail;

template <int N, typename TA, typename TB, typename TO>
struct AddRow {
  AddParams p;
  __device__ void operator()(int64_t r, int64_t chunk) const {
    const int64_t col = chunk * N;
    float a[N], b[N], o[N];
    load<N>(row_of<const TA>(p.a, r) + col, a);
    load<N>(row_of<const TB>(p.b, r) + col, b);
#pragma unroll
    for (int i = 0; i < N; ++i) o[i] = a[i] + b[i];
    store<N>(row_of<TO>(p.out, r) + col, o);
  }
};

}  // namespace

void add_cuda(const Tensor& a, const Tensor& b, const Tensor& out) {
  const AddParams p = add_params(a, b, out);
  DeviceGuard guard(p.device.index);
  cudaStream_t stream = op_stream(p.device, "add");
  const int64_t rows = p.a.rows, cols = p.a.cols;
  const bool vec =
      cols % kVec == 0 && rows_aligned16(p.a) && rows_aligned16(p.b) && rows_aligned16(p.out);
  visit_float(p.a.dtype, "add", [&](auto ta) {
    visit_float(p.b.dtype, "add", [&](auto tb) {
      visit_float(p.out.dtype, "add", [&](auto to) {
        using TA = decltype(ta);
        using TB = decltype(tb);
        using TO = decltype(to);
        if (vec)
          launch_rows(AddRow<kVec, TA, TB, TO>{p}, rows, cols / kVec, stream);
        else
          launch_rows(AddRow<1, TA, TB, TO>{p}, rows, cols, stream);
      });
    });
  });
}

}  // namespace longctx::ops
