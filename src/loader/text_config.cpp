// The text model's config of the wrapped or default-heavy families (text_config.h).
#include "loader/text_config.h"

#include "longctx/core/error.h"

namespace longctx {

using nlohmann::json;

namespace {

// Qwen3.5's multimodal wrappers (Qwen3_5[Moe]ForConditionalGeneration): the text model's config
// under `text_config`, its weights under model.language_model.*; only the text model runs.
bool is_qwen3_5_multimodal(const std::string& a) {
  return a == "Qwen3_5ForConditionalGeneration" || a == "Qwen3_5MoeForConditionalGeneration";
}

// Gemma3TextConfig's defaults (transformers' configuration_gemma3.py): Google's checkpoints leave
// most of them out of config.json (gemma-3-12b-it's text_config names 8 fields), and some differ
// from what the generic parse would derive (head_dim 256, not hidden / heads).
json gemma3_text_defaults() {
  return json{{"vocab_size", 262208},
              {"hidden_size", 2304},
              {"intermediate_size", 9216},
              {"num_hidden_layers", 26},
              {"num_attention_heads", 8},
              {"num_key_value_heads", 4},
              {"head_dim", 256},
              {"hidden_activation", "gelu_pytorch_tanh"},
              {"max_position_embeddings", 131072},
              {"rms_norm_eps", 1e-6},
              {"bos_token_id", 2},
              {"eos_token_id", 1},
              {"tie_word_embeddings", true},
              {"rope_theta", 1000000.0},
              {"rope_local_base_freq", 10000.0},
              {"query_pre_attn_scalar", 256},
              {"sliding_window", 4096},
              {"sliding_window_pattern", 6}};
}

// A multimodal wrapper's text model config, nested under `text_config` (the vision tower is not
// run); fields the top level sets for the whole model (dtype, token ids, tie_word_embeddings,
// quantization_config) fill what the text config leaves out.
json nested_text_config(const json& j, const std::string& arch, const std::string& src) {
  LONGCTX_CHECK(j.contains("text_config") && j["text_config"].is_object(),
                ErrorCode::kInvalidArgument, "{}: {} needs 'text_config' (an object)", src, arch);
  json t = j["text_config"];
  for (const char* key : {"dtype", "torch_dtype", "bos_token_id", "eos_token_id",
                          "tie_word_embeddings", "quantization_config"})
    if (!t.contains(key) && j.contains(key)) t[key] = j[key];
  return t;
}

// `t` over the text config class's `defaults` (a null in `t` keeps the default).
json with_defaults(const json& t, json defaults) {
  for (auto it = t.begin(); it != t.end(); ++it)
    if (!it->is_null() || !defaults.contains(it.key())) defaults[it.key()] = *it;
  return defaults;
}

// Qwen3_5TextConfig's / Qwen3_5MoeTextConfig's defaults (transformers' configuration_qwen3_5*.py)
// where they differ from what the generic parse assumes: head_dim 256 (not hidden / heads), a
// quarter of each head rotated (partial_rotary_factor 0.25, which transformers assigns when the
// file names none).
json qwen3_5_text_defaults(bool moe) {
  return json{{"vocab_size", 248320},
              {"hidden_size", moe ? 2048 : 4096},
              {"intermediate_size", moe ? json() : json(12288)},
              {"num_hidden_layers", moe ? 40 : 32},
              {"num_attention_heads", 16},
              {"num_key_value_heads", moe ? 2 : 4},
              {"head_dim", 256},
              {"max_position_embeddings", 32768},
              {"rms_norm_eps", 1e-6},
              {"partial_rotary_factor", 0.25}};
}

}  // namespace

bool is_gemma3(const std::string& arch) {
  return arch == "Gemma3ForCausalLM" || arch == "Gemma3ForConditionalGeneration";
}

// Qwen3.5's text models, dense and MoE, alone or in their multimodal wrappers.
bool is_qwen3_5(const std::string& a) {
  return a == "Qwen3_5ForCausalLM" || a == "Qwen3_5MoeForCausalLM" || is_qwen3_5_multimodal(a);
}

bool is_qwen3_5_moe(const std::string& a) {
  return a == "Qwen3_5MoeForCausalLM" || a == "Qwen3_5MoeForConditionalGeneration";
}

// The architectures built of Gated DeltaNet layers and gated full-attention layers: Qwen3-Next
// and Qwen3.5 (whose text models are Qwen3-Next's with the projections stored apart and, in the
// dense models, a dense MLP in place of the MoE block).
bool has_gated_deltanet(const std::string& a) {
  return a == "Qwen3NextForCausalLM" || is_qwen3_5(a);
}

// Gemma 3's text model config (nested in Gemma3ForConditionalGeneration's) over
// Gemma3TextConfig's defaults.
json gemma3_text_config(const json& j, const std::string& arch, const std::string& src) {
  const json t = arch == "Gemma3ForConditionalGeneration" ? nested_text_config(j, arch, src) : j;
  json out = with_defaults(t, gemma3_text_defaults());
  // transformers 5 writes layer_types; the pattern only stands in where they are absent.
  if (t.contains("layer_types") && !t["layer_types"].is_null()) out.erase("sliding_window_pattern");
  out["architectures"] = json::array({arch});
  return out;
}

// Qwen3.5's text model config (nested in the multimodal wrappers' `text_config`) over the text
// config class's defaults. Its rope_parameters carry mrope_section / mrope_interleaved (Qwen3-VL's
// multimodal RoPE: each frequency index takes its position from the temporal, height or width
// axis); text positions are equal on all three axes, so every index rotates by the one position
// and the rope is the plain partial RoPE those keys are ignored for. Qwen3_5MoeTextConfig has no
// intermediate_size (every layer is the MoE block): the experts' width stands in for it.
json qwen3_5_text_config(const json& j, const std::string& arch, const std::string& src) {
  const json t = is_qwen3_5_multimodal(arch) ? nested_text_config(j, arch, src) : j;
  const bool moe = is_qwen3_5_moe(arch);
  json out = with_defaults(t, qwen3_5_text_defaults(moe));
  if (moe && out["intermediate_size"].is_null())
    out["intermediate_size"] = out.value("moe_intermediate_size", json(512));
  out["architectures"] = json::array({arch});
  return out;
}

}  // namespace longctx
