// --load-format dummy: random weights of real models' shapes, so engines and benchmarks run
// without a checkpoint (as vLLM's dummy load format does).
#include <map>
#include <nlohmann/json.hpp>

#include "loader/quantize_checkpoint.h"
#include "loader/quantized_weights.h"
#include "loader/weight_spec.h"
#include "longctx/core/parallel.h"
#include "longctx/loader/checkpoint.h"

namespace longctx {

namespace {

ModelConfig llama31_8b() {
  ModelConfig c;
  c.architecture = "LlamaForCausalLM";
  c.model_type = "llama";
  c.vocab_size = 128256;
  c.hidden_size = 4096;
  c.intermediate_size = 14336;
  c.num_hidden_layers = 32;
  c.num_attention_heads = 32;
  c.num_key_value_heads = 8;
  c.head_dim = 128;
  c.max_position_embeddings = 131072;
  c.rms_norm_eps = 1e-5;
  c.rope = {RopeType::kLlama3, 500000.0, 8.0, 1.0, 4.0, 8192};
  c.bos_token_id = 128000;
  c.eos_token_ids = {128001, 128008, 128009};
  return c;
}

ModelConfig qwen3(int64_t hidden, int64_t inter, int64_t layers, int64_t heads, bool tied) {
  ModelConfig c;
  c.architecture = "Qwen3ForCausalLM";
  c.model_type = "qwen3";
  c.vocab_size = 151936;
  c.hidden_size = hidden;
  c.intermediate_size = inter;
  c.num_hidden_layers = layers;
  c.num_attention_heads = heads;
  c.num_key_value_heads = 8;
  c.head_dim = 128;
  c.max_position_embeddings = 40960;
  c.rms_norm_eps = 1e-6;
  c.rope.theta = 1000000.0;
  c.tie_word_embeddings = tied;
  c.qk_norm = true;
  c.bos_token_id = 151643;
  c.eos_token_ids = {151645, 151643};
  return c;
}

// Qwen3-8B with Qwen's recipe for 128K: "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
// "original_max_position_embeddings": 32768}, max_position_embeddings 131072 (4 x 32768, so
// every reading of the factor agrees).
ModelConfig qwen3_8b_yarn_128k() {
  ModelConfig c = qwen3(4096, 12288, 36, 32, false);
  c.max_position_embeddings = 131072;
  c.rope.type = RopeType::kYarn;
  c.rope.factor = 4.0;
  c.rope.original_max_position_embeddings = 32768;
  return c;
}

// Qwen3-30B-A3B / Qwen3-235B-A22B (and the Coder-30B-A3B, same shapes): 128 experts, top 8 with
// norm_topk_prob, every layer sparse.
ModelConfig qwen3_moe(int64_t hidden, int64_t moe_inter, int64_t layers, int64_t heads) {
  ModelConfig c = qwen3(hidden, hidden * 3, layers, heads, false);
  c.architecture = "Qwen3MoeForCausalLM";
  c.model_type = "qwen3_moe";
  c.num_key_value_heads = 4;
  c.moe.num_experts = 128;
  c.moe.num_experts_per_tok = 8;
  c.moe.moe_intermediate_size = moe_inter;
  c.moe.norm_topk_prob = true;
  return c;
}

ModelConfig qwen2_7b() {
  ModelConfig c;
  c.architecture = "Qwen2ForCausalLM";
  c.model_type = "qwen2";
  c.vocab_size = 152064;
  c.hidden_size = 3584;
  c.intermediate_size = 18944;
  c.num_hidden_layers = 28;
  c.num_attention_heads = 28;
  c.num_key_value_heads = 4;
  c.head_dim = 128;
  c.max_position_embeddings = 32768;
  c.rms_norm_eps = 1e-6;
  c.rope.theta = 1000000.0;
  c.attention_bias = true;
  c.bos_token_id = 151643;
  c.eos_token_ids = {151645, 151643};
  return c;
}

// Llama-3-8B shapes with a 1M-position context, as the 1M-context Llama-3 fine-tunes have it
// (plain RoPE with a large theta): the longest-context offload runs.
ModelConfig llama3_8b_1m() {
  ModelConfig c = llama31_8b();
  c.max_position_embeddings = 1048576;
  c.rope = {};
  c.rope.theta = 3.58e9;
  return c;
}

// A few-MB Llama for tests and smoke runs.
// Google's gemma-3-12b-it config.json as published (the text model's 8 fields; the rest are
// Gemma3TextConfig's defaults), parsed as a downloaded checkpoint's would be: 48 layers, five
// sliding (window 1024) to one global, head_dim 256, vocabulary 262,208.
ModelConfig gemma3_12b() {
  const nlohmann::json j = {{"architectures", {"Gemma3ForConditionalGeneration"}},
                            {"model_type", "gemma3"},
                            {"torch_dtype", "bfloat16"},
                            {"eos_token_id", {1, 106}},
                            {"text_config",
                             {{"hidden_size", 3840},
                              {"intermediate_size", 15360},
                              {"model_type", "gemma3_text"},
                              {"num_attention_heads", 16},
                              {"num_hidden_layers", 48},
                              {"num_key_value_heads", 8},
                              {"rope_scaling", {{"factor", 8.0}, {"rope_type", "linear"}}},
                              {"sliding_window", 1024}}}};
  return parse_model_config(j, "preset gemma-3-12b");
}

// Mistral-7B-v0.1: Llama's shapes with a 4096-token sliding window on every layer.
ModelConfig mistral_7b_v01() {
  ModelConfig c = llama31_8b();
  c.architecture = "MistralForCausalLM";
  c.model_type = "mistral";
  c.vocab_size = 32000;
  c.max_position_embeddings = 32768;
  c.rope = RopeConfig{};
  c.rope.theta = 10000.0;
  c.layer_types.assign(c.num_hidden_layers, LayerAttention::kSliding);
  c.sliding_window = 4096;
  c.bos_token_id = 1;
  c.eos_token_ids = {2};
  return c;
}

// Qwen3-Next-80B-A3B (-Instruct / -Thinking) as its config.json publishes it: 48 layers, three
// Gated DeltaNet (16 key heads, 32 value heads of 128) to one gated attention layer (16 heads,
// 2 KV heads of 256, a quarter of each rotated), 512 experts top 10 plus a shared expert.
ModelConfig qwen3_next_80b_a3b() {
  const nlohmann::json j = {{"architectures", {"Qwen3NextForCausalLM"}},
                            {"model_type", "qwen3_next"},
                            {"torch_dtype", "bfloat16"},
                            {"vocab_size", 151936},
                            {"hidden_size", 2048},
                            {"intermediate_size", 5120},
                            {"num_hidden_layers", 48},
                            {"num_attention_heads", 16},
                            {"num_key_value_heads", 2},
                            {"head_dim", 256},
                            {"max_position_embeddings", 262144},
                            {"rms_norm_eps", 1e-6},
                            {"rope_theta", 10000000.0},
                            {"partial_rotary_factor", 0.25},
                            {"full_attention_interval", 4},
                            {"linear_conv_kernel_dim", 4},
                            {"linear_key_head_dim", 128},
                            {"linear_num_key_heads", 16},
                            {"linear_num_value_heads", 32},
                            {"linear_value_head_dim", 128},
                            {"num_experts", 512},
                            {"num_experts_per_tok", 10},
                            {"moe_intermediate_size", 512},
                            {"shared_expert_intermediate_size", 512},
                            {"norm_topk_prob", true},
                            {"decoder_sparse_step", 1},
                            {"mlp_only_layers", nlohmann::json::array()},
                            {"tie_word_embeddings", false},
                            {"bos_token_id", 151643},
                            {"eos_token_id", 151645}};
  return parse_model_config(j, "preset qwen3-next-80b-a3b");
}

// Qwen3.5's text config as the Hub checkpoints nest it in their multimodal wrapper (the vision
// tower's config left out: it is not run). Values from the published config.json files of
// Qwen/Qwen3.5-27B and Qwen/Qwen3.5-35B-A3B (text_config; the model cards' tables agree): a
// quarter of each 256-dim attention head rotated with theta 1e7 (the multimodal sections
// [11, 11, 10] interleaved), 262144 positions, 3 Gated DeltaNet layers (16 key heads of 128)
// to one gated attention layer.
nlohmann::json qwen3_5_preset_text(int64_t hidden, int64_t layers, int64_t heads, int64_t kv_heads,
                                   int64_t linear_value_heads) {
  return {{"dtype", "bfloat16"},
          {"vocab_size", 248320},
          {"hidden_size", hidden},
          {"num_hidden_layers", layers},
          {"num_attention_heads", heads},
          {"num_key_value_heads", kv_heads},
          {"head_dim", 256},
          {"max_position_embeddings", 262144},
          {"rms_norm_eps", 1e-6},
          {"rope_parameters",
           {{"rope_type", "default"},
            {"rope_theta", 10000000.0},
            {"partial_rotary_factor", 0.25},
            {"mrope_interleaved", true},
            {"mrope_section", {11, 11, 10}}}},
          {"full_attention_interval", 4},
          {"linear_conv_kernel_dim", 4},
          {"linear_key_head_dim", 128},
          {"linear_num_key_heads", 16},
          {"linear_num_value_heads", linear_value_heads},
          {"linear_value_head_dim", 128},
          {"attn_output_gate", true},
          {"tie_word_embeddings", false},
          {"bos_token_id", 248044},
          {"eos_token_id", 248044}};
}

// Qwen3.5-27B: 64 layers of hidden 5120, 24 attention heads (4 KV), 48 value heads in the
// Gated DeltaNet layers, dense MLPs of 17408.
ModelConfig qwen3_5_27b() {
  nlohmann::json text = qwen3_5_preset_text(5120, 64, 24, 4, 48);
  text["model_type"] = "qwen3_5_text";
  text["intermediate_size"] = 17408;
  const nlohmann::json j = {{"architectures", {"Qwen3_5ForConditionalGeneration"}},
                            {"model_type", "qwen3_5"},
                            {"tie_word_embeddings", false},
                            {"text_config", text}};
  return parse_model_config(j, "preset qwen3.5-27b");
}

// Qwen3.5-35B-A3B: 40 layers of hidden 2048, 16 attention heads (2 KV), 32 value heads; 256
// experts of 512, top 8, and a shared expert of 512 on every layer.
ModelConfig qwen3_5_35b_a3b() {
  nlohmann::json text = qwen3_5_preset_text(2048, 40, 16, 2, 32);
  text["model_type"] = "qwen3_5_moe_text";
  text["num_experts"] = 256;
  text["num_experts_per_tok"] = 8;
  text["moe_intermediate_size"] = 512;
  text["shared_expert_intermediate_size"] = 512;
  const nlohmann::json j = {{"architectures", {"Qwen3_5MoeForConditionalGeneration"}},
                            {"model_type", "qwen3_5_moe"},
                            {"tie_word_embeddings", false},
                            {"text_config", text}};
  return parse_model_config(j, "preset qwen3.5-35b-a3b");
}

ModelConfig tiny_llama() {
  ModelConfig c = llama31_8b();
  c.vocab_size = 512;
  c.hidden_size = 64;
  c.intermediate_size = 128;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 16;
  c.rope.original_max_position_embeddings = 256;
  c.bos_token_id = 1;
  c.eos_token_ids = {2};
  return c;
}

const std::map<std::string, ModelConfig (*)()>& presets() {
  static const std::map<std::string, ModelConfig (*)()> p = {
      {"llama-3.1-8b", llama31_8b},
      {"llama-3-8b-1m", llama3_8b_1m},
      {"qwen3-0.6b", [] { return qwen3(1024, 3072, 28, 16, true); }},
      {"qwen3-8b", [] { return qwen3(4096, 12288, 36, 32, false); }},
      {"qwen3-8b-yarn-128k", qwen3_8b_yarn_128k},
      {"qwen2-7b", qwen2_7b},
      {"qwen3-30b-a3b", [] { return qwen3_moe(2048, 768, 48, 32); }},
      {"qwen3-235b-a22b", [] { return qwen3_moe(4096, 1536, 94, 64); }},
      {"gemma-3-12b", gemma3_12b},
      {"qwen3-next-80b-a3b", qwen3_next_80b_a3b},
      {"qwen3.5-27b", qwen3_5_27b},
      {"qwen3.5-35b-a3b", qwen3_5_35b_a3b},
      {"mistral-7b-v0.1", mistral_7b_v01},
      {"tiny-llama", tiny_llama},
  };
  return p;
}

// splitmix64: a fast, well-mixed counter-based generator, so parallel fills are deterministic.
inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

void fill_uniform(Tensor& t, uint64_t seed, float center, float half_width) {
  auto store = [&](int64_t i, float v) {
    switch (t.dtype()) {
      case DType::kF32:
        t.data<float>()[i] = v;
        break;
      case DType::kBF16:
        t.data<uint16_t>()[i] = f32_to_bf16(v);
        break;
      case DType::kF16:
        t.data<uint16_t>()[i] = f32_to_f16(v);
        break;
      default:
        LONGCTX_ASSERT(false, "dummy weights must be floating");
    }
  };
  parallel_for(
      t.numel(),
      [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
          double u =
              double(splitmix64(seed ^ (uint64_t(i) * 0x632be59bd9b4e019ull)) >> 11) * 0x1p-53;
          store(i, center + half_width * float(2.0 * u - 1.0));
        }
      },
      1 << 16);
}

}  // namespace

