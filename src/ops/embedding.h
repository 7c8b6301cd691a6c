// Token embedding: out[i, :] = table[ids[i], :] converted to f32 (nn.Embedding lookup).
#pragma once

#include "longctx/core/tensor.h"

namespace longctx::ops {

// ids: [n] i32; table: [vocab, hidden] f32/bf16/f16; out: [n, hidden] f32.
// Throws Error(kOutOfRange) naming the first id outside [0, vocab).
void embedding(const Tensor& ids, const Tensor& table, const Tensor& out);
void embedding_cpu(const Tensor& ids, const Tensor& table, const Tensor& out);

}  // namespace longctx::ops
