// CPU references of XAttention's estimate and selection (kernels/xattention_params.h): what the
// CUDA kernels (kernels/cuda/xattention.h) are tested against and what the CPU engine's policy
// runs (attention/sparse/xattention.cpp). fp32 dot products on bf16 / f16 / f32 storage, the masses
// in double.
#pragma once

#include <vector>

#include "kernels/xattention_params.h"

namespace longctx::kernels::cpu {

// Throws Error(kInvalidArgument) for a stride that does not divide 128 or a threshold outside
// (0, 1].
void check_xattn_options(int stride, double threshold);

void xattn_estimate(const XAttnEstimateParams& params);
void xattn_select(const XAttnSelectParams& params);

// Copies what XAttnGatherParams names; returns the bytes copied.
int64_t xattn_gather_values(const XAttnGatherParams& params);
// Whether request b's mask keeps key block kb (of 128) for some q head of KV head h's group and
// some query block.
bool xattn_gather_keeps(const XAttnGatherParams& params, int b, int h, int64_t kb);

// Request b's masses of (q head h, query block i) per key block [k_blocks], from block_lse.
std::vector<double> xattn_block_masses(const XAttnSelectParams& params, int b, int h, int64_t i);

}  // namespace longctx::kernels::cpu
