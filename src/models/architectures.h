// Constructors of the registered architectures (one file each); registry.cpp maps
// config.architecture to them.
#pragma once

#include <memory>

#include "longctx/models/model.h"

namespace longctx::models {

std::unique_ptr<Model> make_llama(std::shared_ptr<const Checkpoint> checkpoint,
                                  const ModelBuildOptions& options);  // + Mistral, Phi-3
std::unique_ptr<Model> make_qwen2(std::shared_ptr<const Checkpoint> checkpoint,
                                  const ModelBuildOptions& options);
std::unique_ptr<Model> make_qwen3(std::shared_ptr<const Checkpoint> checkpoint,
                                  const ModelBuildOptions& options);
std::unique_ptr<Model> make_qwen3_next(std::shared_ptr<const Checkpoint> checkpoint,
                                       const ModelBuildOptions& options);
std::unique_ptr<Model> make_gemma3(std::shared_ptr<const Checkpoint> checkpoint,
                                   const ModelBuildOptions& options);

}  // namespace longctx::models
