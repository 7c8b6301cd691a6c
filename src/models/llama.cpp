// LlamaForCausalLM, following transformers/models/llama/modeling_llama.py. MistralForCausalLM is
// the same graph (the loader refuses Mistral's sliding window), so it runs here too. The model,
// decoder layer and attention are DecoderModel's (decoder_common.cpp), which read like
// LlamaModel.forward, LlamaDecoderLayer.forward and LlamaAttention.forward.
#include "models/architectures.h"
#include "models/decoder_common.h"

namespace longctx::models {

std::unique_ptr<Model> make_llama(std::shared_ptr<const Checkpoint> checkpoint,
                                  const ModelBuildOptions& options) {
  return std::make_unique<DecoderModel>(std::move(checkpoint), options);
}

}  // namespace longctx::models
