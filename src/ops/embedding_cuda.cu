// CUDA embedding: one thread per kVec (or 1) elements of an output row; an id outside the
// vocabulary writes zeros (the ids are validated on the host, see embedding.h).
#include "longctx/core/stream.h"
#include "ops/embedding.h"
#include "ops/ops_device.cuh"

namespace longctx::ops {

namespace {

using namespace cuda_detail;

template <int N, typename TT, typename TO>
struct EmbeddingRow {
  EmbeddingParams p;
  __device__ void operator()(int64_t r, int64_t chunk) const {
    const int64_t col = chunk * N;
    const int64_t id = int64_t(p.ids[r]) - p.first_row;
    float v[N];
    if (id >= 0 && id < p.vocab) {
      load<N>(static_cast<const TT*>(p.table) + int64_t(id) * p.hidden + col, v);
#pragma unroll
      for (int i = 0; i < N; ++i) v[i] = __fmul_rn(v[i], p.scale);
    } else {
#pragma unroll
      for (int i = 0; i < N; ++i) v[i] = 0.f;
    }
    store<N>(row_of<TO>(p.out, r) + col, v);
  }
};

void lookup_cuda(const EmbeddingParams& p) {
  DeviceGuard guard(p.device.index);
  cudaStream_t stream = op_stream(p.device, "embedding");
  const bool vec = p.hidden % kVec == 0 && reinterpret_cast<uintptr_t>(p.table) % 16 == 0 &&
                   rows_aligned16(p.out);
  visit_float(p.table_dtype, "embedding", [&](auto tt) {
    visit_float(p.out.dtype, "embedding", [&](auto to) {
      using TT = decltype(tt);
      using TO = decltype(to);
      if (vec)
        launch_rows(EmbeddingRow<kVec, TT, TO>{p}, p.n, p.hidden / kVec, stream);
      else
        launch_rows(EmbeddingRow<1, TT, TO>{p}, p.n, p.hidden, stream);
    });
  });
}

}  // namespace

void embedding_shard_cuda(const Tensor& ids, const Tensor& table, int64_t first_row,
                          const Tensor& out, float scale) {
  EmbeddingParams p = embedding_params(ids, table, out);
  p.scale = scale;
  p.first_row = first_row;
  p.zeros_outside = true;
  lookup_cuda(p);
}

void embedding_cuda(const Tensor& ids, const Tensor& table, const Tensor& out, float scale) {
  EmbeddingParams p = embedding_params(ids, table, out);
  p.scale = scale;
  lookup_cuda(p);
}

}  // namespace longctx::ops
