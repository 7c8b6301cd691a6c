// longctx quantize: write a quantized copy of a dense checkpoint in a published layout, by
// round-to-nearest (no calibration):
//   longctx quantize --model DIR --output DIR --method fp8|ct-fp8|awq|gptq
//                    [--group-size 128] [--block-size 128] [--asym] [--gptq-v2]
#include <cstdio>
#include <map>
#include <string>

#include "command.h"
#include "loader/quantize_checkpoint.h"
#include "longctx/core/error.h"

namespace longctx::cli {
namespace {

// The formats the tool writes (compressed-tensors FP8 with per-channel scales).
enum class Format { kFp8Block, kCtFp8Channel, kAwq, kGptq };

struct QuantizeOptions {
  std::string model, output;
  Format format = Format::kFp8Block;
  int64_t group_size = 128;
  int64_t block_size = 128;
  bool asym = false;
  bool gptq_v2 = false;
};

QuantConfig quant_config(const QuantizeOptions& o) {
  QuantConfig q;
  switch (o.format) {
    case Format::kFp8Block:
      q.method = QuantMethod::kFp8Block;
      q.bits = 8;
      q.block_out = q.block_in = o.block_size;
      break;
    case Format::kCtFp8Channel:
      q.method = QuantMethod::kCompressedFp8;
      q.bits = 8;
      q.fp8_strategy = Fp8ScaleStrategy::kChannel;
      q.ignore = {"lm_head"};
      break;
    case Format::kAwq:
      q.method = QuantMethod::kAwq;
      q.bits = 4;
      q.group_size = o.group_size;
      break;
    case Format::kGptq:
      q.method = QuantMethod::kGptq;
      q.bits = 4;
      q.group_size = o.group_size;
      q.symmetric = !o.asym;
      q.gptq_zero_minus_one = !o.gptq_v2;
      break;
  }
  LONGCTX_CHECK(!o.asym || o.format == Format::kGptq, ErrorCode::kInvalidArgument,
                "--asym applies to --method gptq only (AWQ is always asymmetric, FP8 symmetric)");
  LONGCTX_CHECK(!o.gptq_v2 || o.format == Format::kGptq, ErrorCode::kInvalidArgument,
                "--gptq-v2 applies to --method gptq only");
  LONGCTX_CHECK(o.group_size > 0, ErrorCode::kInvalidArgument,
                "--group-size must be positive, got {}", o.group_size);
  LONGCTX_CHECK(o.block_size > 0, ErrorCode::kInvalidArgument,
                "--block-size must be positive, got {}", o.block_size);
  return q;
}

CommandRegistration reg("quantize", [](CLI::App& app) {
  auto o = std::make_shared<QuantizeOptions>();
  CLI::App* cmd = app.add_subcommand(
      "quantize",
      "write a quantized copy of a bf16/f16/f32 checkpoint (round-to-nearest, no calibration)");
  cmd->add_option("--model", o->model, "the dense checkpoint folder")->required();
  cmd->add_option("--output", o->output, "the folder to write (must not exist or be empty)")
      ->required();
  const std::map<std::string, Format> formats = {{"fp8", Format::kFp8Block},
                                                 {"ct-fp8", Format::kCtFp8Channel},
                                                 {"awq", Format::kAwq},
                                                 {"gptq", Format::kGptq}};
  cmd->add_option("--method", o->format,
                  "fp8: block-wise FP8 E4M3 (weight_scale_inv per block); ct-fp8: "
                  "compressed-tensors FP8 (per-channel weight scales, dynamic per-token "
                  "activations); awq: AWQ GEMM int4 with zero points; gptq: GPTQ int4 "
                  "(desc_act false)")
      ->required()
      ->transform(CLI::CheckedTransformer(formats, CLI::ignore_case));
  cmd->add_option("--group-size", o->group_size, "awq / gptq: inputs per scale group")
      ->capture_default_str();
  cmd->add_option("--block-size", o->block_size, "fp8: the scale blocks' side")
      ->capture_default_str();
  cmd->add_flag("--asym", o->asym, "gptq: asymmetric (zero points per group; default symmetric)");
  cmd->add_flag("--gptq-v2", o->gptq_v2,
                "gptq: write checkpoint_format gptq_v2 (zeros as they are; default v1, zeros "
                "stored minus 1)");
  cmd->callback([o] {
    const QuantConfig q = quant_config(*o);
    const QuantizeStats s = quantize_checkpoint(o->model, o->output, q);
    std::printf(
        "wrote %s: %s, %lld linear weights quantized, %lld tensors copied, %.1f MB -> "
        "%.1f MB\n",
        o->output.c_str(), quant_method_name(q.method), static_cast<long long>(s.quantized_tensors),
        static_cast<long long>(s.copied_tensors), s.bytes_in / 1e6, s.bytes_out / 1e6);
  });
});

}  // namespace
}  // namespace longctx::cli
