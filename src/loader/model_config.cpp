// config.json -> ModelConfig. Every field the models need is read here once and validated, so
// the model code can trust the config.
#include "longctx/loader/model_config.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "loader/text_config.h"
#include "longctx/core/error.h"
#include "longctx/core/json_limits.h"

namespace longctx {

using nlohmann::json;

namespace {

const char* const kSupported[] = {"LlamaForCausalLM",
                                  "MistralForCausalLM",
                                  "Qwen2ForCausalLM",
                                  "Qwen3ForCausalLM",
                                  "Qwen2MoeForCausalLM",
                                  "Qwen3MoeForCausalLM",
                                  "Phi3ForCausalLM",
                                  "Gemma3ForCausalLM",
                                  "Gemma3ForConditionalGeneration",
                                  "Qwen3NextForCausalLM",
                                  "Qwen3_5ForCausalLM",
                                  "Qwen3_5MoeForCausalLM",
                                  "Qwen3_5ForConditionalGeneration",
                                  "Qwen3_5MoeForConditionalGeneration"};

// The Qwen configs that slide only with use_sliding_window, from max_window_layers on.
bool qwen_window_rule(const std::string& a) {
  return a == "Qwen2ForCausalLM" || a == "Qwen3ForCausalLM" || a == "Qwen2MoeForCausalLM" ||
         a == "Qwen3MoeForCausalLM";
}

std::string supported_list() {
  std::string s;
  for (const char* a : kSupported) s += (s.empty() ? "" : ", ") + std::string(a);
  return s;
}

// Upper bounds on the sizes of a config, each far above any released model (the largest have
// ~256K vocabularies, 16K-25K hidden sizes, 126 layers, 128 heads, head_dim 256, 10M
// positions). They keep every size product below 2^63 and turn a typo or a hostile file
// (num_hidden_layers 1e9) into an error instead of an allocation that runs until killed.
constexpr int64_t kMaxVocab = int64_t{1} << 24;
constexpr int64_t kMaxHidden = int64_t{1} << 17;
constexpr int64_t kMaxIntermediate = int64_t{1} << 20;
constexpr int64_t kMaxLayers = 1024;
constexpr int64_t kMaxHeads = 1024;
constexpr int64_t kMaxHeadDim = 4096;
constexpr int64_t kMaxPositions = int64_t{1} << 30;
constexpr int64_t kMaxConvKernel = 64;  // linear attention's short conv (Qwen3-Next: 4)

// An integer field (unsigned values past INT64_MAX are errors, not wrapped).
int64_t int_field(const json& v, const char* key, const std::string& src) {
  LONGCTX_CHECK(v.is_number_integer() &&
                    (!v.is_number_unsigned() || v.get<uint64_t>() <= uint64_t{INT64_MAX}),
                ErrorCode::kInvalidArgument, "{}: field '{}' must be an integer, got {}", src, key,
                json_excerpt(v));
  return v.get<int64_t>();
}

void check_range(int64_t v, const char* key, int64_t max, const std::string& src) {
  LONGCTX_CHECK(v > 0 && v <= max, ErrorCode::kInvalidArgument,
                "{}: field '{}' must be in [1, {}], got {}", src, key, max, v);
}

// Reads a required integer field in [1, max].
int64_t req_int(const json& j, const char* key, const std::string& src, int64_t max) {
  LONGCTX_CHECK(j.contains(key) && !j[key].is_null(), ErrorCode::kInvalidArgument,
                "{}: missing required field '{}'", src, key);
  int64_t v = int_field(j[key], key, src);
  check_range(v, key, max, src);
  return v;
}

int64_t opt_int(const json& j, const char* key, int64_t dflt, const std::string& src) {
  if (!j.contains(key) || j[key].is_null()) return dflt;
  return int_field(j[key], key, src);
}

double opt_num(const json& j, const char* key, double dflt, const std::string& src) {
  if (!j.contains(key) || j[key].is_null()) return dflt;
  LONGCTX_CHECK(j[key].is_number(), ErrorCode::kInvalidArgument,
                "{}: field '{}' must be a number, got {}", src, key, json_excerpt(j[key]));
  return j[key].get<double>();
}

bool opt_bool(const json& j, const char* key, bool dflt, const std::string& src) {
  if (!j.contains(key) || j[key].is_null()) return dflt;
  LONGCTX_CHECK(j[key].is_boolean(), ErrorCode::kInvalidArgument,
                "{}: field '{}' must be true or false, got {}", src, key, json_excerpt(j[key]));
  return j[key].get<bool>();
}

constexpr const char* kSupportedRopeTypes = "default, linear, llama3, yarn, longrope, dynamic";

// A number in (0, inf) when present.
double opt_positive(const json& j, const char* key, double dflt, const std::string& src) {
  const double v = opt_num(j, key, dflt, src);
  LONGCTX_CHECK(v > 0 && std::isfinite(v), ErrorCode::kInvalidArgument,
                "{}: field '{}' must be a positive finite number, got {}", src, key,
                json_excerpt(j.value(key, json(v))));
  return v;
}

// A required number in (0, inf).
double req_positive(const json& j, const char* key, const std::string& src,
                    const std::string& type) {
  LONGCTX_CHECK(j.contains(key) && !j[key].is_null(), ErrorCode::kInvalidArgument,
                "{}: rope type '{}' needs field '{}'", src, type, key);
  return opt_positive(j, key, 0.0, src);
}

// longrope's short_factor / long_factor: `n` positive finite numbers.
std::vector<double> factor_list(const json& j, const char* key, int64_t n, const std::string& src) {
  LONGCTX_CHECK(j.contains(key) && !j[key].is_null(), ErrorCode::kInvalidArgument,
                "{}: rope type 'longrope' needs field '{}' (a list of {} numbers)", src, key, n);
  const json& v = j[key];
  LONGCTX_CHECK(v.is_array() && int64_t(v.size()) == n, ErrorCode::kInvalidArgument,
                "{}: field '{}' must be a list of {} numbers (rotary_dim / 2), got {}", src, key, n,
                json_excerpt(v));
  std::vector<double> out;
  for (const json& e : v) {
    LONGCTX_CHECK(e.is_number() && e.get<double>() > 0 && std::isfinite(e.get<double>()),
                  ErrorCode::kInvalidArgument,
                  "{}: field '{}' must hold positive finite numbers, got {}", src, key,
                  json_excerpt(e));
    out.push_back(e.get<double>());
  }
  return out;
}

// transformers 5 writes `rope_parameters` (with rope_theta inside); older files write
// `rope_scaling` (null for default) plus a top-level `rope_theta`. Fields transformers reads from
// the top level of the config (partial_rotary_factor, longrope's original_max_position_embeddings)
// are read there too, the rope parameters winning. head_dim and max_position_embeddings are the
// config's (parsed before).
RopeConfig parse_rope(const json& j, const std::string& src, int64_t head_dim, int64_t max_pos) {
  RopeConfig r;
  r.theta = opt_num(j, "rope_theta", 10000.0, src);
  const json* p = nullptr;
  const char* which = "rope_parameters";
  if (j.contains("rope_parameters") && !j["rope_parameters"].is_null()) {
    p = &j["rope_parameters"];
  } else if (j.contains("rope_scaling") && !j["rope_scaling"].is_null()) {
    p = &j["rope_scaling"];
    which = "rope_scaling";
  }
  static const json kEmpty = json::object();
  LONGCTX_CHECK(!p || p->is_object(), ErrorCode::kInvalidArgument, "{}: '{}' must be an object",
                src, which);
  const json& params = p ? *p : kEmpty;
  const std::string ctx = p ? src + " " + which : src;
  r.theta = opt_num(params, "rope_theta", r.theta, ctx);
  LONGCTX_CHECK(r.theta > 0 && std::isfinite(r.theta), ErrorCode::kInvalidArgument,
                "{}: rope_theta must be a positive finite number", ctx);

  // partial_rotary_factor: rotary_dim = int(head_dim * partial_rotary_factor), as every
  // transformers rope initializer computes `dim`; rotate_half needs it even.
  const bool partial_in_params = params.contains("partial_rotary_factor");
  r.partial_rotary_factor = opt_num(partial_in_params ? params : j, "partial_rotary_factor", 1.0,
                                    partial_in_params ? ctx : src);
  {
    const double f = r.partial_rotary_factor;
    const int64_t rotary_dim = static_cast<int64_t>(double(head_dim) * f);
    LONGCTX_CHECK(f > 0 && f <= 1 && rotary_dim >= 2 && rotary_dim % 2 == 0,
                  ErrorCode::kInvalidArgument,
                  "{}: field 'partial_rotary_factor' {} must be in (0, 1] and give an even "
                  "rotary_dim >= 2 (int(head_dim {} * factor) = {})",
                  partial_in_params ? ctx : src, f, head_dim, rotary_dim);
  }

  std::string type = "default";
  for (const char* key : {"rope_type", "type"}) {  // transformers reads rope_type, then type
    auto it = params.find(key);
    if (it == params.end() || it->is_null()) continue;
    LONGCTX_CHECK(it->is_string(), ErrorCode::kInvalidArgument, "{}: '{}' must be a string, got {}",
                  ctx, key, json_excerpt(*it));
    type = it->get<std::string>();
    break;
  }
  if (type == "default") {
    r.type = RopeType::kDefault;
  } else if (type == "linear") {
    r.type = RopeType::kLinear;
    r.factor = opt_num(params, "factor", 1.0, ctx);
  } else if (type == "llama3") {
    r.type = RopeType::kLlama3;
    r.factor = opt_num(params, "factor", 8.0, ctx);
    r.low_freq_factor = opt_num(params, "low_freq_factor", 1.0, ctx);
    r.high_freq_factor = opt_num(params, "high_freq_factor", 4.0, ctx);
    r.original_max_position_embeddings =
        opt_int(params, "original_max_position_embeddings", 8192, ctx);
    check_range(r.original_max_position_embeddings, "original_max_position_embeddings",
                kMaxPositions, ctx);
    LONGCTX_CHECK(r.high_freq_factor > r.low_freq_factor, ErrorCode::kInvalidArgument,
                  "{}: llama3 rope needs high_freq_factor > low_freq_factor", ctx);
  } else if (type == "yarn") {
    // _compute_yarn_parameters: factor is required; original_max_position_embeddings is
    // `rope_scaling.get("original_max_position_embeddings") or max_position_embeddings`;
    // beta_fast / beta_slow are `get(...) or 32 / 1`; truncate defaults to true. The explicit
    // factor is the one used, also where it differs from max_position_embeddings / original
    // (Qwen's recipe keeps max_position_embeddings 40960 with factor 4 over 32768): transformers
    // warns there and uses the explicit factor, as vLLM does. (Some 4.5x releases took the
    // ratio instead; tests/data/make_rope_fixtures.py records transformers' own value for that
    // config in rope_reference.json, not yet made on a machine with transformers.)
    r.type = RopeType::kYarn;
    r.factor = req_positive(params, "factor", ctx, type);
    r.original_max_position_embeddings =
        opt_int(params, "original_max_position_embeddings", max_pos, ctx);
    check_range(r.original_max_position_embeddings, "original_max_position_embeddings",
                kMaxPositions, ctx);
    r.beta_fast = opt_num(params, "beta_fast", 0.0, ctx);
    r.beta_slow = opt_num(params, "beta_slow", 0.0, ctx);
    if (r.beta_fast == 0) r.beta_fast = 32;
    if (r.beta_slow == 0) r.beta_slow = 1;
    LONGCTX_CHECK(r.beta_fast > 0 && r.beta_slow > 0 && std::isfinite(r.beta_fast) &&
                      std::isfinite(r.beta_slow),
                  ErrorCode::kInvalidArgument,
                  "{}: fields 'beta_fast' {} and 'beta_slow' {} must be positive finite numbers",
                  ctx, r.beta_fast, r.beta_slow);
    r.mscale = opt_num(params, "mscale", 0.0, ctx);
    r.mscale_all_dim = opt_num(params, "mscale_all_dim", 0.0, ctx);
    LONGCTX_CHECK(std::isfinite(r.mscale) && std::isfinite(r.mscale_all_dim),
                  ErrorCode::kInvalidArgument,
                  "{}: fields 'mscale' and 'mscale_all_dim' must be "
                  "finite numbers",
                  ctx);
    r.truncate = opt_bool(params, "truncate", true, ctx);
    if (params.contains("attention_factor") && !params["attention_factor"].is_null())
      r.attention_factor = opt_positive(params, "attention_factor", 1.0, ctx);
  } else if (type == "longrope" || type == "su") {  // "su": Phi-3's first name for it
    // _compute_longrope_parameters: original_max_position_embeddings from the rope parameters or
    // the top-level config (Phi-3 keeps it there); with it, factor = max_position_embeddings /
    // original (the context the lists were fitted for); without, the length is
    // max_position_embeddings and factor the parameters' own.
    r.type = RopeType::kLongrope;
    const bool in_params = params.contains("original_max_position_embeddings") &&
                           !params["original_max_position_embeddings"].is_null();
    const bool top = j.contains("original_max_position_embeddings") &&
                     !j["original_max_position_embeddings"].is_null();
    if (in_params || top) {
      r.original_max_position_embeddings =
          in_params ? opt_int(params, "original_max_position_embeddings", 0, ctx)
                    : opt_int(j, "original_max_position_embeddings", 0, src);
      check_range(r.original_max_position_embeddings, "original_max_position_embeddings",
                  kMaxPositions, in_params ? ctx : src);
      r.factor = double(max_pos) / double(r.original_max_position_embeddings);
    } else {
      r.original_max_position_embeddings = max_pos;
      r.factor = opt_positive(params, "factor", 1.0, ctx);
    }
    const int64_t half = static_cast<int64_t>(double(head_dim) * r.partial_rotary_factor) / 2;
    r.short_factor = factor_list(params, "short_factor", half, ctx);
    r.long_factor = factor_list(params, "long_factor", half, ctx);
    if (params.contains("attention_factor") && !params["attention_factor"].is_null())
      r.attention_factor = opt_positive(params, "attention_factor", 1.0, ctx);
  } else if (type == "dynamic") {
    // _compute_dynamic_ntk_parameters: factor is required; the base is recomputed for sequences
    // longer than max_position_embeddings.
    r.type = RopeType::kDynamic;
    r.factor = req_positive(params, "factor", ctx, type);
    r.max_position_embeddings = max_pos;
  } else {
    LONGCTX_THROW(ErrorCode::kUnsupported, "{}: unsupported rope type '{}' (supported: {})", ctx,
                  type, kSupportedRopeTypes);
  }
  LONGCTX_CHECK(r.factor > 0 && std::isfinite(r.factor), ErrorCode::kInvalidArgument,
                "{}: rope factor must be a positive finite number, got {}", ctx, r.factor);
  return r;
}

// The window of sliding layers as the architecture's transformers config resolves it: Mistral
// slides whenever `sliding_window` is set; Qwen2/Qwen3 only with `use_sliding_window`; other
// files (Gemma 3's `sliding_window_pattern`, explicit `layer_types`) whenever it is set. 0: none.
int64_t effective_window(const json& j, const std::string& arch, const std::string& src) {
  if (arch == "LlamaForCausalLM") return 0;  // LlamaConfig has no sliding window
  // Qwen's configs drop sliding_window without use_sliding_window (transformers 5 writes
  // Qwen2-MoE's as 0 there), so its value is not checked then.
  if (qwen_window_rule(arch) && !opt_bool(j, "use_sliding_window", false, src)) return 0;
  const int64_t w = opt_int(j, "sliding_window", 0, src);
  if (j.contains("sliding_window") && !j["sliding_window"].is_null())
    check_range(w, "sliding_window", kMaxPositions, src);
  return w;
}

LayerAttention parse_layer_type(const json& v, int64_t i, const std::string& src) {
  LONGCTX_CHECK(v.is_string(), ErrorCode::kInvalidArgument,
                "{}: layer_types[{}] must be a string, got {}", src, i, json_excerpt(v));
  const std::string t = v.get<std::string>();
  if (t == "full_attention") return LayerAttention::kFull;
  if (t == "sliding_attention") return LayerAttention::kSliding;
  if (t == "linear_attention") return LayerAttention::kLinear;
  LONGCTX_THROW(ErrorCode::kUnsupported,
                "{}: layer_types[{}] is '{}' (supported: full_attention, sliding_attention, "
                "linear_attention)",
                src, i, t);
}

// Qwen3NextConfig's Gated DeltaNet sizes (its defaults: Qwen3-Next-80B-A3B's, which Qwen3.5's
// text configs share). The value heads share key heads in groups, as transformers'
// repeat_interleave requires (Qwen3.5 too: value head h reads key head h / (Hv / Hk)).
LinearAttentionConfig parse_linear_attention(const json& j, const std::string& arch,
                                             const std::string& src) {
  LinearAttentionConfig l;
  l.projections = is_qwen3_5(arch) ? LinearProjLayout::kSplit : LinearProjLayout::kGroupedByKeyHead;
  l.num_key_heads = opt_int(j, "linear_num_key_heads", 16, src);
  check_range(l.num_key_heads, "linear_num_key_heads", kMaxHeads, src);
  l.num_value_heads = opt_int(j, "linear_num_value_heads", 32, src);
  check_range(l.num_value_heads, "linear_num_value_heads", kMaxHeads, src);
  l.key_head_dim = opt_int(j, "linear_key_head_dim", 128, src);
  check_range(l.key_head_dim, "linear_key_head_dim", kMaxHeadDim, src);
  l.value_head_dim = opt_int(j, "linear_value_head_dim", 128, src);
  check_range(l.value_head_dim, "linear_value_head_dim", kMaxHeadDim, src);
  l.conv_kernel_dim = opt_int(j, "linear_conv_kernel_dim", 4, src);
  check_range(l.conv_kernel_dim, "linear_conv_kernel_dim", kMaxConvKernel, src);
  LONGCTX_CHECK(l.num_value_heads % l.num_key_heads == 0, ErrorCode::kInvalidArgument,
                "{}: linear_num_value_heads ({}) must be a multiple of linear_num_key_heads ({})",
                src, l.num_value_heads, l.num_key_heads);
  return l;
}

// Fills c.layer_types, c.sliding_window and c.linear. Explicit `layer_types` win (transformers
// writes them into every recent config.json); otherwise the architecture's rule: Mistral slides
// on every layer, Qwen2/Qwen3 on layers >= max_window_layers, `sliding_window_pattern` N makes
// every Nth layer full (Gemma 3: layer i slides iff (i + 1) % N != 0); Qwen3-Next's
// full_attention_interval N makes every Nth layer full and the others linear attention.
void parse_layer_types(const json& j, const std::string& src, ModelConfig& c) {
  const std::string& a = c.architecture;
  const int64_t n = c.num_hidden_layers;
  const int64_t window = effective_window(j, a, src);
  c.layer_types.assign(n, LayerAttention::kFull);
  if (j.contains("layer_types") && !j["layer_types"].is_null()) {
    const json& lt = j["layer_types"];
    LONGCTX_CHECK(lt.is_array() && static_cast<int64_t>(lt.size()) == n,
                  ErrorCode::kInvalidArgument,
                  "{}: 'layer_types' must be a list of num_hidden_layers ({}) strings, got {}", src,
                  n, json_excerpt(lt));
    for (int64_t i = 0; i < n; ++i) c.layer_types[i] = parse_layer_type(lt[i], i, src);
  } else if (has_gated_deltanet(a)) {
    // Qwen3NextConfig's (and Qwen3_5TextConfig's) rule: full attention every
    // full_attention_interval-th layer, linear attention between.
    const int64_t interval = opt_int(j, "full_attention_interval", 4, src);
    check_range(interval, "full_attention_interval", kMaxLayers, src);
    for (int64_t i = 0; i < n; ++i)
      if ((i + 1) % interval != 0) c.layer_types[i] = LayerAttention::kLinear;
  } else if (window > 0 && j.contains("sliding_window_pattern") &&
             !j["sliding_window_pattern"].is_null()) {
    const int64_t pattern = opt_int(j, "sliding_window_pattern", 1, src);
    check_range(pattern, "sliding_window_pattern", kMaxLayers, src);
    for (int64_t i = 0; i < n; ++i)
      if ((i + 1) % pattern != 0) c.layer_types[i] = LayerAttention::kSliding;
  } else if (window > 0 && qwen_window_rule(a)) {
    const int64_t first = opt_int(j, "max_window_layers", 28, src);
    for (int64_t i = std::max<int64_t>(first, 0); i < n; ++i)
      c.layer_types[i] = LayerAttention::kSliding;
  } else if (window > 0) {
    c.layer_types.assign(n, LayerAttention::kSliding);
  }
  bool sliding = false, linear = false;
  for (int64_t i = 0; i < n; ++i) {
    sliding |= c.layer_types[i] == LayerAttention::kSliding;
    linear |= c.layer_types[i] == LayerAttention::kLinear;
  }
  LONGCTX_CHECK(!sliding || window > 0, ErrorCode::kInvalidArgument,
                "{}: layer_types has sliding_attention layers but no sliding window is set "
                "(sliding_window {}{})",
                src, json_excerpt(j.value("sliding_window", json())),
                j.contains("use_sliding_window") ? ", use_sliding_window false" : "");
  c.sliding_window = sliding ? window : 0;
  // A window no sequence can outgrow (Phi-4-mini's 262144 over 131072 positions) masks nothing:
  // those layers are full attention, so they keep every block and run where windows do not.
  if (sliding && window >= c.max_positions()) {
    std::replace(c.layer_types.begin(), c.layer_types.end(), LayerAttention::kSliding,
                 LayerAttention::kFull);
    c.sliding_window = 0;
  }
  // Only Qwen3-Next and Qwen3.5 run linear-attention layers: another architecture's are refused
  // here, with the field, rather than run as full attention.
  LONGCTX_CHECK(!linear || has_gated_deltanet(a), ErrorCode::kUnsupported,
                "{}: layer_types has linear_attention layers, which {} does not have (supported "
                "layer types for it: full_attention, sliding_attention)",
                src, a);
  if (linear) c.linear = parse_linear_attention(j, a, src);
}

// Released MoE models have up to 512 routed experts (Qwen3-Next); DeepSeek-V3 256, Kimi K2 384.
constexpr int64_t kMaxExperts = 1024;

// Qwen2MoeConfig / Qwen3MoeConfig's expert fields; their defaults are those classes' (a
// config.json written by transformers carries every field anyway).
MoeConfig parse_moe(const json& j, const std::string& src, const ModelConfig& c) {
  MoeConfig m;
  // Qwen3-Next's block is Qwen2-MoE's (a shared expert with its sigmoid gate); its defaults are
  // Qwen3-Next-80B-A3B's. Qwen3.5-MoE's is Qwen3-Next's, its defaults Qwen3.5-35B-A3B's; its
  // config has no norm_topk_prob, decoder_sparse_step or mlp_only_layers (transformers deletes
  // them: the router always renormalizes, every layer is sparse).
  const bool qwen3_5 = is_qwen3_5_moe(c.architecture);
  const bool next = c.architecture == "Qwen3NextForCausalLM";
  const bool qwen2 = c.architecture == "Qwen2MoeForCausalLM";
  // Newer transformers store Qwen3MoeConfig.num_experts as Mixtral's num_local_experts
  // (attribute_map), so a config.json may carry either name.
  const char* experts_key = j.contains("num_experts") || !j.contains("num_local_experts")
                                ? "num_experts"
                                : "num_local_experts";
  m.num_experts = opt_int(j, experts_key, qwen3_5 ? 256 : next ? 512 : qwen2 ? 60 : 128, src);
  LONGCTX_CHECK(m.num_experts >= 0 && m.num_experts <= kMaxExperts, ErrorCode::kInvalidArgument,
                "{}: field '{}' must be in [0, {}], got {}", src, experts_key, kMaxExperts,
                m.num_experts);
  if (m.num_experts == 0) return m;  // every layer dense (transformers' rule too)
  m.num_experts_per_tok = opt_int(j, "num_experts_per_tok",
                                  qwen3_5 ? 8
                                  : next  ? 10
                                  : qwen2 ? 4
                                          : 8,
                                  src);
  LONGCTX_CHECK(m.num_experts_per_tok >= 1 && m.num_experts_per_tok <= m.num_experts,
                ErrorCode::kInvalidArgument,
                "{}: field 'num_experts_per_tok' must be in [1, num_experts {}], got {}", src,
                m.num_experts, m.num_experts_per_tok);
  m.moe_intermediate_size = opt_int(j, "moe_intermediate_size",
                                    next || qwen3_5 ? 512
                                    : qwen2         ? 1408
                                                    : 768,
                                    src);
  check_range(m.moe_intermediate_size, "moe_intermediate_size", kMaxIntermediate, src);
  m.norm_topk_prob = qwen3_5 || opt_bool(j, "norm_topk_prob", next, src);
  if (qwen2 || next || qwen3_5) {
    m.shared_expert_intermediate_size =
        opt_int(j, "shared_expert_intermediate_size", next || qwen3_5 ? 512 : 5632, src);
    LONGCTX_CHECK(m.shared_expert_intermediate_size >= 0 &&
                      m.shared_expert_intermediate_size <= kMaxIntermediate,
                  ErrorCode::kInvalidArgument,
                  "{}: field 'shared_expert_intermediate_size' must be in [0, {}], got {}", src,
                  kMaxIntermediate, m.shared_expert_intermediate_size);
  }
  if (qwen3_5) return m;
  m.decoder_sparse_step = opt_int(j, "decoder_sparse_step", 1, src);
  check_range(m.decoder_sparse_step, "decoder_sparse_step", kMaxLayers, src);
  if (j.contains("mlp_only_layers") && !j["mlp_only_layers"].is_null()) {
    const json& v = j["mlp_only_layers"];
    LONGCTX_CHECK(v.is_array(), ErrorCode::kInvalidArgument,
                  "{}: field 'mlp_only_layers' must be a list of layer indices, got {}", src,
                  json_excerpt(v));
    for (const json& e : v) {
      const int64_t i = int_field(e, "mlp_only_layers", src);
      // transformers tests `layer_idx not in mlp_only_layers`: an index past the last layer
      // changes nothing there, but is surely a mistake in a file.
      LONGCTX_CHECK(i >= 0 && i < c.num_hidden_layers, ErrorCode::kInvalidArgument,
                    "{}: mlp_only_layers holds {}, not a layer of [0, {})", src, i,
                    c.num_hidden_layers);
      m.mlp_only_layers.push_back(i);
    }
  }
  return m;
}

// Gemma 3's two ropes: full layers `rope` (rope_theta and rope_scaling: linear 8 on 4B-27B),
// sliding layers `local_rope` (rope_local_base_freq, unscaled). transformers 5 writes them as
// rope_parameters keyed by layer type.
void parse_gemma3_ropes(const json& j, const std::string& src, ModelConfig& c) {
  const int64_t d = c.head_dim, mp = c.max_position_embeddings;
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object() &&
      (j["rope_parameters"].contains("full_attention") ||
       j["rope_parameters"].contains("sliding_attention"))) {
    const json& rp = j["rope_parameters"];
    auto one = [&](const char* type, double theta) {
      json sub = json{{"rope_parameters", rp.value(type, json::object())}};
      if (!sub["rope_parameters"].contains("rope_theta"))
        sub["rope_parameters"]["rope_theta"] = theta;
      return parse_rope(sub, src + " rope_parameters." + type, d, mp);
    };
    c.rope = one("full_attention", 1000000.0);
    c.local_rope = one("sliding_attention", 10000.0);
  } else {
    c.rope = parse_rope(j, src, d, mp);
    c.local_rope.theta = opt_positive(j, "rope_local_base_freq", 10000.0, src);
  }
  c.has_local_rope = true;
}

HiddenAct parse_hidden_act(const json& j, const char* key, const char* dflt,
                           const std::string& src) {
  std::string act = dflt;
  if (j.contains(key) && !j[key].is_null()) {
    LONGCTX_CHECK(j[key].is_string(), ErrorCode::kInvalidArgument,
                  "{}: field '{}' must be a string, got {}", src, key, json_excerpt(j[key]));
    act = j[key].get<std::string>();
  }
  if (act == "silu" || act == "swish") return HiddenAct::kSilu;
  if (act == "gelu_pytorch_tanh" || act == "gelu_tanh") return HiddenAct::kGeluTanh;
  LONGCTX_THROW(ErrorCode::kUnsupported,
                "{}: field '{}' is '{}' (supported: silu, gelu_pytorch_tanh)", src, key, act);
}

}  // namespace

