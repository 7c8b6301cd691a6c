#include "models/tensor_parallel.h"

#include <algorithm>

#include "longctx/core/error.h"

namespace longctx::models {

TpShard tp_shard(const ModelConfig& c, int rank, int size) {
  using E = ErrorCode;
  LONGCTX_CHECK(size >= 1 && rank >= 0 && rank < size, E::kInvalidArgument,
                "tensor parallel: rank {} of {}", rank, size);
  const int64_t hq = c.num_attention_heads, hkv = c.num_key_value_heads;
  LONGCTX_CHECK(hq % size == 0, E::kInvalidArgument,
                "tensor parallel size {}: {} attention heads do not split evenly", size, hq);
  LONGCTX_CHECK(hkv % size == 0 || size % hkv == 0, E::kInvalidArgument,
                "tensor parallel size {}: {} KV heads neither split evenly nor replicate evenly",
                size, hkv);
  LONGCTX_CHECK(c.intermediate_size % size == 0, E::kInvalidArgument,
                "tensor parallel size {}: intermediate_size {} does not split evenly", size,
                c.intermediate_size);
  const MoeConfig& m = c.moe;
  LONGCTX_CHECK(m.moe_intermediate_size % size == 0, E::kInvalidArgument,
                "tensor parallel size {}: moe_intermediate_size {} does not split evenly", size,
                m.moe_intermediate_size);
  LONGCTX_CHECK(m.shared_expert_intermediate_size % size == 0, E::kInvalidArgument,
                "tensor parallel size {}: shared_expert_intermediate_size {} does not split "
                "evenly",
                size, m.shared_expert_intermediate_size);
  TpShard s;
  s.rank = rank;
  s.size = size;
  s.num_q_heads = hq / size;
  s.q_head0 = rank * s.num_q_heads;
  if (hkv >= size) {
    s.num_kv_heads = hkv / size;
    s.kv_head0 = rank * s.num_kv_heads;
  } else {
    s.num_kv_heads = 1;
    s.kv_head0 = rank / (size / hkv);
  }
  s.inter = c.intermediate_size / size;
  s.inter0 = rank * s.inter;
  s.moe_inter = m.moe_intermediate_size / size;
  s.moe_inter0 = rank * s.moe_inter;
  s.shared_inter = m.shared_expert_intermediate_size / size;
  s.shared_inter0 = rank * s.shared_inter;
  const int64_t per = (c.vocab_size + size - 1) / size;
  s.vocab0 = std::min<int64_t>(c.vocab_size, rank * per);
  s.vocab = std::min<int64_t>(c.vocab_size, s.vocab0 + per) - s.vocab0;
  return s;
}

ModelConfig tp_local_config(const ModelConfig& config, const TpShard& s) {
  ModelConfig c = config;
  c.num_attention_heads = s.num_q_heads;
  c.num_key_value_heads = s.num_kv_heads;
  c.intermediate_size = s.inter;
  c.moe.moe_intermediate_size = s.moe_inter;
  c.moe.shared_expert_intermediate_size = s.shared_inter;
  return c;
}

}  // namespace longctx::models