QuantizedWeight random_quantized(int64_t out, int64_t in, const QuantConfig& q, uint64_t seed,
                                 float std, const std::string& name) {
  QuantizedWeight w = quantized_layout(out, in, q, name);
  const bool fp8 = q.method == QuantMethod::kFp8Block || q.method == QuantMethod::kCompressedFp8;
  // Counter-based, in parallel: the FP8 experts of a 30B model are 30 GB of codes. E4M3 has NaN
  // at S.1111.111: moved to the largest finite code.
  auto fill_bytes = [&](const Tensor& t) {
    auto* p = static_cast<uint8_t*>(t.data_ptr());
    const auto bytes = static_cast<int64_t>(t.nbytes());
    parallel_for((bytes + 7) / 8,
                 [&](int64_t b, int64_t e) {
                   for (int64_t i = b; i < e; ++i) {
                     uint8_t v[8];
                     const uint64_t z = splitmix64(seed ^ (uint64_t(i) * 0x632be59bd9b4e019ull));
                     std::memcpy(v, &z, 8);
                     const int64_t n = std::min<int64_t>(8, bytes - i * 8);
                     for (int64_t j = 0; j < n; ++j)
                       p[i * 8 + j] = fp8 && (v[j] & 0x7f) == 0x7f ? uint8_t(v[j] ^ 1) : v[j];
                   }
                 },
                 1 << 14);
  };
  auto fill_scales = [&](Tensor t, float v) {  // a handle: writes w's tensor
    Tensor f = Tensor::empty(t.shape(), DType::kF32);
    std::fill_n(f.data<float>(), f.numel(), v);
    t.copy_from(t.dtype() == DType::kF32 ? f : f.to_dtype(t.dtype()));
  };
  fill_bytes(w.qweight);
  if (fp8) {
    // Uniform codes have an rms of about 44.
    fill_scales(w.scales, std / 44.f);
    return w;
  }
  // int4: zero points 8 (v1 GPTQ stores z - 1); uniform codes minus 8 have an rms of 4.6.
  const uint32_t zeros =
      q.method == QuantMethod::kGptq && q.gptq_zero_minus_one ? 0x77777777u : 0x88888888u;
  std::fill_n(static_cast<uint32_t*>(w.qzeros.data_ptr()), w.qzeros.numel(), zeros);
  fill_scales(w.scales, std / 4.6f);
  if (w.g_idx.defined()) {
    auto* g = static_cast<int32_t*>(w.g_idx.data_ptr());
    for (int64_t i = 0; i < in; ++i) g[i] = int32_t(i / q.group_of(in));
  }
  return w;
}

