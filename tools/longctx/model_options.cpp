#include "model_options.h"

#include "longctx/core/error.h"

namespace longctx::cli {

void ModelOptions::add_to(CLI::App* cmd) {
  cmd->add_option("--model,-m", model, "Hugging Face checkpoint folder");
  cmd->add_option("--load-format", load_format, "auto (read --model) or dummy (random weights)")
      ->check(CLI::IsMember({"auto", "dummy"}));
  cmd->add_option("--preset", preset, "shape preset for --load-format dummy (e.g. qwen3-0.6b)");
  cmd->add_option("--dummy-seed", seed, "seed of the dummy weights");
  cmd->add_option("--rope-inv-freq-dtype", rope_inv_freq_dtype,
                  "f32: exact rope inv_freq (transformers from_pretrained, vLLM); checkpoint: "
                  "rounded to the checkpoint dtype, as a model cast with .to(dtype)")
      ->check(CLI::IsMember({"checkpoint", "f32"}))
      ->capture_default_str();
}

ModelBuildOptions ModelOptions::build_options(const Checkpoint& checkpoint) const {
  ModelBuildOptions options;
  options.rope_inv_freq_dtype =
      rope_inv_freq_dtype == "checkpoint" ? checkpoint.config.dtype : DType::kF32;
  return options;
}

std::shared_ptr<const Checkpoint> ModelOptions::load() const {
  if (load_format == "dummy") {
    LONGCTX_CHECK(!preset.empty(), ErrorCode::kInvalidArgument,
                  "--load-format dummy needs --preset NAME");
    return std::make_shared<const Checkpoint>(
        make_dummy_checkpoint(dummy_preset_config(preset), seed));
  }
  LONGCTX_CHECK(!model.empty(), ErrorCode::kInvalidArgument,
                "give --model DIR (or --load-format dummy --preset NAME)");
  return std::make_shared<const Checkpoint>(load_checkpoint(model));
}

}  // namespace longctx::cli