bool ModelConfig::is_moe_layer(int64_t i) const {
  if (moe.num_experts == 0) return false;
  for (int64_t d : moe.mlp_only_layers)
    if (d == i) return false;
  return (i + 1) % moe.decoder_sparse_step == 0;
}

std::vector<int64_t> parse_token_id_list(const json& v, const std::string& where) {
  std::vector<int64_t> ids;
  if (v.is_null()) return ids;
  if (v.is_number_integer()) return {v.get<int64_t>()};
  LONGCTX_CHECK(v.is_array(), ErrorCode::kInvalidArgument,
                "{}: must be an integer or a list of integers, got {}", where, json_excerpt(v));
  for (const auto& e : v) {
    LONGCTX_CHECK(e.is_number_integer(), ErrorCode::kInvalidArgument,
                  "{}: must hold integers, got {}", where, json_excerpt(e));
    ids.push_back(e.get<int64_t>());
  }
  return ids;
}

std::vector<std::string> supported_architectures() {
  return {std::begin(kSupported), std::end(kSupported)};
}

int64_t ModelConfig::kv_bytes_per_token(DType kv_dtype) const {
  return 2 * num_hidden_layers * num_key_value_heads * head_dim *
         static_cast<int64_t>(dtype_size(kv_dtype));
}