std::vector<std::string> dummy_presets() {
  std::vector<std::string> n;
  for (const auto& [name, f] : presets()) n.push_back(name);
  return n;
}

ModelConfig dummy_preset_config(const std::string& preset) {
  auto it = presets().find(preset);
  if (it == presets().end()) {
    std::string list;
    for (const auto& n : dummy_presets()) list += (list.empty() ? "" : ", ") + n;
    LONGCTX_THROW(ErrorCode::kNotFound, "unknown dummy preset '{}' (known: {})", preset, list);
  }
  ModelConfig c = it->second();
  c.o_proj_bias = c.attention_bias && c.architecture != "Qwen2ForCausalLM" &&
                  c.architecture != "Qwen2MoeForCausalLM";
  return c;
}

ModelConfig first_layers(ModelConfig config, int64_t n) {
  LONGCTX_CHECK(n >= 1 && n <= config.num_hidden_layers, ErrorCode::kInvalidArgument,
                "the first {} layers: the model has {}", n, config.num_hidden_layers);
  config.num_hidden_layers = n;
  if (!config.layer_types.empty()) config.layer_types.resize(static_cast<size_t>(n));
  return config;
}

Checkpoint make_dummy_checkpoint(const ModelConfig& config, uint64_t seed) {
  Checkpoint ck;
  ck.config = config;
  uint64_t k = 0;
  const QuantConfig& q = config.quantization;
  for (const auto& [name, shape] : expected_weights(config, quantized_expert_layout(q))) {
    const uint64_t s = splitmix64(seed + ++k);
    if (q.quantized() && quantizes_tensor(name, shape, q)) {
      // Only the packed tensors, as a quantized checkpoint stores them (a dense copy of an 8B
      // model would take 16 GB of host memory the packed path never reads).
      ck.quantized.emplace(name, random_quantized(shape[0], shape[1], q, s, 0.02f, name));
      continue;
    }
    Tensor t = Tensor::empty(shape, config.dtype);
    if (shape.size() == 1 && name.ends_with("norm.weight")) {
      fill_uniform(t, s, 1.0f, 0.1f);  // norms near 1 keep activations sane
    } else if (shape.size() == 1) {
      fill_uniform(t, s, 0.0f, 0.02f);  // biases
    } else {
      // std 0.02 (as HF's initializer_range) from a uniform of the same variance
      fill_uniform(t, s, 0.0f, 0.02f * 1.7320508f);
    }
    ck.weights.add(name, std::move(t));
  }
  return ck;
}

}  // namespace longctx
