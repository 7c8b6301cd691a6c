// create_model: config.architecture -> the architecture's constructor. The list of names must
// stay identical to the loader's supported_architectures().
#include <string>
#include <utility>

#include "longctx/models/model.h"
#include "models/architectures.h"

namespace longctx {

namespace {

using Factory = std::unique_ptr<Model> (*)(std::shared_ptr<const Checkpoint>,
                                           const ModelBuildOptions&);

const std::pair<const char*, Factory> kArchitectures[] = {
    {"LlamaForCausalLM", models::make_llama},
    {"MistralForCausalLM", models::make_llama},
    {"Qwen2ForCausalLM", models::make_qwen2},
    {"Qwen3ForCausalLM", models::make_qwen3},
    {"Phi3ForCausalLM", models::make_llama},  // fused qkv / gate_up split by the loader
    {"Gemma3ForCausalLM", models::make_gemma3},
    {"Gemma3ForConditionalGeneration", models::make_gemma3},  // its text model
    {"Qwen2MoeForCausalLM", models::make_qwen2},              // + the MoE block of decoder_common
    {"Qwen3MoeForCausalLM", models::make_qwen3},
    {"Qwen3NextForCausalLM", models::make_qwen3_next},
    // Qwen3.5: Qwen3-Next's model with the projections stored apart (config.linear), dense MLPs
    // in Qwen3_5; the wrappers' text model
    {"Qwen3_5ForCausalLM", models::make_qwen3_next},
    {"Qwen3_5MoeForCausalLM", models::make_qwen3_next},
    {"Qwen3_5ForConditionalGeneration", models::make_qwen3_next},
    {"Qwen3_5MoeForConditionalGeneration", models::make_qwen3_next},
};

}  // namespace

bool packs_quantized_linears(const QuantConfig& quantization, const ModelBuildOptions& options,
                             bool dummy_weights) {
  if (!quantization.quantized()) return false;
  if (options.packed_weights.has_value()) return *options.packed_weights;
  if (dummy_weights) return true;
  return options.device.is_cuda();
}

std::unique_ptr<Model> create_model(std::shared_ptr<const Checkpoint> checkpoint,
                                    const ModelBuildOptions& options) {
  LONGCTX_CHECK(checkpoint != nullptr, ErrorCode::kInvalidArgument,
                "create_model: null checkpoint");
  const std::string& arch = checkpoint->config.architecture;
  std::string supported;
  for (const auto& [name, factory] : kArchitectures) {
    if (arch == name) return factory(std::move(checkpoint), options);
    supported += (supported.empty() ? "" : ", ") + std::string(name);
  }
  LONGCTX_THROW(ErrorCode::kUnsupported, "create_model: architecture '{}' is not supported ({})",
                arch, supported);
}

}  // namespace longctx
