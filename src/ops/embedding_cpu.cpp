#include <vector>

#include "longctx/core/parallel.h"
#include "ops/embedding.h"
#include "ops/op_utils.h"

namespace longctx::ops {

EmbeddingParams embedding_params(const Tensor& ids, const Tensor& table, const Tensor& out) {
  constexpr const char* kOp = "embedding";
  check_contiguous(kOp, "ids", ids);
  check_contiguous(kOp, "table", table);
  check_dtype(kOp, "ids", ids, DType::kI32);
  check_rank(kOp, "ids", ids, 1);
  check_rank(kOp, "table", table, 2);
  check_float_weight(kOp, "table", table);
  check_float_activation(kOp, "out", out);
  check_rank(kOp, "out", out, 2);
  EmbeddingParams p;
  p.n = ids.numel();
  p.vocab = table.size(0);
  p.hidden = table.size(1);
  check_shape(kOp, "out", out, {p.n, p.hidden});
  p.device = common_device(kOp, {&ids, &table, &out});
  p.ids = static_cast<const int32_t*>(ids.data_ptr());
  p.table = table.data_ptr();
  p.table_dtype = table.dtype();
  p.out = rows_view(kOp, "out", out);
  return p;
}

namespace {

void lookup_cpu(const EmbeddingParams& p) {
  LONGCTX_CHECK(p.device.is_cpu(), ErrorCode::kInvalidArgument, "embedding_cpu: tensors are on {}",
                p.device.str());
  for (int64_t i = 0; i < p.n && !p.zeros_outside; ++i)
    LONGCTX_CHECK(p.ids[i] >= 0 && p.ids[i] < p.vocab, ErrorCode::kOutOfRange,
                  "embedding: token id {} (at index {}) is outside the vocabulary [0, {})",
                  p.ids[i], i, p.vocab);
  const int64_t row_bytes = p.hidden * int64_t(dtype_size(p.table_dtype));
  parallel_for(
      p.n,
      [&](int64_t b, int64_t e) {
        std::vector<float> row(p.hidden);
        for (int64_t i = b; i < e; ++i) {
          const int64_t id = int64_t(p.ids[i]) - p.first_row;
          if (id >= 0 && id < p.vocab) {
            convert_to_f32(static_cast<const char*>(p.table) + id * row_bytes, p.table_dtype,
                           p.hidden, row.data());
            if (p.scale != 1.f)
              for (float& v : row) v *= p.scale;
          } else {
            std::fill(row.begin(), row.end(), 0.f);
          }
          store_row_f32(p.out, i, row.data());
        }
      },
      64);
}

}  // namespace

void embedding_cpu(const Tensor& ids, const Tensor& table, const Tensor& out, float scale) {
  EmbeddingParams p = embedding_params(ids, table, out);
  p.scale = scale;
  lookup_cpu(p);
}

void embedding_shard_cpu(const Tensor& ids, const Tensor& table, int64_t first_row,
                         const Tensor& out, float scale) {
  EmbeddingParams p = embedding_params(ids, table, out);
  p.scale = scale;
  p.first_row = first_row;
  p.zeros_outside = true;
  lookup_cpu(p);
}

}  // namespace longctx::ops