const char* rope_type_name(RopeType type) {
  switch (type) {
    case RopeType::kDefault:
      return "default";
    case RopeType::kLinear:
      return "linear";
    case RopeType::kLlama3:
      return "llama3";
    case RopeType::kYarn:
      return "yarn";
    case RopeType::kLongrope:
      return "longrope";
    case RopeType::kDynamic:
      return "dynamic";
  }
  return "?";
}

int64_t ModelConfig::max_positions() const {
  double n = double(max_position_embeddings);
  if (rope.type == RopeType::kYarn)
    n = std::max(n, rope.factor * double(rope.original_max_position_embeddings));
  else if (rope.type == RopeType::kDynamic)
    n = std::max(n, rope.factor * double(max_position_embeddings));
  return static_cast<int64_t>(std::min(n, double(kMaxPositions)));
}

// Every field read below is type-checked; parse_model_config still turns any nlohmann type error
// that slips through into an Error (found by fuzz_config: a numeric model_type).
// Whether quantization_config names an FP8 KV cache. Other KV schemes (NVFP4, int8) are not
// FP8: auto keeps bf16 for them, which is never less accurate.
static bool kv_cache_fp8(const json& j) {
  if (!j.contains("quantization_config") || !j["quantization_config"].is_object()) return false;
  const json& q = j["quantization_config"];
  if (q.contains("kv_cache_quant_algo") && q["kv_cache_quant_algo"].is_string()) {
    std::string algo = q["kv_cache_quant_algo"].get<std::string>();
    for (char& ch : algo) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    if (algo == "FP8") return true;
  }
  if (q.contains("kv_cache_scheme") && q["kv_cache_scheme"].is_object()) {
    const json& s = q["kv_cache_scheme"];
    return s.value("num_bits", json(0)) == json(8) && s.value("type", json("")) == json("float");
  }
  return false;
}

