// The text model's config.json of the architectures that wrap it or leave fields to their
// config class: a multimodal wrapper's `text_config` with the top level's whole-model fields,
// over the text config class's defaults (Gemma 3, Qwen3.5), and the predicates that name the
// families whose configs need it. parse_model_config reads the result as a flat config.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace longctx {

bool is_gemma3(const std::string& arch);
// Qwen3.5's text models, dense and MoE, alone or in their multimodal wrappers.
bool is_qwen3_5(const std::string& arch);
bool is_qwen3_5_moe(const std::string& arch);
// The architectures built of Gated DeltaNet layers and gated full-attention layers: Qwen3-Next
// and Qwen3.5 (whose text models are Qwen3-Next's with the projections stored apart and, in the
// dense models, a dense MLP in place of the MoE block).
bool has_gated_deltanet(const std::string& arch);

// Gemma 3's text model config (nested in Gemma3ForConditionalGeneration's) over
// Gemma3TextConfig's defaults.
nlohmann::json gemma3_text_config(const nlohmann::json& j, const std::string& arch,
                                  const std::string& src);
// Qwen3.5's text model config (nested in the multimodal wrappers' `text_config`) over the text
// config class's defaults.
nlohmann::json qwen3_5_text_config(const nlohmann::json& j, const std::string& arch,
                                   const std::string& src);

}  // namespace longctx
