// CPU references of the linear-attention kernels (see kernels/linear_attention_params.h); host
// pointers, fp32 throughout.
#pragma once

#include "kernels/linear_attention_params.h"

namespace longctx::kernels::cpu {

// The gated delta rule token by token (the decode form, and the reference of the chunked one).
void gated_delta_rule_recurrent(const GatedDeltaRuleParams& p);
// The chunk-parallel form (flash-linear-attention's chunk_gated_delta_rule, transformers'
// torch_chunk_gated_delta_rule): within a chunk of p.chunk_size tokens the WY representation
// (a unit lower-triangular solve over the chunk's keys) turns the sequential updates into
// matrix products; the state passes from chunk to chunk. Chunks start at each sequence's first
// row of the call, so a continued prefill chunks from where it resumed.
void gated_delta_rule_chunked(const GatedDeltaRuleParams& p);
// Causal depthwise conv1d with its state (prefill chunks and decode rows alike).
void causal_conv1d(const CausalConv1dParams& p);

}  // namespace longctx::kernels::cpu