static ModelConfig parse_model_config_unguarded(const json& file, const std::string& src) {
  LONGCTX_CHECK(file.is_object(), ErrorCode::kInvalidArgument, "{}: config must be a JSON object",
                src);
  ModelConfig c;
  LONGCTX_CHECK(file.contains("architectures") && file["architectures"].is_array() &&
                    !file["architectures"].empty() && file["architectures"][0].is_string(),
                ErrorCode::kInvalidArgument, "{}: missing 'architectures' (a list of names)", src);
  c.architecture = file["architectures"][0].get<std::string>();
  bool known = false;
  for (const char* a : kSupported) known |= c.architecture == a;
  LONGCTX_CHECK(known, ErrorCode::kUnsupported, "{}: unsupported architecture '{}' (supported: {})",
                src, c.architecture, supported_list());
  const bool gemma3 = is_gemma3(c.architecture);
  const bool qwen3_5 = is_qwen3_5(c.architecture);
  const json j = gemma3    ? gemma3_text_config(file, c.architecture, src)
                 : qwen3_5 ? qwen3_5_text_config(file, c.architecture, src)
                           : file;
  if (j.contains("model_type") && !j["model_type"].is_null()) {
    LONGCTX_CHECK(j["model_type"].is_string(), ErrorCode::kInvalidArgument,
                  "{}: field 'model_type' must be a string, got {}", src,
                  json_excerpt(j["model_type"]));
    c.model_type = j["model_type"].get<std::string>();
  }

  c.vocab_size = req_int(j, "vocab_size", src, kMaxVocab);
  c.hidden_size = req_int(j, "hidden_size", src, kMaxHidden);
  c.intermediate_size = req_int(j, "intermediate_size", src, kMaxIntermediate);
  c.num_hidden_layers = req_int(j, "num_hidden_layers", src, kMaxLayers);
  c.num_attention_heads = req_int(j, "num_attention_heads", src, kMaxHeads);
  c.num_key_value_heads = opt_int(j, "num_key_value_heads", c.num_attention_heads, src);
  LONGCTX_CHECK(c.num_key_value_heads > 0 && c.num_attention_heads % c.num_key_value_heads == 0,
                ErrorCode::kInvalidArgument,
                "{}: num_attention_heads ({}) must be a multiple of num_key_value_heads ({})", src,
                c.num_attention_heads, c.num_key_value_heads);
  // transformers derives head_dim when it is absent or null; an explicit 0 or negative one is
  // a broken file, not a request for the default.
  c.head_dim = opt_int(j, "head_dim", 0, src);
  if (j.contains("head_dim") && !j["head_dim"].is_null())
    check_range(c.head_dim, "head_dim", kMaxHeadDim, src);
  if (c.head_dim == 0) {
    LONGCTX_CHECK(c.hidden_size % c.num_attention_heads == 0, ErrorCode::kInvalidArgument,
                  "{}: hidden_size {} is not a multiple of num_attention_heads {} and no head_dim "
                  "is given",
                  src, c.hidden_size, c.num_attention_heads);
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  LONGCTX_CHECK(c.head_dim % 2 == 0, ErrorCode::kInvalidArgument,
                "{}: head_dim {} must be even for RoPE", src, c.head_dim);
  check_range(c.head_dim, "head_dim", kMaxHeadDim, src);
  c.max_position_embeddings = opt_int(j, "max_position_embeddings", 4096, src);
  check_range(c.max_position_embeddings, "max_position_embeddings", kMaxPositions, src);
  c.rms_norm_eps = opt_num(j, "rms_norm_eps", 1e-6, src);
  LONGCTX_CHECK(c.rms_norm_eps > 0 && std::isfinite(c.rms_norm_eps), ErrorCode::kInvalidArgument,
                "{}: field 'rms_norm_eps' must be a positive finite number, got {}", src,
                c.rms_norm_eps);
  if (gemma3)
    parse_gemma3_ropes(j, src, c);
  else
    c.rope = parse_rope(j, src, c.head_dim, c.max_position_embeddings);
  c.tie_word_embeddings = opt_bool(j, "tie_word_embeddings", false, src);
  c.kv_cache_fp8 = kv_cache_fp8(j);

  const std::string& a = c.architecture;
  if (a == "Qwen2ForCausalLM") {
    c.attention_bias = true;  // q/k/v carry a bias, o_proj does not
    c.o_proj_bias = false;
  } else if (a == "Qwen2MoeForCausalLM") {
    c.attention_bias = opt_bool(j, "qkv_bias", true, src);  // transformers 5's name; always before
    c.o_proj_bias = false;
  } else {
    c.attention_bias = opt_bool(j, "attention_bias", false, src);
    c.o_proj_bias = c.attention_bias;
  }
  if (a == "LlamaForCausalLM" || a == "MistralForCausalLM")
    c.mlp_bias = opt_bool(j, "mlp_bias", false, src);
  const bool next = has_gated_deltanet(a);  // Qwen3-Next, Qwen3.5
  c.qk_norm = a == "Qwen3ForCausalLM" || a == "Qwen3MoeForCausalLM" || gemma3 || next;
  // Qwen3-Next and Qwen3.5: zero-centred (1 + w) RMSNorms (Qwen3NextRMSNorm; its gated norm is
  // not) and attention outputs gated by sigmoid(a second half of q_proj) (Qwen3NextAttention,
  // which Qwen3_5Attention is; Qwen3.5's configs also write "attn_output_gate": true).
  c.norm_plus_one = next;
  c.attn_output_gate = next;
  // The multi-token-prediction head (mtp.*) and Qwen3.5's vision tower (model.visual.*, also in
  // the text-only classes' _keys_to_ignore_on_load_unexpected): speculative decoding and images
  // are not run.
  if (next) c.unused_weight_prefixes = {"mtp."};
  if (qwen3_5) c.unused_weight_prefixes.push_back("model.visual.");
  // Gemma3ForConditionalGeneration's vision tower and projector.
  if (a == "Gemma3ForConditionalGeneration")
    c.unused_weight_prefixes = {"vision_tower.", "multi_modal_projector.", "model.vision_tower.",
                                "model.multi_modal_projector."};
  c.hidden_act = gemma3 ? parse_hidden_act(j, "hidden_activation", "gelu_pytorch_tanh", src)
                        : parse_hidden_act(j, "hidden_act", "silu", src);
  if (gemma3) {
    c.norm_plus_one = c.sandwich_norms = true;
    c.embed_scale = std::sqrt(double(c.hidden_size));
    c.query_pre_attn_scalar = opt_positive(j, "query_pre_attn_scalar", 256.0, src);
    LONGCTX_CHECK(!opt_bool(j, "use_bidirectional_attention", false, src), ErrorCode::kUnsupported,
                  "{}: field 'use_bidirectional_attention' is true (an embedding model's "
                  "encoder; only causal Gemma 3 runs)",
                  src);
    // Gemma 2's soft caps: Gemma 3's configs set them null; refuse rather than run without.
    for (const char* key : {"attn_logit_softcapping", "final_logit_softcapping"})
      LONGCTX_CHECK(!j.contains(key) || j[key].is_null(), ErrorCode::kUnsupported,
                    "{}: field '{}' is {} (logit soft-capping is not supported; Gemma 3 "
                    "checkpoints set it null)",
                    src, key, json_excerpt(j[key]));
  }
  // (Qwen3.5's dense models: every MLP dense, whatever MoE fields a file might carry.)
  if (a == "Qwen2MoeForCausalLM" || a == "Qwen3MoeForCausalLM" || a == "Qwen3NextForCausalLM" ||
      is_qwen3_5_moe(a))
    c.moe = parse_moe(j, src, c);

  parse_layer_types(j, src, c);

  std::string dt;
  if (j.contains("dtype") && j["dtype"].is_string())
    dt = j["dtype"].get<std::string>();
  else if (j.contains("torch_dtype") && j["torch_dtype"].is_string())
    dt = j["torch_dtype"].get<std::string>();
  c.dtype = dt.empty() ? DType::kF32 : parse_dtype(dt);
  LONGCTX_CHECK(c.dtype == DType::kF32 || c.dtype == DType::kBF16 || c.dtype == DType::kF16,
                ErrorCode::kUnsupported, "{}: model dtype '{}' is not f32/bf16/f16", src, dt);

  c.bos_token_id = j.contains("bos_token_id") && j["bos_token_id"].is_number_integer()
                       ? opt_int(j, "bos_token_id", -1, src)
                       : -1;
  if (j.contains("eos_token_id"))
    c.eos_token_ids = parse_token_id_list(j["eos_token_id"], src + " eos_token_id");
  return c;
}

ModelConfig parse_model_config(const json& j, const std::string& src) {
  try {
    ModelConfig c = parse_model_config_unguarded(j, src);
    c.quantization = parse_quant_config(j, src);
    return c;
  } catch (const nlohmann::json::exception& e) {  // a type the checks above did not anticipate
    LONGCTX_THROW(ErrorCode::kInvalidArgument, "{}: unexpected JSON content: {}", src, e.what());
  }
}

ModelConfig load_model_config(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  LONGCTX_CHECK(f, ErrorCode::kNotFound, "{}: cannot open config file", path);
  std::stringstream ss;
  ss << f.rdbuf();
  return parse_model_config(parse_json(ss.str(), path), path);
}

}  // namespace longctx
