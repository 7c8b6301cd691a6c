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

struct QuantizeOptions {
  std::string model, output;
  QuantFormatOptions format;
};

CommandRegistration reg("quantize", [](CLI::App& app) {
  auto o = std::make_shared<QuantizeOptions>();
  CLI::App* cmd = app.add_subcommand(
      "quantize",
      "write a quantized copy of a bf16/f16/f32 checkpoint (round-to-nearest, no calibration)");
  cmd->add_option("--model", o->model, "the dense checkpoint folder")->required();
  cmd->add_option("--output", o->output, "the folder to write (must not exist or be empty)")
      ->required();
  cmd->add_option("--method", o->format.format,
                  "fp8: block-wise FP8 E4M3 (weight_scale_inv per block); ct-fp8: "
                  "compressed-tensors FP8 (per-channel weight scales, dynamic per-token "
                  "activations); awq: AWQ GEMM int4 with zero points; gptq: GPTQ int4 "
                  "(desc_act false)")
      ->required()
      ->transform(CLI::CheckedTransformer(quant_format_names(), CLI::ignore_case));
  cmd->add_option("--group-size", o->format.group_size, "awq / gptq: inputs per scale group")
      ->capture_default_str();
  cmd->add_option("--block-size", o->format.block_size, "fp8: the scale blocks' side")
      ->capture_default_str();
  cmd->add_flag("--asym", o->format.asym,
                "gptq: asymmetric (zero points per group; default symmetric)");
  cmd->add_flag("--gptq-v2", o->format.gptq_v2,
                "gptq: write checkpoint_format gptq_v2 (zeros as they are; default v1, zeros "
                "stored minus 1)");
  cmd->callback([o] {
    const QuantConfig q = quant_config_for(o->format);
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
