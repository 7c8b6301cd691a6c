// The subset of a Hugging Face config.json that the decoder-only architectures longctx runs
// need, normalized: rope settings from either `rope_scaling` (older transformers) or
// `rope_parameters` (transformers 5), dtype from `dtype` or `torch_dtype`.
#pragma once

#include <cstdint>
#include <limits>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "longctx/core/dtype.h"
#include "longctx/loader/quantization.h"

namespace longctx {

// The rope initializers of transformers' modeling_rope_utils (ROPE_INIT_FUNCTIONS) longctx runs.
enum class RopeType { kDefault, kLinear, kLlama3, kYarn, kLongrope, kDynamic };

// "default", "linear", "llama3", "yarn", "longrope", "dynamic": transformers' rope_type.
const char* rope_type_name(RopeType type);

// A config's rope parameters as transformers reads them (rope_parameters / rope_scaling plus the
// top-level fields it consults); ops::rope_frequencies() turns them into frequencies.
struct RopeConfig {
  RopeType type = RopeType::kDefault;
  double theta = 10000.0;
  // linear, llama3, yarn (the explicit `factor`), dynamic; longrope: max_position_embeddings /
  // original_max_position_embeddings, as transformers derives it for the attention factor.
  double factor = 1.0;
  // llama3 only
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  // llama3, yarn (its correction range), longrope (the short/long switch point)
  int64_t original_max_position_embeddings = 8192;
  // Each head rotates its first int(head_dim * partial_rotary_factor) dims (Phi-3/Phi-4-mini,
  // GLM, Qwen3-Next); the rest pass through. From the top-level config or the rope parameters.
  double partial_rotary_factor = 1.0;
  // yarn: the correction range's rotation counts, the mscale pair (0: absent, as transformers
  // tests them for truth), whether the range is rounded outwards to whole dims.
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double mscale = 0.0;
  double mscale_all_dim = 0.0;
  bool truncate = true;
  // yarn and longrope: the config's attention_factor (multiplies cos and sin); NaN when absent
  // (then derived from factor).
  double attention_factor = std::numeric_limits<double>::quiet_NaN();
  // longrope: per-frequency divisors [rotary_dim / 2] for sequences up to / past
  // original_max_position_embeddings.
  std::vector<double> short_factor, long_factor;
  // dynamic: the config's max_position_embeddings, past which the base is recomputed.
  int64_t max_position_embeddings = 0;
};

// How a layer attends (config.json `layer_types`, or what the architecture's config implies).
// Parsed from strings here only; everything downstream switches on the enum.
enum class LayerAttention {
  kFull,     // "full_attention": every earlier key
  kSliding,  // "sliding_attention": the last sliding_window keys (itself included)
  kLinear,   // "linear_attention": a fixed-size recurrent state (Qwen3-Next's Gated DeltaNet)
};

// How a checkpoint stores a Gated DeltaNet layer's input projections (set by the architecture).
enum class LinearProjLayout {
  kGroupedByKeyHead,  // Qwen3-Next: in_proj_qkvz, in_proj_ba, rows grouped per key head
  kSplit,             // Qwen3.5: in_proj_qkv (q, k, v head-major), in_proj_z, in_proj_b, in_proj_a
};

// The sizes of a linear-attention layer's per-sequence state (Qwen3-Next's config names).
struct LinearAttentionConfig {
  int64_t num_key_heads = 0;    // linear_num_key_heads
  int64_t num_value_heads = 0;  // linear_num_value_heads
  int64_t key_head_dim = 0;     // linear_key_head_dim
  int64_t value_head_dim = 0;   // linear_value_head_dim
  int64_t conv_kernel_dim = 0;  // linear_conv_kernel_dim
  LinearProjLayout projections = LinearProjLayout::kGroupedByKeyHead;
};

// A mixture-of-experts feed-forward (Qwen2-MoE / Qwen3-MoE config names). num_experts 0: dense.
struct MoeConfig {
  int64_t num_experts = 0;                      // num_experts
  int64_t num_experts_per_tok = 0;              // top-k
  int64_t moe_intermediate_size = 0;            // each routed expert's MLP width
  bool norm_topk_prob = false;                  // renormalize the top-k probabilities to sum 1
  int64_t shared_expert_intermediate_size = 0;  // 0: no shared expert (Qwen3-MoE)
  int64_t decoder_sparse_step = 1;              // layer i is sparse iff (i + 1) % step == 0 ...
  std::vector<int64_t> mlp_only_layers;         // ... and i is not listed here (dense layers)
};

// The gated MLP's activation (config.json `hidden_act` / Gemma's `hidden_activation`).
enum class HiddenAct {
  kSilu,      // "silu": Llama, Mistral, Qwen, Phi-3
  kGeluTanh,  // "gelu_pytorch_tanh": Gemma 3 (GeGLU)
};

struct ModelConfig {
  std::string architecture;  // "LlamaForCausalLM", ...
  std::string model_type;    // "llama", "qwen2", "qwen3", "mistral"
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;  // explicit in config or hidden_size / num_attention_heads
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  RopeConfig rope;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // bias on q/k/v (and o for Llama's attention_bias)
  bool o_proj_bias = false;     // Llama: attention_bias puts a bias on o_proj too; Qwen2 does not
  bool mlp_bias = false;
  bool qk_norm = false;  // Qwen3, Gemma 3: RMSNorm over each head of q and k before RoPE
  // Qwen3-Next: q_proj emits each head's q and an output gate ([q_h, gate_h] per head); the
  // attention output is multiplied by sigmoid(gate) before o_proj.
  bool attn_output_gate = false;
  HiddenAct hidden_act = HiddenAct::kSilu;
  // Gemma 3's layout, as transformers' Gemma3DecoderLayer / Gemma3RMSNorm define it: RMSNorms
  // scale by (1 + weight) (weights stored zero-centred); norms after attention and after the
  // MLP as well as before each; embeddings scaled by sqrt(hidden_size); the softmax scale
  // 1 / sqrt(query_pre_attn_scalar); sliding layers rotate with their own base (local_rope).
  bool norm_plus_one = false;
  bool sandwich_norms = false;
  double embed_scale = 1.0;
  double query_pre_attn_scalar = 0;  // 0: the softmax scale is 1 / sqrt(head_dim)
  bool has_local_rope = false;       // sliding layers use local_rope, full layers `rope`
  RopeConfig local_rope;
  DType dtype = DType::kBF16;  // the checkpoint's declared dtype
  QuantConfig quantization;    // quantization_config (method kNone when absent)
  int64_t bos_token_id = -1;
  std::vector<int64_t> eos_token_ids;  // from config.json, replaced by generation_config.json's
  // [num_hidden_layers] each layer's attention (empty means all full: configs built in code).
  std::vector<LayerAttention> layer_types;
  // Keys a sliding layer's query sees, itself included (transformers: key j is visible to query i
  // iff i - sliding_window < j <= i). 0 when no layer slides.
  int64_t sliding_window = 0;
  LinearAttentionConfig linear;  // with kLinear layers only
  MoeConfig moe;                 // num_experts 0: every layer dense
  // quantization_config asks for an FP8 KV cache (ModelOpt's kv_cache_quant_algo "FP8",
  // compressed-tensors' kv_cache_scheme of 8-bit floats): what --kv-cache-dtype auto follows.
  bool kv_cache_fp8 = false;
  // Name prefixes of checkpoint tensors the text model never reads (a multimodal wrapper's
  // vision tower, a multi-token-prediction head): accepted by the loader and left unloaded.
  std::vector<std::string> unused_weight_prefixes;

