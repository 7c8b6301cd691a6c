// `longctx quantize`: a dense (bf16 / f16 / f32) checkpoint folder -> a quantized one in a
// published layout (block-wise FP8, compressed-tensors FP8, AWQ GEMM, GPTQ), by round-to-nearest
// (no calibration data, no GPTQ error feedback, no AWQ activation-aware scaling).
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <string>

#include "longctx/loader/quantization.h"

namespace longctx {

// The formats the tool writes and dummy weights take (compressed-tensors FP8 with per-channel
// scales), by the names of `--method` / `--quantization`: fp8, ct-fp8, awq, gptq.
enum class QuantFormat { kFp8Block, kCtFp8Channel, kAwq, kGptq };
const std::map<std::string, QuantFormat>& quant_format_names();

struct QuantFormatOptions {
  QuantFormat format = QuantFormat::kFp8Block;
  int64_t group_size = 128;  // awq / gptq: inputs per scale group
  int64_t block_size = 128;  // fp8: the scale blocks' side
  bool asym = false;         // gptq: zero points per group (default symmetric)
  bool gptq_v2 = false;      // gptq: checkpoint_format gptq_v2 (zeros as they are)
};

// The QuantConfig of a format. Throws Error(kInvalidArgument) naming the flag for options the
// format does not take or non-positive sizes.
QuantConfig quant_config_for(const QuantFormatOptions& o);

// The quantization_config a checkpoint of `q` carries, as its publishers write it.
nlohmann::json quantization_config_json(const QuantConfig& q);

// Whether the tool quantizes tensor `name` of `shape`: the decoder layers' Linear weights
// (`*.layers.N.*_proj.weight`, matrices; MoE experts one by one), not embeddings, norms, the
// router or lm_head, nor a module `q.ignores`.
bool quantizes_tensor(const std::string& name, const Shape& shape, const QuantConfig& q);

struct QuantizeStats {
  int64_t quantized_tensors = 0;
  int64_t copied_tensors = 0;
  size_t bytes_in = 0, bytes_out = 0;
};

// Reads the checkpoint in `src` (which must load and be unquantized), writes `dst` (created;
// it must not exist or be empty): model.safetensors, config.json with quantization_config, and
// the tokenizer and generation files copied. Fused MoE experts (`mlp.experts.gate_up_proj`,
// `down_proj`, 3-D) are written per expert and quantized like every Linear, as quantized MoE
// checkpoints are published. Throws Error naming the problem.
QuantizeStats quantize_checkpoint(const std::string& src, const std::string& dst,
                                  const QuantConfig& q);

}  // namespace longctx
