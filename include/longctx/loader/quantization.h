// Quantized checkpoints: config.json's `quantization_config` parsed once into a QuantConfig (an
// enum per method, nothing downstream compares strings), and the packed tensors of each quantized
// linear layer kept as they were stored (QuantizedWeight) beside the dense weight the engine runs.
//
// Formats, as their publishers lay them out (W is a Linear's [out, in] weight):
// - kFp8Block (`quant_method: "fp8"`, DeepSeek-V3 / Qwen3-FP8): `weight` F8_E4M3 [out, in],
//   `weight_scale_inv` f32 [ceil(out/bo), ceil(in/bi)]; W = weight * scale_inv of its block.
// - kCompressedFp8 (`quant_method: "compressed-tensors"`, `format: "float-quantized"`):
//   `weight` F8_E4M3 [out, in], `weight_scale` [out, 1] (strategy channel) or [1] / [] (tensor);
//   W = weight * scale. Activations are quantized per token at run time (dynamic), so the
//   checkpoint holds no input scale. The `ignore` list names layers left unquantized.
// - kAwq (`quant_method: "awq"`, `version: "gemm"`): `qweight` i32 [in, out/8] (eight 4-bit
//   values per word, output columns 8p + {0,2,4,6,1,3,5,7} in nibbles 0..7), `qzeros` i32
//   [in/g, out/8] packed the same way, `scales` f16 [in/g, out]; W[o][i] = (q - z) * s of the
//   group i / g.
// - kGptq (`quant_method: "gptq"`, desc_act false): `qweight` i32 [in/8, out] (input rows
//   8r..8r+7 in nibbles 0..7), `qzeros` i32 [in/g, out/8] (columns in nibble order), `scales` f16
//   [in/g, out], `g_idx` i32 [in] (must be i / g); W[o][i] = (q - z) * s. The v1 checkpoint
//   format (`checkpoint_format: "gptq"`, the default) stores z - 1, v2 ("gptq_v2") stores z.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "longctx/core/tensor.h"

namespace longctx {

enum class QuantMethod { kNone, kFp8Block, kCompressedFp8, kAwq, kGptq };

// Scales of compressed-tensors FP8 weights: one per output channel or one per tensor.
enum class Fp8ScaleStrategy { kChannel, kTensor };

// "none", "fp8", "compressed-tensors", "awq", "gptq": the config's quant_method.
const char* quant_method_name(QuantMethod method);

struct QuantConfig {
  QuantMethod method = QuantMethod::kNone;
  int bits = 16;
  // kFp8Block: the scale blocks' [rows, cols] of W.
  int64_t block_out = 0, block_in = 0;
  // kCompressedFp8.
  Fp8ScaleStrategy fp8_strategy = Fp8ScaleStrategy::kChannel;
  // kAwq / kGptq: input features per group; 0 = one group over every input (GPTQ's -1).
  int64_t group_size = 0;
  bool symmetric = false;            // kGptq: zero point fixed at 2^(bits-1)
  bool gptq_zero_minus_one = false;  // kGptq v1 checkpoint format: qzeros hold z - 1
  // Layers left unquantized (compressed-tensors `ignore`, AWQ `modules_to_not_convert`, fp8
  // `ignored_layers`): module names, or "re:<regex>" matched against the whole name.
  std::vector<std::string> ignore;

  bool quantized() const { return method != QuantMethod::kNone; }
  // Whether module `name` (a weight's name less ".weight") is listed in `ignore`.
  bool ignores(const std::string& module) const;
  // The group size of a layer of `in_features` inputs (group_size, or in_features for 0).
  int64_t group_of(int64_t in_features) const { return group_size > 0 ? group_size : in_features; }
};

// The `quantization_config` of a config.json object (kNone when absent or null). Throws
// Error(kUnsupported) naming the field for a method, bit width, format or option longctx does not
// load (e.g. GPTQ desc_act true, AWQ without zero points, FP8 static activations), and
// Error(kInvalidArgument) for malformed values.
QuantConfig parse_quant_config(const nlohmann::json& config, const std::string& source);

// The packed tensors of one quantized Linear, as stored in the checkpoint (views of its mmap), so
// that a device path can run them without the dense copy. `qweight` is `weight` for the FP8
// formats; `qzeros` and `g_idx` are undefined where the format has none.
struct QuantizedWeight {
  QuantMethod method = QuantMethod::kNone;
  int64_t out_features = 0, in_features = 0;
  Tensor qweight;
  Tensor scales;  // weight_scale_inv / weight_scale / scales
  Tensor qzeros;
  Tensor g_idx;
};

}  // namespace longctx