  // Whether layer i's MLP is the mixture of experts (Qwen2MoeDecoderLayer's rule), else the
  // dense MLP of intermediate_size.
  bool is_moe_layer(int64_t i) const;

  // Layer i's attention (kFull when layer_types is empty).
  LayerAttention layer_type(int64_t i) const {
    return layer_types.empty() ? LayerAttention::kFull : layer_types[i];
  }

  int64_t q_size() const { return num_attention_heads * head_dim; }
  int64_t kv_size() const { return num_key_value_heads * head_dim; }
  // Bytes of K and V for one token across all layers in `kv_dtype`.
  int64_t kv_bytes_per_token(DType kv_dtype) const;
  // The positions a sequence may reach: max_position_embeddings, extended as vLLM derives the
  // context of rope scaling made to extend it (yarn: factor x original_max_position_embeddings,
  // Qwen's recipe leaving max_position_embeddings at the native length; dynamic: factor x
  // max_position_embeddings).
  int64_t max_positions() const;
};

// Parses and validates a config.json object; `source` names it in errors (a path). Throws
// Error naming the field on missing/invalid fields, an unsupported architecture (listing the
// supported ones) or an unsupported rope type.
ModelConfig parse_model_config(const nlohmann::json& j, const std::string& source);
ModelConfig load_model_config(const std::string& config_json_path);

// An int or a list of ints (eos_token_id in config.json / generation_config.json).
std::vector<int64_t> parse_token_id_list(const nlohmann::json& v, const std::string& where);

// Architectures with a registered model (for error messages and `longctx info`).
std::vector<std::string> supported_architectures();

}  // namespace longctx
