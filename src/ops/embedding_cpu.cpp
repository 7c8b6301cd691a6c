#include "longctx/core/parallel.h"
#include "ops/embedding.h"
#include "ops/op_utils.h"

namespace longctx::ops {

void embedding_cpu(const Tensor& ids, const Tensor& table, const Tensor& out) {
  constexpr const char* kOp = "embedding";
  check_contiguous(kOp, "ids", ids);
  check_contiguous(kOp, "table", table);
  check_contiguous(kOp, "out", out);
  check_dtype(kOp, "ids", ids, DType::kI32);
  check_rank(kOp, "ids", ids, 1);
  check_rank(kOp, "table", table, 2);
  check_float_weight(kOp, "table", table);
  check_dtype(kOp, "out", out, DType::kF32);
  const int64_t n = ids.numel(), vocab = table.size(0), hidden = table.size(1);
  check_shape(kOp, "out", out, {n, hidden});
  const int32_t* id = ids.data<int32_t>();
  for (int64_t i = 0; i < n; ++i)
    LONGCTX_CHECK(id[i] >= 0 && id[i] < vocab, ErrorCode::kOutOfRange,
                  "embedding: token id {} (at index {}) is outside the vocabulary [0, {})", id[i],
                  i, vocab);
  float* o = out.data<float>();
  parallel_for(
      n,
      [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i)
          convert_to_f32(element_ptr(table, int64_t(id[i]) * hidden), table.dtype(), hidden,
                         o + i * hidden);
      },
      64);
}

}  // namespace longctx::ops
