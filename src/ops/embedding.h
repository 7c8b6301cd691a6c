// Token embedding: out[i, :] = table[ids[i], :] * scale converted to out's dtype (nn.Embedding
// lookup; scale: Gemma's sqrt(hidden_size), 1 elsewhere), in fp32.
#pragma once

#include <cstdint>

#include "longctx/core/tensor.h"
#include "ops/op_params.h"

namespace longctx::ops {

// ids: [n] i32; table: [vocab, hidden] f32/bf16/f16 (contiguous); out: [n, hidden] f32/bf16/f16
// (rows may be strided). All on one device.
// CPU: throws Error(kOutOfRange) naming the first id outside [0, vocab).
// CUDA: the ids are device memory, so they are not checked there (that would need a device ->
// host copy and a sync); the caller validates them on the host before uploading. The kernel
// writes a row of zeros for an id outside [0, vocab) so a bad id can never fault.
void embedding(const Tensor& ids, const Tensor& table, const Tensor& out, float scale = 1.f);
void embedding_cpu(const Tensor& ids, const Tensor& table, const Tensor& out, float scale);
void embedding_cuda(const Tensor& ids, const Tensor& table, const Tensor& out, float scale);

// Vocab-parallel lookup (tensor parallelism): `table` holds rows [first_row, first_row + vocab)
// of the whole vocabulary; an id outside them gives a row of zeros (another rank holds it).
void embedding_shard(const Tensor& ids, const Tensor& table, int64_t first_row, const Tensor& out,
                     float scale = 1.f);
void embedding_shard_cpu(const Tensor& ids, const Tensor& table, int64_t first_row,
                         const Tensor& out, float scale);
void embedding_shard_cuda(const Tensor& ids, const Tensor& table, int64_t first_row,
                          const Tensor& out, float scale);

struct EmbeddingParams {
  const int32_t* ids = nullptr;  // [n]
  int64_t n = 0;
  const void* table = nullptr;  // [vocab, hidden], contiguous
  DType table_dtype = DType::kF32;
  int64_t vocab = 0, hidden = 0;
  RowsView out;  // [n, hidden]
  Device device;
  int64_t first_row = 0;       // the table's first row in the whole vocabulary
  bool zeros_outside = false;  // an id outside the table: zeros (else an error on the CPU)
  float scale = 1.f;           // multiplies every looked-up value
};
// Checks the arguments (shapes, dtypes, one device; not the id values) for both twins.
EmbeddingParams embedding_params(const Tensor& ids, const Tensor& table, const Tensor& out);

}  // namespace longctx::ops
