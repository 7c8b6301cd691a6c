// The packed tensors of quantized Linears (layouts in include/longctx/loader/quantization.h):
// recognized in a checkpoint, checked, dequantized on the CPU, and made from dense weights by
// round-to-nearest (the `longctx quantize` tool).
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "longctx/core/tensor.h"
#include "longctx/loader/checkpoint.h"
#include "longctx/loader/quantization.h"

namespace longctx {

// The dense [out, in] weight of `w` in `dtype` (f32, bf16 or f16), computed in f32 and rounded
// once: W = q * scale (FP8) or (q - z) * scale (int4).
Tensor dequantize(const QuantizedWeight& w, const QuantConfig& q, DType dtype);

// Every quantized Linear of `raw` (a `<module>.qweight`, or an F8_E4M3 `<module>.weight`) with
// its scales (and zeros, g_idx), checked and put in `quantized` under the dense weight's name
// (`<module>.weight`), as stored: nothing is dequantized (Checkpoint::dense_weight does that for
// a path that asks). Returns the other tensors. Throws Error naming the tensor and what was
// expected: a missing scale or zero tensor, a wrong shape or dtype, a group size that does not
// divide in_features, a non-trivial g_idx, a quantized tensor the config does not announce (or a
// layer its ignore list names), a dense `<module>.weight` beside packed int4 tensors.
WeightStore extract_quantized(const WeightStore& raw, const QuantConfig& q,
                              std::map<std::string, QuantizedWeight>& quantized,
                              const std::string& where);

// Round-to-nearest quantization of a dense [out, in] weight (any float dtype) in q's format
// (no calibration: scales from each block's / channel's / group's range). The packed tensors own
// their memory. Throws Error(kInvalidArgument) naming `name` when the shape does not fit the
// format (in_features not a multiple of the group size, out or in not a multiple of 8).
QuantizedWeight quantize_rtn(const Tensor& weight, const QuantConfig& q, const std::string& name);

// The packed tensors (uninitialized) of a [out, in] Linear in q's format: their shapes and
// dtypes. Throws Error(kInvalidArgument) naming `name` when the shape does not fit the format.
QuantizedWeight quantized_layout(int64_t out, int64_t in, const QuantConfig& q,
                                 const std::string& name);

// The Linears `parts` (same method and in_features) stacked along out_features, as dense weights
// are stacked by rows (q/k/v into one projection), in the format's own layout: int4 qweight,
// qzeros and scales side by side along their out dimension, FP8 weights and scales one above the
// other. Returns a weight of method kNone when the format cannot stack them: FP8 per-tensor
// scales (one scale each), FP8 blocks that a part's rows end inside, int4 parts whose
// out_features are not multiples of 8, g_idx that differ. One part is returned as it is.
QuantizedWeight stack_quantized(const std::vector<QuantizedWeight>& parts, const QuantConfig& q);

// One MoE layer's FP8-block experts fused as ops::MoeArgs reads them: each expert's gate rows,
// then its up rows (as the bf16 experts are fused), gate and up blocked apart so that a block
// never spans both.
struct Fp8Experts {
  Tensor gate_up;         // [E, 2 inter, hidden] F8_E4M3
  Tensor gate_up_scales;  // [E, 2 ceil(inter / block_out), ceil(hidden / block_in)] f32
  Tensor down;            // [E, hidden, inter] F8_E4M3
  Tensor down_scales;     // [E, ceil(hidden / block_out), ceil(inter / block_in)] f32
};

// Fuses experts e's gate[e] and up[e] ([inter, hidden]) and down[e] ([hidden, inter]), all
// kFp8Block (q's), into owned tensors (scales converted to f32, exactly). Throws
// Error(kInvalidArgument) naming `layer`, the expert and the tensor whose method, shape or scales
// shape differs from expert 0's (or from the format's).
Fp8Experts fuse_fp8_experts(const std::vector<QuantizedWeight>& gate,
                            const std::vector<QuantizedWeight>& up,
                            const std::vector<QuantizedWeight>& down, const QuantConfig& q,
                            const std::string& layer);

// Rows [row0, row0 + rows) of `w` in the format's own layout (the inverse of stack_quantized: a
// fused projection such as Phi-3's qkv_proj split into q, k and v), dequantizing to the same
// values as those rows of `w`. Returns a weight of method kNone when the format cannot split
// there: FP8 blocks that the range starts or ends inside (unless it ends at out_features), int4
// rows not at multiples of 8. FP8 parts view `w`'s bytes; int4 parts are contiguous copies.
QuantizedWeight slice_quantized(const QuantizedWeight& w, const QuantConfig& q, int64_t row0,
                                int64_t rows);

// The bytes of the packed tensors (g_idx included) that `w` holds.
int64_t quantized_bytes(const QuantizedWeight& w);

// The bytes of the packed tensors of a [out, in] Linear in q's format (g_idx included).
int64_t quantized_bytes(int64_t out, int64_t in, const QuantConfig& q);

// Random packed tensors of a [out, in] Linear in q's format (dummy weights; defined in dummy.cpp
// beside the dense fills): uniform codes, zero points around the middle, scales so that the
// dequantized weight has about `std`.
QuantizedWeight random_quantized(int64_t out, int64_t in, const QuantConfig& q, uint64_t seed,
                                 float std, const std::string& name);

// The checkpoint tensors of `w` for module `module` ("model.layers.0.mlp.up_proj"), under the
// names its format uses, in the order they are written.
std::vector<std::pair<std::string, Tensor>> quantized_tensors(const std::string& module,
                                                              const QuantizedWeight& w);

}  // namespace longctx
